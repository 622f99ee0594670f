"""``kvcache report``: charts and a Markdown/HTML report of one or more benchmark runs.

``latency.png``, ``traffic.png``, ``ledger.png`` and ``memory.png`` where the runs have them, ``report.md`` and
``report.html`` (docs/reports.md), by concern: :mod:`.data` (runs shaped into what is tabled and drawn),
:mod:`.sections` (what the report says), :mod:`.documents` (the document model, Markdown and HTML renderers),
:mod:`.charts` (the PNGs), :mod:`.page` (report.html, its CSS and JS inlined). Never imports torch."""

from __future__ import annotations

from pathlib import Path

from kvcache.analysing.records import Run
from kvcache.analysing.report.charts import (
    latency_figure,
    ledger_figure,
    memory_figure,
    plot_latency,
    plot_ledger,
    plot_memory,
    plot_traffic,
    traffic_figure,
)
from kvcache.analysing.report.data import (
    ReportError,
    chart_data,
    fit_line,
    fit_problem,
    points_by_cache,
    run_crossovers,
    run_names,
)
from kvcache.analysing.report.documents import Doc, to_html, to_markdown
from kvcache.analysing.report.page import render_html
from kvcache.analysing.report.sections import build_doc

__all__ = ["Doc", "ReportError", "build_doc", "chart_data", "fit_line", "fit_problem",
           "latency_figure", "ledger_figure", "memory_figure", "plot_latency", "plot_ledger",
           "plot_memory", "plot_traffic",
           "points_by_cache", "render", "render_html", "run_crossovers", "run_names", "to_html", "to_markdown",
           "traffic_figure"]


#: The files ``kvcache report`` writes into ``--out`` (ledger.png, memory.png and ab.png where the runs have them).
REPORT_FILES = ("report.md", "report.html", "latency.png", "traffic.png", "ledger.png", "memory.png", "ab.png")


def render(runs: list[Run], out_dir: Path) -> list[Path]:
    """Write report.md, report.html, latency.png, traffic.png (ledger.png when a run has a per-op ledger, memory.png
    when one has counted memory) into ``out_dir``; return their paths.

    The Markdown and HTML are written first, so they exist even when matplotlib is missing (ReportError). A write
    that fails raises its OSError (``kvcache report`` writes into a temp folder, moved into ``--out`` whole:
    :func:`kvcache.analysing.files.staged_folder`).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = build_doc(runs)
    md = out_dir / "report.md"
    md.write_text(to_markdown(doc), encoding="utf-8")
    page = out_dir / "report.html"
    page.write_text(render_html(runs, doc), encoding="utf-8")
    written = [md, page]
    written.append(plot_latency(runs, out_dir / "latency.png"))
    written.append(plot_traffic(runs, out_dir / "traffic.png"))
    ledger = plot_ledger(runs, out_dir / "ledger.png")
    if ledger is not None:
        written.append(ledger)
    memory = plot_memory(runs, out_dir / "memory.png")
    if memory is not None:
        written.append(memory)
    return written
