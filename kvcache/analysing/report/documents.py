"""The report as a document: a title and typed blocks (headings, paragraphs, notes, facts, tables, the numbered
footnotes a table's cells refer to) and their two renderers, Markdown (tables through
:mod:`kvcache.analysing.tables`) and HTML (the body of report.html, under the page's one title).

Blocks hold plain text, much of it from the run (cache, op, model and device names, reasons), never markup: each
renderer escapes every piece of text it writes, Markdown with :func:`kvcache.analysing.tables.escape_markdown`,
HTML with :func:`html_text`, so a run's strings can inject neither HTML nor Markdown."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Union

from kvcache.analysing import tables
from kvcache.analysing.tables import Table


@dataclass(frozen=True)
class Heading:
    level: int  # 2 for a run, 3 for a section of it (1 is the document's title)
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Note:
    """Something the run lacks, or a remark: italic in both renderings."""

    text: str


@dataclass(frozen=True)
class Facts:
    """Bold-named facts, one a bullet."""

    items: list[tuple[str, str]]


@dataclass(frozen=True)
class Footnotes:
    """Numbered texts under a table, note n being what a cell's ``[n]`` refers to
    (:class:`kvcache.analysing.tables.Notes`)."""

    texts: list[str]


Block = Union[Heading, Paragraph, Note, Facts, Table, Footnotes]


@dataclass
class Doc:
    """A title and blocks in reading order."""

    title: str
    blocks: list[Block] = field(default_factory=list)

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(Heading(level, text))

    def para(self, text: str) -> None:
        self.blocks.append(Paragraph(text))

    def note(self, text: str) -> None:
        self.blocks.append(Note(text))

    def facts(self, items: list[tuple[str, str]]) -> None:
        self.blocks.append(Facts(items))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(Table(header, rows))

    def footnotes(self, texts: list[str]) -> None:
        if texts:
            self.blocks.append(Footnotes(list(texts)))


def html_text(text: object) -> str:
    """``text`` as HTML character data or a quoted attribute value (``& < > " '`` as entities; control and
    bidirectional formatting characters, NUL and U+202E among them, as their code: ``\\x00``, ``\\u202e``,
    :func:`kvcache.analysing.tables.shown_code`): the one escape for everything report.html shows as text."""
    return html.escape(tables.visible(text), quote=True)


def to_markdown(doc: Doc) -> str:
    """report.md: GitHub-flavoured Markdown, ready for a job summary; all text escaped
    (:func:`kvcache.analysing.tables.escape_markdown`, tables through :func:`kvcache.analysing.tables.markdown`)."""
    e = tables.escape_markdown
    out: list[str] = [f"# {e(doc.title)}"]
    for block in doc.blocks:
        if isinstance(block, Heading):
            out.append("#" * block.level + " " + e(block.text))
        elif isinstance(block, Paragraph):
            out.append(e(block.text))
        elif isinstance(block, Note):
            out.append(f"_{e(block.text)}_")
        elif isinstance(block, Facts):
            out.append("\n".join(f"- **{e(k)}**: {e(v)}" for k, v in block.items))
        elif isinstance(block, Footnotes):
            out.append("\n".join(f"{i}. {e(text)}" for i, text in enumerate(block.texts, 1)))
        else:
            out.append("\n".join(tables.markdown(block)))
    return "\n\n".join(out).rstrip() + "\n"


def to_html(doc: Doc) -> str:
    """The blocks as HTML elements, all text escaped (:func:`html_text`); the title is the page's own <h1>
    (:func:`kvcache.analysing.report.page.render_html`), not repeated here."""
    e = html_text
    out: list[str] = []
    for block in doc.blocks:
        if isinstance(block, Heading):
            level = min(max(block.level, 2), 6)
            out.append(f"<h{level}>{e(block.text)}</h{level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{e(block.text)}</p>")
        elif isinstance(block, Note):
            out.append(f'<p class="note">{e(block.text)}</p>')
        elif isinstance(block, Facts):
            items = "".join(f"<li><strong>{e(k)}</strong>: {e(v)}</li>" for k, v in block.items)
            out.append(f'<ul class="facts">{items}</ul>')
        elif isinstance(block, Footnotes):
            out.append('<ol class="notes">' + "".join(f"<li>{e(text)}</li>" for text in block.texts) + "</ol>")
        else:
            head = "".join(f"<th>{e(h)}</th>" for h in block.header)
            rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in block.rows)
            out.append(f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead>'
                       f"<tbody>{rows}</tbody></table></div>")
    return "\n".join(out)
