"""``kvcache compare RUN.json RUN.json ...``: runs side by side, the first as baseline; exit 1 on a regression.

One row per cache class, one column group per run. Every later run is judged against the first by the
session-end gate's own judge (:mod:`kvcache.analysing.gate`), as if the first run had been recorded as the baseline
(:mod:`kvcache.analysing.baseline`'s rules: a first run whose timed fit could not be recorded is no timed baseline):
counted passes and counted overhead (ATen ops per step, weight passes) exactly, timed passes and the timed
intercept by their interval, inconclusive on a poor fit or drift. Runs must have the same identity
(:mod:`kvcache.analysing.identity`) unless ``--allow-mismatch``; op counts are compared only between runs on the
same torch release (another release is shown, not judged). No torch here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvcache.analysing import baseline as baselines
from kvcache.analysing import gate, identity, tables
from kvcache.analysing.records import RecordError, Run, load_run
from kvcache.analysing.stats import finite
from kvcache.analysing.tables import Table, num

# Changes against the baseline.
SAME, REGRESSED, IMPROVED, INCONCLUSIVE = "same", "regressed", "improved", "inconclusive"
MARKS = {SAME: "", REGRESSED: "▲", IMPROVED: "▼", INCONCLUSIVE: "?"}
LEGEND = (
    "▲ regression against the first run (the gate's judge), ▼ better beyond tolerance, "
    "? inconclusive (interval straddles the allowed value, poor fit, drift, or no passes figure): not a regression"
)

MEASURES = ("timed", "counted", "intercept_ms", "r2", "ops", "weight_passes", "verdict")
HEADERS = {
    "timed": "timed passes",
    "counted": "counted passes",
    "intercept_ms": "intercept ms",
    "r2": "R²",
    "ops": "ops/step",
    "weight_passes": "weight passes",
    "verdict": "verdict",
}
# What each verdict judges, as a regression line names it.
JUDGED = {"counted": "counted passes", "timed": "timed passes", "overhead": "overhead", "intercept": "intercept",
          "ledger": "per-op ledger"}
DASH = "—"


@dataclass(frozen=True)
class RunInfo:
    """Where a compared run came from; ``label`` is unique within a comparison."""

    path: str
    transformers: str
    device: str
    label: str
    setup: str = ""  # model and dtype


@dataclass(frozen=True)
class Cell:
    """One cache class in one run; ``present`` False means the class is absent (``reason`` says why, if known).

    ``timed_change``/``counted_change`` are SAME/REGRESSED/IMPROVED/INCONCLUSIVE against the baseline,
    or "" where there is nothing to compare (the baseline itself, or a value missing on either side).
    """

    present: bool
    timed: float | None = None
    timed_ci: tuple[float, float] | None = None
    counted: float | None = None
    intercept_ms: float | None = None
    r2: float | None = None
    ops: int | None = None
    weight_passes: float | None = None
    verdict: str | None = None
    reason: str | None = None
    timed_change: str = ""
    timed_delta: float | None = None
    counted_change: str = ""
    counted_delta: float | None = None
    ops_change: str = ""
    ops_delta: float | None = None
    intercept_change: str = ""
    judged: dict[str, Any] | None = None  # {measure: verdict dict} against the first run


@dataclass(frozen=True)
class Regression:
    """A measure of one cache class in one run beyond what the baseline allows."""

    cache: str
    run: str
    measure: str
    reason: str

    def line(self) -> str:
        return f"regression: {self.cache} in {self.run}: {self.measure}: {self.reason}"


@dataclass
class Comparison:
    """Plain result of :func:`compare`: ``cells[cache][i]`` is the class in ``runs[i]``; ``runs[0]`` is the baseline."""

    runs: list[RunInfo]
    caches: list[str]
    cells: dict[str, list[Cell]]
    regressions: list[Regression] = field(default_factory=list)
    tolerance: float = 0.10
    counted_tolerance: float = 0.05
    ops_tolerance: float = 0.5
    weight_passes_tolerance: float = 0.05
    ledger: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (cache, op) -> text per run

    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys(r.device for r in self.runs))

    def measures(self) -> list[str]:
        """Measures that some run has (a counted-only sweep shows no timed columns); all if none has any."""
        shown = [m for m in MEASURES if any(getattr(c, m) is not None for cells in self.cells.values() for c in cells)]
        return shown or list(MEASURES)


def _interval(value: Any) -> tuple[float, float] | None:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    lo, hi = finite(value[0]), finite(value[1])
    return None if lo is None or hi is None else (lo, hi)


def _section(run: Run, key: str, cache: str) -> dict[str, Any]:
    value = (run.kv.get(key) or {}).get(cache)
    return value if isinstance(value, dict) else {}


def _skipped(run: Run) -> list[dict[str, Any]]:
    entries = run.kv.get("skipped") or []
    return [e for e in entries if isinstance(e, dict) and e.get("cache") is not None]


def _skip_reason(run: Run, cache: str) -> str | None:
    entries = [e for e in _skipped(run) if str(e["cache"]) == cache]
    whole = [e for e in entries if e.get("context") is None]
    for entry in whole or entries:
        if entry.get("reason"):
            return str(entry["reason"])
    return None


def _cell(run: Run, cache: str) -> Cell:
    if cache not in run.caches():
        return Cell(present=False, reason=_skip_reason(run, cache))
    fit, traffic, verdict = (_section(run, key, cache) for key in ("fit", "traffic", "verdict"))
    status = gate.status_of(verdict) if verdict else None
    return Cell(
        present=True,
        timed=finite(fit.get("passes")),
        timed_ci=_interval(fit.get("passes_ci")),
        counted=finite(traffic.get("passes")),
        intercept_ms=finite(fit.get("intercept_ms")),
        r2=finite(fit.get("r2")),
        ops=traffic.get("ops_per_step") if isinstance(traffic.get("ops_per_step"), int) else None,
        weight_passes=finite(traffic.get("weight_passes")),
        verdict=None if status is None else str(status),
    )


def _labels(runs: Sequence[Run]) -> list[str]:
    return tables.unique_labels([run.label for run in runs], [run.path for run in runs])


def baseline_of(run: Run) -> dict[str, dict[str, Any]]:
    """A run as a baseline, ``{measure: {cache: entry}}``: what recording it would keep (same rules)."""
    entries, _ = baselines.entries_of_run(run.kv, run.datetime)
    ident = identity.of_run(run.kv)
    return {m: entries.get(identity.key(ident, m), {}) for m in identity.MEASURE_FIELDS}


def judge_against(run: Run, base: Run, rules: gate.Rules) -> dict[str, dict[str, Any]]:
    """``run``'s verdicts with ``base`` as its baseline: the session-end gate's judge, the same rules."""
    keys = {m: f"the first run ({Path(base.path).name})" for m in identity.MEASURE_FIELDS}
    min_r2 = (run.kv.get("settings") or {}).get("min_r2")
    rules = replace(rules, min_r2=min_r2) if isinstance(min_r2, (int, float)) else rules
    base_entries = baseline_of(base)
    torches = [identity.of_run(r.kv).get("torch") for r in (base, run)]
    if torches[0] != torches[1]:
        base_entries["overhead"] = {}
        keys["overhead"] = (f"the first run ({Path(base.path).name}) on torch {torches[0]}: op counts are compared "
                            f"on one torch release only, this run has {torches[1]}")
    verdicts = gate.judge_run(run.kv, base_entries, rules, keys)
    for cache, measures in verdicts.items():
        problem = baselines.timed_problem(base.kv, cache) if cache in (base.kv.get("fit") or {}) else None
        if problem and measures["timed"]["status"] == "no-baseline":
            measures["timed"]["reason"] = f"the first run's timed passes are no baseline: {problem}"
    return verdicts


def compare(runs: Sequence[Run], tolerance: float = 0.10, counted_tolerance: float = 0.05, *,
            ops_tolerance: float = 0.5, weight_passes_tolerance: float = 0.05) -> Comparison:
    """Compare every run against ``runs[0]`` with the gate's judge (see the module docstring)."""
    if not runs:
        raise ValueError("compare needs at least one run")
    rules = gate.Rules(tolerance=tolerance, counted_tolerance=counted_tolerance, ops_tolerance=ops_tolerance,
                       weight_passes_tolerance=weight_passes_tolerance)
    infos = [RunInfo(r.path, r.transformers, r.device, label, _setup(r)) for r, label in zip(runs, _labels(runs))]
    seen: dict[str, None] = {}
    for run in runs:
        for cache in run.caches():
            seen.setdefault(cache)
        for entry in _skipped(run):
            if entry.get("context") is None:
                seen.setdefault(str(entry["cache"]))
    caches = list(seen)
    comparison = Comparison(infos, caches, {}, [], tolerance, counted_tolerance, ops_tolerance,
                            weight_passes_tolerance)
    judged = [judge_against(run, runs[0], rules) for run in runs[1:]]
    for cache in caches:
        base = _cell(runs[0], cache)
        row = [base]
        for info, verdicts, run in zip(infos[1:], judged, runs[1:]):
            cell, regressions = _against(_cell(run, cache), base, cache, info.label, verdicts.get(cache), rules)
            row.append(cell)
            comparison.regressions += regressions
        comparison.cells[cache] = row
    comparison.ledger = ledger_rows(runs, judged)
    return comparison


def ledger_rows(runs: Sequence[Run], judged: list[dict[str, dict[str, Any]]]) -> dict[tuple[str, str], list[str]]:
    """(cache, op) -> each run's ledger figure for that op: timed passes [interval], marked where the op's part
    of the ledger verdict against the first run is a regression (▲) or inconclusive (?)."""
    out: dict[tuple[str, str], list[str]] = {}
    for i, run in enumerate(runs):
        for cache, rows in (run.kv.get("ledger") or {}).items():
            parts = ((judged[i - 1].get(cache) or {}).get("ledger") or {}).get("parts") or {} if i else {}
            for op, row in (rows or {}).items():
                ci = row.get("timed_ci") or [None, None]
                text = num(finite(row.get("timed")), missing=DASH)
                if None not in ci:
                    text += f" [{ci[0]:.2f}–{ci[1]:.2f}]"
                status = next((p.get("status") for label, p in parts.items() if label.split(" (")[0] == op), None)
                mark = MARKS.get(CHANGE_OF.get(status or "", ""), "")
                out.setdefault((cache, op), [DASH] * len(runs))[i] = f"{text} {mark}".strip()
    return out


def ledger_table(comparison: Comparison) -> Table | None:
    """The per-op ledgers side by side (one column per run), or None when no run has one."""
    if not comparison.ledger:
        return None
    header = ["cache", "op"] + [f"timed passes: {label}" for label in _group_labels(comparison)]
    rows = [[cache, op, *texts] for (cache, op), texts in comparison.ledger.items()]
    return Table(header, rows, None, list(range(2, 2 + len(comparison.runs))))


def _setup(run: Run) -> str:
    ident = identity.of_run(run.kv)
    return f"{ident.get('model')}, {ident.get('dtype')}"


CHANGE_OF = {"regression": REGRESSED, "inconclusive": INCONCLUSIVE}


def _against(cell: Cell, base: Cell, cache: str, label: str, verdicts: dict[str, Any] | None,
             rules: gate.Rules) -> tuple[Cell, list[Regression]]:
    """``cell`` with its changes against ``base`` (from the judge's verdicts; *improved* is shown only, never
    judged) and the regressions they make."""
    if not cell.present or not verdicts:
        return cell, []
    regressions = [Regression(cache, label, JUDGED.get(m, m), v.get("reason", "")) for m, v in verdicts.items()
                   if v.get("status") == "regression"]
    changes: dict[str, Any] = {"judged": verdicts}
    if cell.counted is not None and base.counted is not None:
        status = verdicts["counted"]["status"]
        improved = cell.counted < base.counted - rules.counted_tolerance
        change = CHANGE_OF.get(status) or (IMPROVED if improved else SAME)
        changes.update(counted_change=change, counted_delta=cell.counted - base.counted)
    if cell.timed is not None and base.timed is not None:
        status = verdicts["timed"]["status"]
        hi = (cell.timed_ci or (cell.timed, cell.timed))[1]
        change = CHANGE_OF.get(status) or (IMPROVED if hi < base.timed / (1 + rules.tolerance) else SAME)
        changes.update(timed_change=change, timed_delta=cell.timed - base.timed)
    if cell.ops is not None and base.ops is not None:
        status = verdicts.get("overhead", {}).get("status")
        change = CHANGE_OF.get(status) or (IMPROVED if cell.ops < base.ops else SAME)
        changes.update(ops_change=change if status != "no-baseline" else "", ops_delta=cell.ops - base.ops)
    changes["intercept_change"] = CHANGE_OF.get(verdicts.get("intercept", {}).get("status"), "")
    return replace(cell, **changes), regressions


# --- rendering -------------------------------------------------------------------------------------------


def _marked(text: str, change: str, delta: float | None, spec: str = "+.2f") -> str:
    mark = MARKS.get(change, "")
    if not mark or delta is None:
        return text
    return f"{text} {mark} {delta:{spec}}"


def cell_texts(cell: Cell, measures: Sequence[str]) -> list[str]:
    """The displayed text of one cell, one string per measure."""
    if not cell.present:
        first = f"{DASH} skipped: {cell.reason}" if cell.reason else f"{DASH} not in run"
        return [first] + [DASH] * (len(measures) - 1)
    texts = []
    for measure in measures:
        if measure == "timed":
            timed = num(cell.timed, missing=DASH)
            if cell.timed is not None and cell.timed_ci is not None:
                timed += f" [{cell.timed_ci[0]:.2f}–{cell.timed_ci[1]:.2f}]"
            texts.append(_marked(timed, cell.timed_change, cell.timed_delta))
        elif measure == "counted":
            texts.append(_marked(num(cell.counted, missing=DASH), cell.counted_change, cell.counted_delta))
        elif measure == "intercept_ms":
            texts.append(num(cell.intercept_ms, ".1f", DASH) + (f" {MARKS[cell.intercept_change]}"
                                                                 if MARKS.get(cell.intercept_change) else ""))
        elif measure == "ops":
            texts.append(_marked(num(cell.ops, ".0f", DASH), cell.ops_change, cell.ops_delta, "+.0f"))
        elif measure == "weight_passes":
            texts.append(num(cell.weight_passes, ".3f", DASH))
        elif measure == "r2":
            texts.append(num(cell.r2, ".3f", DASH))
        else:
            texts.append(cell.verdict or DASH)
    return texts


def _group_labels(comparison: Comparison) -> list[str]:
    """Column-group labels: release, plus the device when the runs do not share one."""
    mixed = len(comparison.devices) > 1
    labels = [
        f"transformers {info.transformers}, {info.setup}" + (f" on {info.device}" if mixed else "")
        for info in comparison.runs
    ]
    return tables.unique_labels(labels, [info.path for info in comparison.runs])


def _preamble(comparison: Comparison) -> list[str]:
    base = comparison.runs[0]
    lines = [f"Baseline: {base.label} ({base.path})."]
    if len(comparison.devices) == 1:
        lines.append(f"Device: {comparison.devices[0]}.")
    else:
        lines.append("Runs come from different devices: timed changes may be the machine's, not the release's.")
    lines.append(
        f"Tolerance: timed ×{1 + comparison.tolerance:.2f} (interval lower bound), "
        f"counted +{comparison.counted_tolerance:.2f} passes; ops per step +{comparison.ops_tolerance:g} per layer, "
        f"weight passes +{comparison.weight_passes_tolerance:g}; intercept ×{1 + comparison.tolerance:.2f}."
    )
    return lines


def _summary(comparison: Comparison) -> str:
    n = len(comparison.regressions)
    if n:
        return f"{n} regression{'s' if n != 1 else ''} against the baseline."
    if len(comparison.runs) == 1:
        return "One run: nothing to compare against."
    return "No regressions against the baseline."


def _rows(comparison: Comparison, measures: Sequence[str]) -> list[list[str]]:
    rows = []
    for cache in comparison.caches:
        row = [cache]
        for cell in comparison.cells[cache]:
            row += cell_texts(cell, measures)
        rows.append(row)
    return rows


def table(comparison: Comparison) -> Table:
    """The comparison as a :class:`~kvcache.analysing.tables.Table`: the cache column, then one column group per
    run (labelled by :func:`_group_labels`), numbers right-aligned in Markdown."""
    measures = comparison.measures()
    header = ["cache"] + [HEADERS[m] for _ in comparison.runs for m in measures]
    groups = [("", 1)] + [(label, len(measures)) for label in _group_labels(comparison)]
    right = [1 + i * len(measures) + j for i in range(len(comparison.runs))
             for j, m in enumerate(measures) if m != "verdict"]
    return Table(header, _rows(comparison, measures), groups, right)


def render_text(comparison: Comparison) -> str:
    """An aligned plain-text table with a group header line per run."""
    out = _preamble(comparison) + ["", *tables.text(table(comparison))]
    ledger = ledger_table(comparison)
    if ledger is not None:
        out += ["", "Per-op timed ledger:", *tables.text(ledger)]
    out += ["", LEGEND, _summary(comparison)]
    out += [r.line() for r in comparison.regressions]
    return "\n".join(out)


def render_markdown(comparison: Comparison) -> str:
    """A GitHub-flavoured Markdown table (for ``$GITHUB_STEP_SUMMARY``), with the regressions listed below."""
    lines = ["### KV-cache passes across runs", "", *_preamble(comparison), "", *tables.markdown(table(comparison))]
    ledger = ledger_table(comparison)
    if ledger is not None:
        lines += ["", "#### Per-op timed ledger", "", *tables.markdown(ledger)]
    lines += ["", LEGEND, "", f"**{_summary(comparison)}**"]
    if comparison.regressions:
        lines.append("")
        lines += [f"- {tables.escape_markdown(r.line())}" for r in comparison.regressions]
    return "\n".join(lines)


# --- command ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcache compare",
        description="Compare benchmark JSON runs against the first (the baseline) with the gate's judge; exit 1 "
        "on a regression, 2 on unreadable input, bad options or runs that are not comparable.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN.json", help="pytest --benchmark-json files; first = baseline")
    parser.add_argument("--markdown", action="store_true", help="print a GitHub-flavoured Markdown table")
    parser.add_argument(
        "--tolerance", type=float, default=0.10, help="timed: allowed relative increase (default 0.10)"
    )
    parser.add_argument(
        "--counted-tolerance", type=float, default=0.05, help="counted: allowed absolute increase (default 0.05)"
    )
    parser.add_argument(
        "--ops-tolerance", type=float, default=0.5,
        help="ATen ops per step: allowed increase per layer (default 0.5)"
    )
    parser.add_argument(
        "--weight-passes-tolerance", type=float, default=0.05,
        help="weight passes per step: allowed absolute increase (default 0.05)"
    )
    parser.add_argument(
        "--allow-mismatch", "--allow-device-mismatch", dest="allow_mismatch", action="store_true",
        help="compare runs whose identity differs (device, model, dtype, threads) anyway",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        gate.Rules(tolerance=args.tolerance, counted_tolerance=args.counted_tolerance,
                   ops_tolerance=args.ops_tolerance, weight_passes_tolerance=args.weight_passes_tolerance)
    except ValueError as exc:
        print(f"kvcache compare: --{str(exc).replace('_', '-')}", file=sys.stderr)
        return 2
    runs = []
    for path in args.runs:
        try:
            runs.append(load_run(path))
        except RecordError as exc:
            print(f"kvcache compare: {exc}", file=sys.stderr)
            return 2
    problem = mismatch(runs)
    if problem and not args.allow_mismatch:
        print(f"kvcache compare: refusing to compare runs that differ in {problem}; pass --allow-mismatch to "
              "compare anyway", file=sys.stderr)
        return 2
    comparison = compare(runs, args.tolerance, args.counted_tolerance, ops_tolerance=args.ops_tolerance,
                         weight_passes_tolerance=args.weight_passes_tolerance)
    print(render_markdown(comparison) if args.markdown else render_text(comparison), flush=True)
    if args.markdown:  # stdout goes to the step summary; say it in the log too
        for regression in comparison.regressions:
            print(regression.line(), file=sys.stderr)
    return 1 if comparison.regressions else 0


def mismatch(runs: Sequence[Run]) -> str | None:
    """The identity fields (of the measures the runs carry) on which they differ, named with each run's
    value; None when they are comparable."""
    measures = [m for m, key in (("counted", "traffic"), ("timed", "fit")) if any(r.kv.get(key) for r in runs)]
    differing = identity.mismatches([identity.of_run(r.kv) for r in runs], measures or ["counted"])
    if not differing:
        return None
    return "; ".join(f"{name} ({', '.join(f'{Path(r.path).name}: {v}' for r, v in zip(runs, values))})"
                     for name, values in differing.items())
