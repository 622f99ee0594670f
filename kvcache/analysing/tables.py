"""One table model and its plain renderers, used by the terminal summary, ``kvcache compare`` and the
report's Markdown: a :class:`Table` is data (cells are already formatted text); :func:`text` and
:func:`markdown` lay it out; :func:`num` and :func:`unique_labels` make the cells. Standard library only (and
:mod:`kvcache.analysing.stats` for what counts as a number)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcache.analysing.stats import finite

MISSING = "-"


def num(value: Any, spec: str = ".2f", missing: str = MISSING) -> str:
    """A number as table text; ``missing`` for None, NaN, infinities or anything that is not a number."""
    x = finite(value)
    return missing if x is None else format(x, spec)


def unique_labels(labels: Sequence[str], paths: Sequence[str]) -> list[str]:
    """Column or run labels made unique: a label that repeats gets its file's name, ``label (run.json)``."""
    return [f"{label} ({Path(path).name})" if labels.count(label) > 1 else label for label, path in zip(labels, paths)]


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
    above their columns and `` | `` between groups."""
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


def escape_markdown(cell: str) -> str:
    """Text safe inside a Markdown table row: ``|`` escaped."""
    return cell.replace("|", "\\|")


def markdown(table: Table) -> list[str]:
    """A GitHub-flavoured Markdown table (``|`` in cells escaped); with groups, each header cell names its
    group in bold."""
    header = list(table.header)
    if table.groups:
        col = 0
        for label, count in table.groups:
            for i in range(col, col + count):
                header[i] = f"**{label}**<br>{header[i]}" if label else header[i]
            col += count
    align = ["---:" if i in table.right else ":---" for i in range(len(header))]

    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(escape_markdown(str(c)) for c in cells) + " |"

    return [row(header), "| " + " | ".join(align) + " |", *(row(r) for r in table.rows)]
