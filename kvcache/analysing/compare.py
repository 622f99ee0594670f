"""``kvcache compare RUN.json RUN.json ...``: runs side by side, the first as baseline; exit 1 on a regression.

One row per cache class, one column group per run. Every later run is judged against the first by the
session-end gate's own judge (:mod:`kvcache.analysing.gate`), as if the first run had been recorded as the baseline
(:mod:`kvcache.analysing.baseline`'s rules: a first run whose timed fit could not be recorded is no timed baseline):
counted passes, counted overhead (ATen ops per step, weight passes) and counted memory exactly, timed passes and the
timed intercept by their interval, inconclusive on a poor fit or drift. Each later run is judged by the rules its own
gate judged it with (its ``kv.settings``: every tolerance, ``min_r2``, ``max_passes``, ``max_drift``), so that
compare and the gate give the same verdicts; an option (``--tolerance``, ...) replaces that rule for every run.
``--require-classes``: a class with counted passes in the first run and none in a later one (skipped, unsupported,
not run) is a regression of that run, named with its skip reason.
Runs must have the same identity (:mod:`kvcache.analysing.identity`) unless ``--allow-mismatch``; op counts are
compared only between runs on the same torch release (another release is shown, not judged). Environment
variables recorded in the runs (``kv.environment.variables``) are shown where the runs differ. No torch here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvcache.analysing import arguments, gate, identity, tables
from kvcache.analysing import baseline as baselines
from kvcache.analysing.records import RecordError, Run, load_runs
from kvcache.analysing.stats import finite, interval
from kvcache.analysing.tables import Table, escape_markdown, num

# Changes against the baseline.
SAME, REGRESSED, IMPROVED, INCONCLUSIVE = "same", "regressed", "improved", "inconclusive"
MARKS = {SAME: "", REGRESSED: "▲", IMPROVED: "▼", INCONCLUSIVE: "?"}
LEGEND = (
    "▲ regression against the first run (the gate's judge), ▼ better beyond tolerance, "
    "? inconclusive (interval straddles the allowed value, poor fit, drift, or no passes figure): not a regression"
)

MEASURES = ("timed", "counted", "intercept_ms", "r2", "ops", "weight_passes", "memory", "verdict")
HEADERS = {
    "timed": "timed passes",
    "counted": "counted passes",
    "intercept_ms": "intercept ms",
    "r2": "R²",
    "ops": "ops/step",
    "weight_passes": "weight passes",
    "memory": "memory held/peak",
    "verdict": "verdict",
}
# What each verdict judges, as a regression line names it.
JUDGED = {"counted": "counted passes", "timed": "timed passes", "overhead": "overhead", "intercept": "intercept",
          "ledger": "per-op ledger", "memory": "counted memory"}
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
    memory: float | None = None  # held passes (kv.memory.<cache>.held_passes)
    peak: float | None = None  # peak passes
    verdict: str | None = None
    reason: str | None = None
    timed_change: str = ""
    timed_delta: float | None = None
    counted_change: str = ""
    counted_delta: float | None = None
    ops_change: str = ""
    ops_delta: float | None = None
    intercept_change: str = ""
    memory_change: str = ""
    memory_delta: float | None = None
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
    rules: list[gate.Rules] = field(default_factory=list)  # rules[i - 1]: what runs[i] is judged by
    ledger: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (cache, op) -> text per run
    variables: dict[str, list[str | None]] = field(default_factory=dict)  # differing env variables: value per run
    overridden: tuple[str, ...] = ()  # the rules given as options, in place of each run's own
    rules_from: str = "each"  # whose recorded rules judged each later run: its own or the first run's

    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys(r.device for r in self.runs))

    def measures(self) -> list[str]:
        """Measures that some run has (a counted-only sweep shows no timed columns); all if none has any."""
        shown = [m for m in MEASURES if any(getattr(c, m) is not None for cells in self.cells.values() for c in cells)]
        return shown or list(MEASURES)


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
    fit, traffic, verdict, memory = (_section(run, key, cache) for key in ("fit", "traffic", "verdict", "memory"))
    status = gate.status_of(verdict) if verdict else None
    return Cell(
        present=True,
        timed=finite(fit.get("passes")),
        timed_ci=interval(fit.get("passes_ci")),
        counted=finite((gate.counted_traffic(traffic) or {}).get("passes")),  # the judged figure: fused if compiled
        intercept_ms=finite(fit.get("intercept_ms")),
        r2=finite(fit.get("r2")),
        ops=traffic.get("ops_per_step") if isinstance(traffic.get("ops_per_step"), int) else None,
        weight_passes=finite(traffic.get("weight_passes")),
        memory=finite(memory.get("held_passes")), peak=finite(memory.get("peak_passes")),
        verdict=None if status is None else str(status),
    )


def _labels(runs: Sequence[Run]) -> list[str]:
    return tables.unique_labels([run.label for run in runs], [run.path for run in runs])


def _with_min_r2(kv: dict[str, Any], min_r2: float | None) -> dict[str, Any]:
    if min_r2 is None:
        return kv
    return {**kv, "settings": {**(kv.get("settings") or {}), "min_r2": min_r2}}


def baseline_of(run: Run, *, min_r2: float | None = None) -> dict[str, dict[str, Any]]:
    """A run as a baseline, ``{measure: {cache: entry}}``: what recording it would keep (same rules; ``min_r2``, when
    given, in place of the run's own)."""
    entries, _ = baselines.entries_of_run(_with_min_r2(run.kv, min_r2), run.datetime)
    ident = identity.of_run(run.kv)
    return {m: entries.get(identity.key(ident, m), {}) for m in identity.MEASURE_FIELDS}


def rules_of(run: Run, **override: Any) -> gate.Rules:
    """The rules ``run``'s gate judged it with (:meth:`gate.Rules.from_settings` of its ``kv.settings``), each rule in
    ``override`` in place of the run's; RecordError naming the file and the value when its settings cannot judge
    (a NaN ``min_r2`` would let any fit through)."""
    try:
        return gate.Rules.from_settings(run.kv.get("settings") or {}, **override)
    except (TypeError, ValueError) as exc:
        raise RecordError(f"{run.path}: kv.settings cannot judge: {exc}") from None


def judge_against(run: Run, base: Run, rules: gate.Rules, *, base_min_r2: float | None = None) -> \
        dict[str, dict[str, Any]]:
    """``run``'s verdicts with ``base`` as its baseline: the session-end gate's judge, by ``rules`` (those ``run``
    was judged with, :func:`rules_of`); ``base`` is a baseline by the rules of recording it (its own ``min_r2``,
    as when it was recorded, unless ``base_min_r2`` is given)."""
    keys = {m: f"the first run ({Path(base.path).name})" for m in identity.MEASURE_FIELDS}
    base_entries = baseline_of(base, min_r2=base_min_r2)
    torches = [identity.of_run(r.kv).get("torch") for r in (base, run)]
    if torches[0] != torches[1]:
        base_entries["overhead"] = {}
        keys["overhead"] = (f"the first run ({Path(base.path).name}) on torch {torches[0]}: op counts are compared "
                            f"on one torch release only, this run has {torches[1]}")
        base_entries["memory"] = {}
        keys["memory"] = (f"the first run ({Path(base.path).name}) on torch {torches[0]}: memory is compared on one "
                          f"torch release only, this run has {torches[1]}")
    verdicts = gate.judge_run(run.kv, base_entries, rules, keys)
    base_kv = _with_min_r2(base.kv, base_min_r2)
    for cache, measures in verdicts.items():
        problem = baselines.timed_problem(base_kv, cache) if cache in (base.kv.get("fit") or {}) else None
        if problem and measures["timed"]["status"] == "no-baseline":
            measures["timed"]["reason"] = f"the first run's timed passes are no baseline: {problem}"
    return verdicts


#: Whose recorded rules judge each later run: its own (``each``) or the first run's (``first``).
RULES_FROM = ("each", "first")


def compare(runs: Sequence[Run], tolerance: float | None = None, counted_tolerance: float | None = None, *,
            ops_tolerance: float | None = None, weight_passes_tolerance: float | None = None,
            ledger_tolerance: float | None = None, min_r2: float | None = None,
            memory_tolerance: float | None = None, rules_from: str = "each",
            require_classes: bool = False) -> Comparison:
    """Compare every run against ``runs[0]`` with the gate's judge (see the module docstring): each later run by
    the rules it was judged with (its settings; ``rules_from="first"``: by the first run's, so that a later run
    cannot loosen its own judge, as a pull request's head could), a rule given here (not None) in place of every
    run's own. ``require_classes``: every class with counted passes in the first run must have counted passes in
    each later run; one that has none (skipped, unsupported, not run) is a regression of its counted passes
    (:func:`missing_classes`). RecordError when a run's settings cannot judge."""
    if not runs:
        raise ValueError("compare needs at least one run")
    given = {"tolerance": tolerance, "counted_tolerance": counted_tolerance, "ops_tolerance": ops_tolerance,
             "weight_passes_tolerance": weight_passes_tolerance, "ledger_tolerance": ledger_tolerance,
             "min_r2": min_r2, "memory_tolerance": memory_tolerance}
    override = {name: value for name, value in given.items() if value is not None}
    if rules_from not in RULES_FROM:
        raise ValueError(f"rules_from {rules_from!r} is not one of {', '.join(RULES_FROM)}")
    all_rules = [rules_of(runs[0] if rules_from == "first" else run, **override) for run in runs[1:]]
    infos = [RunInfo(r.path, r.transformers, r.device, label, _setup(r)) for r, label in zip(runs, _labels(runs))]
    seen: dict[str, None] = {}
    for run in runs:
        for cache in run.caches():
            seen.setdefault(cache)
        for entry in _skipped(run):
            if entry.get("context") is None:
                seen.setdefault(str(entry["cache"]))
    caches = list(seen)
    comparison = Comparison(infos, caches, {}, [], all_rules, variables=variables_that_differ(runs),
                            overridden=tuple(override), rules_from=rules_from)
    judged = [judge_against(run, runs[0], rules, base_min_r2=min_r2) for run, rules in zip(runs[1:], all_rules)]
    for cache in caches:
        base = _cell(runs[0], cache)
        row = [base]
        for info, verdicts, run, rules in zip(infos[1:], judged, runs[1:], all_rules):
            cell, regressions = _against(_cell(run, cache), base, cache, info.label, verdicts.get(cache), rules)
            row.append(cell)
            comparison.regressions += regressions
        comparison.cells[cache] = row
    if require_classes:
        comparison.regressions += missing_classes(comparison)
    comparison.ledger = ledger_rows(runs, judged)
    return comparison


def missing_classes(comparison: Comparison) -> list[Regression]:
    """A regression of counted passes for every class that has counted passes in the first run and none in a later
    one, named with the later run's reason (its skip reason, or why its counted passes are missing): a pull
    request whose head skips a class, or whose class now raises Unsupported, is no clean pass."""
    out = []
    for cache in comparison.caches:
        first, *later = comparison.cells[cache]
        if first.counted is None:
            continue
        for info, cell in zip(comparison.runs[1:], later):
            if cell.present and cell.counted is not None:
                continue
            if not cell.present:
                why = f"skipped: {cell.reason}" if cell.reason else "not in this run (no skip reason recorded)"
            else:
                counted = (cell.judged or {}).get("counted") or {}
                why = f"no counted passes: {counted.get('reason') or 'not measured'}"
            out.append(Regression(cache, info.label, JUDGED["counted"],
                                  f"the class is required (it has {first.counted:.2f} counted passes in the first "
                                  f"run) and this run has none: {why}"))
    return out


def variables_that_differ(runs: Sequence[Run]) -> dict[str, list[str | None]]:
    """{NAME: value per run (None: not set)} of the environment variables the runs recorded
    (``kv.environment.variables``, those known to change what runs) on which they differ."""
    recorded = [(run.kv.get("environment") or {}).get("variables") for run in runs]
    recorded = [r if isinstance(r, dict) else {} for r in recorded]
    names = dict.fromkeys(str(name) for r in recorded for name in r)
    out = {}
    for name in names:
        values = [None if r.get(name) is None else str(r.get(name)) for r in recorded]
        if len(set(values)) > 1:
            out[name] = values
    return out


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
    if cell.memory is not None and base.memory is not None:
        status = verdicts.get("memory", {}).get("status")
        improved = cell.memory < base.memory - rules.memory_tolerance
        change = CHANGE_OF.get(status) or (IMPROVED if improved else SAME)
        changes.update(memory_change=change if status != "no-baseline" else "", memory_delta=cell.memory - base.memory)
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
        elif measure == "memory":
            held = num(cell.memory, missing=DASH) + (f"/{num(cell.peak)}" if cell.peak is not None else "")
            texts.append(_marked(held, cell.memory_change, cell.memory_delta))
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
    preamble = [escape_markdown(line) for line in _preamble(comparison)]
    lines = ["### KV-cache passes across runs", "", *preamble, "", *tables.markdown(table(comparison))]
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
    own = "(default: each run's own --kv-* setting, as its gate judged it)"
    parser.add_argument("--tolerance", type=float, help=f"timed passes, intercept: allowed relative increase {own}")
    parser.add_argument("--counted-tolerance", type=float, help=f"counted passes: allowed absolute increase {own}")
    parser.add_argument("--memory-tolerance", type=float,
                        help=f"counted memory (allocated, peak, held passes): allowed absolute increase {own}")
    parser.add_argument("--ops-tolerance", type=float, help=f"ATen ops per step: allowed increase per layer {own}")
    parser.add_argument("--weight-passes-tolerance", type=float,
                        help=f"weight passes per step: allowed absolute increase {own}")
    parser.add_argument("--ledger-tolerance", type=float,
                        help=f"per-op ledger: timed passes an op may rise by besides --tolerance {own}")
    parser.add_argument("--min-r2", type=float, help=f"the R² a timed fit needs to be judged, from 0 to 1 {own}")
    parser.add_argument("--rules", choices=RULES_FROM, default="each",
                        help="whose recorded --kv-* rules judge each later run: its own (each, the default) or the "
                        "first run's (first: a pull request's head cannot loosen its own gate)")
    parser.add_argument("--require-classes", action="store_true",
                        help="every class with counted passes in the first run must have counted passes in each "
                        "later run: one skipped, unsupported or not run there is a regression (a pull request's "
                        "head cannot drop a class from its own gate)")
    parser.add_argument(
        "--allow-mismatch", "--allow-device-mismatch", dest="allow_mismatch", action="store_true",
        help="compare runs whose identity differs (device, model, dtype, threads) anyway",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments.parse(_parser(), argv)
    if isinstance(args, int):  # --help (0) or a usage error (2)
        return args
    options = {name: getattr(args, name) for name in ("tolerance", "counted_tolerance", "ops_tolerance",
                                                        "weight_passes_tolerance", "ledger_tolerance", "min_r2",
                                                        "memory_tolerance")}
    try:
        gate.Rules(**{name: value for name, value in options.items() if value is not None})
    except ValueError as exc:
        print(f"kvcache compare: --{str(exc).replace('_', '-')}", file=sys.stderr)
        return 2
    runs = []
    for path in args.runs:
        try:
            runs.extend(load_runs(path))  # an A/B run (kvcache ab --json) is its two sides
        except RecordError as exc:
            print(f"kvcache compare: {exc}", file=sys.stderr)
            return 2
    problem = mismatch(runs)
    if problem and not args.allow_mismatch:
        print(f"kvcache compare: refusing to compare runs that differ in {problem}; pass --allow-mismatch to "
              "compare anyway", file=sys.stderr)
        return 2
    try:
        comparison = compare(runs, **options, rules_from=args.rules, require_classes=args.require_classes)
    except RecordError as exc:  # a run's own settings cannot judge
        print(f"kvcache compare: {exc}", file=sys.stderr)
        return 2
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
