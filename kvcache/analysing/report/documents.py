"""The report as a document: typed blocks (headings, paragraphs, notes, facts, tables) and their two renderers,
Markdown (tables through :mod:`kvcache.analysing.tables`) and HTML (the body of report.html)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Union

from kvcache.analysing import tables
from kvcache.analysing.tables import Table


@dataclass(frozen=True)
class Heading:
    level: int  # 1 for the report's title; HTML shifts it down one, under the page's own <h1>
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


Block = Union[Heading, Paragraph, Note, Facts, Table]


@dataclass
class Doc:
    """Blocks in reading order."""

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


def _one_line(cell: object) -> str:
    return str(cell).replace("\n", " ")


def to_markdown(doc: Doc) -> str:
    """report.md: GitHub-flavoured Markdown, ready for a job summary."""
    out: list[str] = []
    for block in doc.blocks:
        if isinstance(block, Heading):
            out.append("#" * block.level + " " + block.text)
        elif isinstance(block, Paragraph):
            out.append(block.text)
        elif isinstance(block, Note):
            out.append(f"_{block.text}_")
        elif isinstance(block, Facts):
            out.append("\n".join(f"- **{k}**: {v}" for k, v in block.items))
        else:
            one_line = Table([_one_line(h) for h in block.header], [[_one_line(c) for c in r] for r in block.rows])
            out.append("\n".join(tables.markdown(one_line)))
    return "\n\n".join(out).rstrip() + "\n"


def to_html(doc: Doc) -> str:
    """The blocks as HTML elements, text escaped; headings one level down (the page has its own <h1>)."""
    e = html.escape
    out: list[str] = []
    for block in doc.blocks:
        if isinstance(block, Heading):
            level = min(block.level + 1, 6)
            out.append(f"<h{level}>{e(block.text)}</h{level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{e(block.text)}</p>")
        elif isinstance(block, Note):
            out.append(f'<p class="note">{e(block.text)}</p>')
        elif isinstance(block, Facts):
            items = "".join(f"<li><strong>{e(k)}</strong>: {e(v)}</li>" for k, v in block.items)
            out.append(f'<ul class="facts">{items}</ul>')
        else:
            head = "".join(f"<th>{e(h)}</th>" for h in block.header)
            rows = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in block.rows)
            out.append(f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead>'
                       f"<tbody>{rows}</tbody></table></div>")
    return "\n".join(out)
