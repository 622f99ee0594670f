"""A :class:`~kvcache.analysing.compare.Comparison` as text: the aligned terminal table and the GitHub-flavoured
Markdown (for ``$GITHUB_STEP_SUMMARY``) of ``kvcache compare``, laid out by the one table renderer
(:mod:`kvcache.analysing.tables`). Passes are bytes moved per KV-cache byte; ``intercept ms`` is ms per step with
an empty cache; ``ops/step`` ATen ops per decode step; memory held/peak passes. Each later run's figures carry the
mark of their change against the first run (:data:`MARKS`) and the difference."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvcache.analysing import tables
from kvcache.analysing.compare import IMPROVED, INCONCLUSIVE, REGRESSED, SAME, Cell, Comparison, LedgerCell
from kvcache.analysing.judge import measure_table
from kvcache.analysing.tables import MISSING, Table, escape_markdown, num

MARKS = {SAME: "", REGRESSED: "▲", IMPROVED: "▼", INCONCLUSIVE: "?"}
LEGEND = (
    "▲ regression against the first run (the gate's judge), ▼ better beyond tolerance, "
    "? inconclusive (interval straddles the allowed value, poor fit, drift, or no passes figure): not a regression"
)
VERDICT_COLUMN = "verdict"


def columns() -> list[str]:
    """Every column a comparison may show: each compared measure (:mod:`kvcache.analysing.judge.measure_table`), then
    the
    run's own verdict of the class."""
    return [m.name for m in measure_table.selected("compared")] + [VERDICT_COLUMN]


def column_header(column: str) -> str:
    if column == VERDICT_COLUMN:
        return "verdict"
    measure = measure_table.BY_NAME[column]
    return measure.header or measure.label


def shown_columns(comparison: Comparison) -> list[str]:
    """The columns some run has a figure for (a counted-only sweep shows no timed columns); all when none has any."""
    cells = [c for row in comparison.cells.values() for c in row]
    shown = [m for m in columns()
             if any((c.verdict if m == VERDICT_COLUMN else c.figures.get(m)) is not None for c in cells)]
    return shown or columns()


def _marked(text: str, change: str, delta: float | None, spec: str = "+.2f", figure: str = "") -> str:
    """``text`` with the change's mark and ``delta``, preceded by the ``figure`` it is of when one cell shows
    several (memory: ``1.00/1.02 ▲ peak +1.00``)."""
    mark = MARKS.get(change, "")
    if not mark or delta is None:
        return text
    return f"{text} {mark} {figure + ' ' if figure else ''}{delta:{spec}}"


def with_interval(text: str, bounds: tuple[float, float] | None, spec: str = ".2f") -> str:
    """``text`` followed by ``bounds`` as `` [low–high]`` in ``spec``; ``text`` alone when there are none."""
    return text if bounds is None else f"{text} [{bounds[0]:{spec}}–{bounds[1]:{spec}}]"


def cell_texts(cell: Cell, shown: Sequence[str]) -> list[str]:
    """The displayed text of one cell, one string per column in ``shown``."""
    if not cell.present:
        first = f"{MISSING} skipped: {cell.reason}" if cell.reason else f"{MISSING} not in run"
        return [first] + [MISSING] * (len(shown) - 1)
    texts = []
    for name in shown:
        value, change, delta = cell.figures.get(name), cell.changes.get(name, ""), cell.deltas.get(name)
        if name == VERDICT_COLUMN:
            texts.append(cell.verdict or MISSING)
        elif name == "timed":
            timed = with_interval(num(value), cell.intervals.get("timed") if value is not None else None)
            texts.append(_marked(timed, change, delta))
        elif name == "intercept":
            mark = MARKS.get(change, "")
            texts.append(num(value, ".1f") + (f" {mark}" if mark else ""))
        elif name in ("ops", "syncs"):
            texts.append(_marked(num(value, ".0f"), change, delta, "+.0f"))
        elif name in ("weight_passes", "r2"):
            texts.append(num(value, ".3f"))
        elif name == "held":
            peak = cell.figures.get("peak")
            held = num(value) + (f"/{num(peak)}" if peak is not None else "")
            texts.append(_marked(held, change, delta, figure=cell.memory_figure))
        elif name == "gpu":
            gpus_verdict = (cell.judged or {}).get(measure_table.BY_NAME[name].verdict or "")
            texts.append(" · ".join(
                f"{gpu} {num(passes)}" + (" ▲" if gpus_verdict is not None and gpus_verdict.parts and
                                         getattr(gpus_verdict.parts.get(gpu), "status", "") == "regression" else "")
                for gpu, passes in value.items()) if value else MISSING)
        else:  # counted passes, and any measure without a rendering of its own
            texts.append(_marked(num(value) if isinstance(value, (int, float)) or value is None else str(value),
                                 change, delta))
    return texts


def _group_labels(comparison: Comparison) -> list[str]:
    """Column-group labels: release, plus the device when the runs do not share one."""
    mixed = len(comparison.devices) > 1
    labels = [f"transformers {info.transformers}, {info.setup}" + (f" on {info.device}" if mixed else "")
              for info in comparison.runs]
    return tables.unique_labels(labels, [info.path for info in comparison.runs])


def preamble(comparison: Comparison) -> list[str]:
    """The lines above the table: the baseline, the device(s), the rules each later run was judged by, and the
    environment variables that differ."""
    base = comparison.runs[0]
    named = f"({Path(base.path).name})"  # a label made unique already ends with its file's name
    lines = [f"Baseline: {base.label}." if base.label.endswith(named) else f"Baseline: {base.label} ({base.path})."]
    if len(comparison.devices) == 1:
        lines.append(f"Device: {comparison.devices[0]}.")
    else:
        lines.append("Runs come from different devices: timed changes may be the machine's, not the release's.")
    own = "the first run's" if comparison.rules_from == "first" else "each run's own"
    source = (f"{own} (as its gate judged it)" if not comparison.overridden else
              f"{own}, with {', '.join('--' + n.replace('_', '-') for n in comparison.overridden)} as given")
    described = [rules.describe() for rules in comparison.rules]
    if described and len(set(described)) == 1:
        lines.append(f"Tolerance, {source}: {described[0]}.")
    else:
        lines += [f"Tolerance of {info.label}, {source}: {text}." for info, text in zip(comparison.runs[1:], described)]
    for name, values in comparison.variables.items():
        shown = ", ".join(f"{Path(info.path).name}: {'unset' if v is None else v}"
                          for info, v in zip(comparison.runs, values))
        lines.append(f"Environment variable {name} differs ({shown}).")
    if comparison.strict:
        lines.append("Strict (--strict): an inconclusive timed verdict, drift beyond --max-drift and a class skipped "
                     "where the first run has figures fail, as --kv-strict fails the suite.")
    return lines


def summary(comparison: Comparison) -> str:
    """One line: how many regressions against the baseline (and, under ``--strict``, how many failures of it)."""
    n, s = len(comparison.regressions), len(comparison.strict_failures)
    strict = f"{s} verdict{'s' if s != 1 else ''} failed under --strict" if s else ""
    if n:
        return f"{n} regression{'s' if n != 1 else ''}{f' and {strict}' if strict else ''} against the baseline."
    if len(comparison.runs) == 1:
        return "One run: nothing to compare against."
    return f"No regressions, but {strict} against the baseline." if strict else "No regressions against the baseline."


def comparison_table(comparison: Comparison) -> Table:
    """The comparison as a :class:`~kvcache.analysing.tables.Table`: the cache column, then one column group per
    run (labelled by :func:`_group_labels`), numbers right-aligned in Markdown."""
    shown = shown_columns(comparison)
    head = ["cache"] + [column_header(m) for _ in comparison.runs for m in shown]
    groups = [("", 1)] + [(label, len(shown)) for label in _group_labels(comparison)]
    right = [1 + i * len(shown) + j for i in range(len(comparison.runs)) for j, m in enumerate(shown)
             if m != VERDICT_COLUMN]
    rows = [[cache, *(text for cell in comparison.cells[cache] for text in cell_texts(cell, shown))]
            for cache in comparison.caches]
    return Table(head, rows, groups, right)


def _ledger_text(cell: LedgerCell | None) -> str:
    if cell is None:
        return MISSING
    text = with_interval(num(cell.timed), cell.timed_ci)
    return f"{text} {MARKS.get(cell.change, '')}".strip()


def ledger_table(comparison: Comparison) -> Table | None:
    """The per-op ledgers side by side (one column per run: timed passes [interval], marked where the op's part of
    the ledger verdict against the first run is a regression or inconclusive), or None when no run has one."""
    if not comparison.ledger:
        return None
    header = ["cache", "op"] + [f"timed passes: {label}" for label in _group_labels(comparison)]
    rows = [[cache, op, *map(_ledger_text, cells)] for (cache, op), cells in comparison.ledger.items()]
    return Table(header, rows, None, list(range(2, 2 + len(comparison.runs))))


def render_text(comparison: Comparison) -> str:
    """An aligned plain-text table with a group header line per run; every line shown by
    :func:`kvcache.analysing.tables.terminal_text`."""
    out = preamble(comparison) + ["", *tables.text(comparison_table(comparison))]
    ledger = ledger_table(comparison)
    if ledger is not None:
        out += ["", "Per-op timed ledger:", *tables.text(ledger)]
    out += ["", LEGEND, summary(comparison)]
    out += [r.line() for r in comparison.regressions + comparison.strict_failures]
    return "\n".join(map(tables.terminal_text, out))


def render_markdown(comparison: Comparison) -> str:
    """A GitHub-flavoured Markdown table (for ``$GITHUB_STEP_SUMMARY``), with the regressions listed below."""
    lines = ["### KV-cache passes across runs", "", *map(escape_markdown, preamble(comparison)), "",
             *tables.markdown(comparison_table(comparison))]
    ledger = ledger_table(comparison)
    if ledger is not None:
        lines += ["", "#### Per-op timed ledger", "", *tables.markdown(ledger)]
    lines += ["", LEGEND, "", f"**{summary(comparison)}**"]
    if comparison.regressions or comparison.strict_failures:
        lines.append("")
        lines += [f"- {escape_markdown(r.line())}" for r in comparison.regressions + comparison.strict_failures]
    return "\n".join(lines)
