"""The pair of an A/B run (``kvcache ab --json``) in ``kvcache report``: ``ab.png`` and an A/B section of
``report.md``.

``ab.png``: left, median step time (ms, median over rounds) against context (tokens), both sides on one chart
(A solid, B dashed, one colour per class); right, the B/A ratio with its paired interval for each class's timed
slope, intercept and ledger op, with the tolerance band. No torch; matplotlib lazily (as the other charts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcache.analysing import tables
from kvcache.analysing.estimates import finite
from kvcache.analysing.judge import paired as judge
from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.records import Run
from kvcache.analysing.records.ab_document import ABDocument, ABRunSection, read_ab_section
from kvcache.analysing.records.jsonrecord import RecordError
from kvcache.analysing.report.charts import _plain_text, _pyplot, _save
from kvcache.analysing.report.data import cache_colours, per_context, points_by_cache


@dataclass(frozen=True)
class ABFile:
    """What the report shows of an A/B output file: the paired verdicts (the ``ab`` section as written), the session
    (``ab_run``: each side's description) and the tolerance the pair was judged with (a fraction; the judge's default
    where the file has none)."""

    ab: dict[str, Any]
    run: ABRunSection
    tolerance: float


def ab_file_of(path: str | Path) -> ABFile | None:
    """The :class:`ABFile` of an A/B output file (``kvcache ab --json``); None for any other file, or one whose
    ``ab_run`` cannot be read."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    try:
        found = ABDocument.read(doc, str(path))
    except RecordError:
        return None
    if found is None or "side_a" in found.absent:
        return None
    tolerance = finite(found.ab_run.tolerance)
    return ABFile(found.ab, found.ab_run, Rules().tolerance if tolerance is None else tolerance)


def ratio_rows(ab: dict[str, Any]) -> list[tuple[str, float, float | None, float | None, str]]:
    """``(label, ratio, low, high, status)`` of every paired verdict with a ratio, in the ``ab`` section's order."""
    rows = []
    for cache, measures in read_ab_section(ab).items():
        for measure, v in measures.items():
            ratio = finite(v.ratio)
            if ratio is None:
                continue
            ci = v.ratio_ci or [None, None]
            rows.append((f"{cache} {measure}", ratio, finite(ci[0]), finite(ci[1]), v.status))
    return rows


@_plain_text
def ab_figure(run_a: Run, run_b: Run, ab: dict[str, Any], tolerance: float) -> Any:
    plt = _pyplot()
    rows = ratio_rows(ab)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, max(5.0, 0.3 * len(rows) + 2)), layout="constrained")
    colours = cache_colours([run_a, run_b])
    for run, style, side in ((run_a, "o-", "A"), (run_b, "s--", "B")):
        for cache, pts in points_by_cache(run).items():
            per = per_context(pts)
            left.plot([c["context"] for c in per], [c["median_ms"] for c in per], style, color=colours[cache],
                      ms=4, label=f"{cache} {side}")
    left.set_xlabel("context (tokens)")
    left.set_ylabel("median step time (ms)")
    left.set_title("both sides, points measured back to back", fontsize=10)
    left.set_xlim(left=0)
    left.set_ylim(bottom=0)
    left.grid(alpha=0.3)
    if left.get_legend_handles_labels()[0]:
        left.legend(fontsize=7, frameon=False)
    colour = {"regression": "tab:red", "improvement": "tab:green", "pass": "tab:blue", "inconclusive": "0.5"}
    for y, (_, ratio, lo, hi, status) in enumerate(rows):
        err = [[ratio - lo], [hi - ratio]] if lo is not None and hi is not None else None
        right.errorbar([ratio], [y], xerr=err, fmt="o", ms=4, capsize=3, color=colour.get(status, "0.3"))
    right.set_yticks(range(len(rows)), [f"{label} ({status})" for label, _, _, _, status in rows], fontsize=7)
    right.invert_yaxis()
    right.axvline(1.0, color="0.3", lw=1)
    for bound in (1 + tolerance, 1 / (1 + tolerance)):
        right.axvline(bound, color="0.5", ls=":", lw=1)
    right.set_xlabel("B / A (paired bootstrap interval)")
    right.set_title("ratio per class and op", fontsize=10)
    right.grid(alpha=0.3, axis="x")
    if not rows:
        right.text(0.5, 0.5, "no ratio", ha="center", va="center", transform=right.transAxes)
    return fig


def ab_markdown(pair: ABFile) -> list[str]:
    """The report's A/B section (Markdown; every cell escaped)."""
    table = tables.Table(["class", "measure", "A", "B", "B/A [interval]", "verdict"],
                         judge.summary_rows(read_ab_section(pair.ab)))
    lines = ["", "## A/B: B against A, paired", ""]
    for name, side in pair.run.sides.items():
        text = (f"transformers {side.transformers}, torch {side.torch}, drift {tables.num(side.drift, '+.1%')}"
                + (f", failed: {side.failed}" if side.failed else ""))
        lines.append(f"- **{tables.escape_markdown(str(name).upper())}**: {tables.escape_markdown(text)}")
    return [*lines, "", *tables.markdown(table), "", "![A/B](ab.png)", ""]


def write_ab(path: str | Path, runs: list[Run], out_dir: Path) -> list[Path]:
    """For an A/B output file among the report's inputs: ab.png and the A/B section appended to report.md."""
    pair = ab_file_of(path)
    by_path = {run.path: run for run in runs}
    run_a, run_b = by_path.get(f"{path}[A]"), by_path.get(f"{path}[B]")
    if pair is None or run_a is None or run_b is None:
        return []
    md = Path(out_dir) / "report.md"
    with md.open("a", encoding="utf-8") as fh:
        fh.write("\n".join(ab_markdown(pair)) + "\n")
    return [_save(ab_figure(run_a, run_b, pair.ab, pair.tolerance), Path(out_dir) / "ab.png")]
