"""One table model and its plain renderers, used by the terminal summary, ``kvcache compare``, ``kvcache comment``
and the report's Markdown: a :class:`Table` is data (cells are already formatted text); :func:`text` and
:func:`markdown` lay it out; :func:`num`, :func:`figure`, :func:`interval`, :func:`by_op` and :func:`unique_labels`
make the cells, :data:`MISSING` marks a cell without a figure, and :class:`Notes` numbers the reasons cells refer to.
Standard library only (and :mod:`kvcache.analysing.estimates` for what counts as a number)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcache.analysing.estimates import finite

#: The one mark of a figure that is not there (a table cell, or a figure in a sentence): text, Markdown and HTML.
MISSING = "—"


def num(value: Any, spec: str = ".2f", missing: str = MISSING) -> str:
    """A number as table text; ``missing`` for None, NaN, infinities or anything that is not a number."""
    x = finite(value)
    return missing if x is None else format(x, spec)


def interval_text(bounds: Sequence[Any] | None, spec: str = ".2f") -> str:
    """``[low, high]``, each bound in ``spec``; ``""`` unless there are two bounds, both finite numbers."""
    if bounds is None or len(bounds) != 2 or finite(bounds[0]) is None or finite(bounds[1]) is None:
        return ""
    return f"[{num(bounds[0], spec)}, {num(bounds[1], spec)}]"


def figure(value: Any, bounds: Sequence[Any] | None = None, spec: str = ".2f") -> str:
    """A figure with its interval, ``3.00 [2.85, 3.15]``; the figure alone when the interval lacks a bound;
    :data:`MISSING` when there is no figure."""
    if finite(value) is None:
        return MISSING
    around = interval_text(bounds, spec)
    return f"{num(value, spec)} {around}" if around else num(value, spec)


def by_op(figures: Mapping[str, Any], spec: str = ".2f") -> str:
    """Figures per op (or per kernel) in their given order, ``cat 2.00, scaled_dot_product_attention 1.00`` (each
    in ``spec``); :data:`MISSING` when there are none."""
    return ", ".join(f"{op} {num(value, spec)}" for op, value in figures.items()) or MISSING


def unique_labels(labels: Sequence[str], paths: Sequence[str]) -> list[str]:
    """Column or run labels made unique: a label that repeats gets its file's name, ``label (run.json)``."""
    return [f"{label} ({Path(path).name})" if labels.count(label) > 1 else label for label, path in zip(labels, paths)]


class Notes:
    """Distinct texts (a verdict's reason), numbered in the order they are first referenced: a cell says
    ``status [n]`` and the text is said once, as note n, under its table, however many cells share it."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def ref(self, text: str) -> int:
        """The number of ``text`` (1 for the first text referenced), giving it the next number when it is new."""
        if text not in self.texts:
            self.texts.append(text)
        return self.texts.index(text) + 1

    def cell(self, status: str, reason: str = "") -> str:
        """``status [n]``: a status and the number of its reason; the status alone when there is no reason."""
        return f"{status} [{self.ref(reason)}]" if reason else status

    def lines(self) -> list[str]:
        """``[n] text`` per note, in number order (plain text)."""
        return [f"[{i}] {text}" for i, text in enumerate(self.texts, 1)]


@dataclass
class Table:
    """Rows of text under a header. ``groups``: optional ``(label, number of columns)`` spans over the
    header (a label per run in ``kvcache compare``); ``right``: columns aligned right in Markdown."""

    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    groups: list[tuple[str, int]] | None = None
    right: Sequence[int] = ()

    def widths(self) -> list[int]:
        return [max(len(str(r[i])) for r in [self.header, *self.rows]) for i in range(len(self.header))]


def text(table: Table) -> list[str]:
    """Aligned plain text: columns two spaces apart, a rule under the header; with groups, the group labels
    above their columns and `` | `` between groups. Every cell and label is shown by :func:`terminal_text`."""
    table = Table([terminal_text(h) for h in table.header], [[terminal_text(c) for c in r] for r in table.rows],
                  [(terminal_text(label), count) for label, count in table.groups] if table.groups else table.groups,
                  table.right)
    widths = table.widths()
    if not table.groups:
        def line(cells: Sequence[str]) -> str:
            return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()

        return [line(table.header), "  ".join("-" * w for w in widths), *(line(r) for r in table.rows)]
    spans, col = [], 0
    for label, count in table.groups:  # widen a group's last column when its label is longer than the group
        span = sum(widths[col:col + count]) + 2 * (count - 1)
        if len(label) > span:
            widths[col + count - 1] += len(label) - span
            span = len(label)
        spans.append(span)
        col += count

    def grouped(cells: Sequence[str]) -> str:
        out, col = [], 0
        for _, count in table.groups or []:
            out.append("  ".join(str(c).ljust(w) for c, w in zip(cells[col:col + count], widths[col:])))
            col += count
        return " | ".join(out).rstrip()

    labels = " | ".join(label.ljust(span) for (label, _), span in zip(table.groups, spans)).rstrip()
    return [labels, grouped(table.header), "-+-".join("-" * span for span in spans),
            *(grouped(r) for r in table.rows)]


# Characters with a meaning in GitHub-flavoured Markdown inline text or tables: backslash-escaped. ``<``, ``>``
# and ``&`` (raw HTML, autolinks, entities) become entities instead, so no raw ``<`` of the text survives.
_MD_BACKSLASHED = frozenset("\\`*_[]|~#$")
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_NO_MENTION = "@&#8203;"  # @ then a zero-width space: renders as @, mentions nobody


#: Bidirectional formatting characters (the override U+202E among them: it shows a class name ``abc`` written
#: backwards, or a reason's end before its start): shown as their code, never obeyed.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def shown_code(ch: str) -> str | None:
    """A control character (NUL, ESC, DEL, C1; not tab or a line break: the renderers handle those) or a
    bidirectional formatting character as its code, ``\\x00``, ``\\u202e``: visible and inert in Markdown, HTML and
    a terminal; None for any other character. Both escapes (:func:`escape_markdown`,
    :func:`kvcache.analysing.report.documents.html_text`) show them so."""
    code = ord(ch)
    if ch in _BIDI or (code < 0x20 and ch not in "\t\n\r") or 0x7f <= code <= 0x9f:
        return f"\\x{code:02x}" if code <= 0xff else f"\\u{code:04x}"
    return None


def visible(text: object) -> str:
    """``text`` with every character :func:`shown_code` names shown as its code (no other escaping)."""
    return "".join(shown_code(ch) or ch for ch in str(text))


#: The whitespace controls :func:`shown_code` leaves to the renderers, as a terminal line shows them (as ``repr``).
_LINE_CONTROLS = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def terminal_text(text: object) -> str:
    """``text`` as one line of a terminal: every control character shown as its code, as ``repr`` shows it (ESC as
    ``\\x1b``, a carriage return as ``\\r``, a line break as ``\\n``, a tab as ``\\t``), and so is a bidirectional
    formatting character (``\\u202e``), so that no string from a run (a class, model or op name, a reason, an error
    read from a file) can move the cursor, recolour, clear or overwrite the terminal, or start a line that looks like
    the gate's own. The one escape for everything a ``kvcache`` command or the suite's summary prints."""
    return "".join(_LINE_CONTROLS.get(ch) or shown_code(ch) or ch for ch in str(text))


def chart_text(text: object) -> str:
    """``text`` with its line breaks kept and each line shown by :func:`terminal_text` (a chart's labels: a label's
    own second line stays one, a carriage return or ESC in a name is drawn as its code)."""
    return "\n".join(map(terminal_text, str(text).split("\n")))


#: A list mark at the start of a line, a space after it: ``- x``, ``+ x``, ``12. x``, ``3) x`` (group 2 the mark).
_LEADING_BLOCK_MARK = re.compile(r"^(\s*|\s*\d+)([-+]|(?<=\d)[.)])(?=\s)")


def escape_markdown(text: object) -> str:
    """``text`` as literal GitHub-flavoured Markdown, safe in a heading, a paragraph, emphasis or a table cell: it
    renders as the text itself, never as HTML, a link, an image, emphasis, code, math or a new table column. The
    one escape for everything that reaches Markdown from a run (cache and op names, model, device, reasons, labels).

    - ``&``, ``<``, ``>`` become ``&amp;``, ``&lt;``, ``&gt;``.
    - ``@`` is followed by a zero-width space (``@&#8203;``, as Renovate and Dependabot write it), so that a class
      or op named ``@someone`` does not mention (notify) a GitHub user or team in a comment or job summary.
    - ``\\ ` * _ [ ] | ~ # $`` are backslash-escaped, so the text stays literal whatever is written next to it
      (``[2.85, 3.15]`` is written ``\\[2.85, 3.15\\]`` and renders as itself); ``_`` between two letters or digits
      is left alone (GitHub never reads it as emphasis, so ``index_copy`` stays readable).
    - Line breaks become spaces, and a leading list or ordered-list mark (``-``, ``+``, ``1.``, ``1)``) is
      backslash-escaped: where the text starts a line (a paragraph), it never starts a block of its own (``#`` and
      ``>`` are escaped already). A bare URL may still be auto-linked by GitHub: it shows as itself.
    - Control characters (NUL, ESC, ...) and bidirectional formatting characters (U+202E, the right-to-left
      override, ...) are shown as their code, ``\\x00``, ``\\u202e`` (:func:`shown_code`), never passed on raw."""
    chars = " ".join(str(text).splitlines())
    out = []
    for i, ch in enumerate(chars):
        after = chars[i + 1:i + 2]
        code = shown_code(ch)
        if code is not None:
            out.append("\\" + code)  # the code's backslash escaped: it renders as itself
        elif ch in _MD_ENTITIES:
            out.append(_MD_ENTITIES[ch])
        elif ch == "@":
            out.append(_NO_MENTION)
        elif ch == "_" and i > 0 and chars[i - 1].isalnum() and after.isalnum():
            out.append(ch)
        elif ch in _MD_BACKSLASHED:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return _LEADING_BLOCK_MARK.sub(r"\1\\\2", "".join(out), count=1)


def markdown(table: Table) -> list[str]:
    """A GitHub-flavoured Markdown table, every cell and group label escaped (:func:`escape_markdown`); with
    groups, each header cell names its group in bold."""
    header = [escape_markdown(h) for h in table.header]
    if table.groups:
        col = 0
        for label, count in table.groups:
            for i in range(col, col + count):
                header[i] = f"**{escape_markdown(label)}**<br>{header[i]}" if label else header[i]
            col += count
    align = ["---:" if i in table.right else ":---" for i in range(len(header))]

    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    return [row(header), "| " + " | ".join(align) + " |", *(row([escape_markdown(c) for c in r]) for r in table.rows)]
