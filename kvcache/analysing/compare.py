"""The comparison behind ``kvcache compare`` (:mod:`kvcache.commands.compare`): runs side by side, every later run
judged against the first by the session-end gate's own judge, as if the first had been recorded as the baseline,
by the rules each run's own gate judged it with (a rule given replaces that rule for every run). What is judged
and how: docs/reports.md ("kvcache compare"). No torch here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvcache.analysing import tables
from kvcache.analysing.estimates import finite, interval
from kvcache.analysing.judge import baseline as baselines
from kvcache.analysing.judge import gate, measure_table
from kvcache.analysing.judge.entries import BaselineEntry
from kvcache.analysing.judge.gate import skip_reason  # why a class did not run; bisect's search takes it from here too
from kvcache.analysing.judge.measure_table import GROUPS, VERDICT_LABELS
from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.options import RULE_DEFAULTS, option
from kvcache.analysing.records import KV, Part, RecordError, Run, Verdict, identity

# Changes against the baseline.
SAME, REGRESSED, IMPROVED, INCONCLUSIVE = "same", "regressed", "improved", "inconclusive"
#: The change a judge's status makes (other statuses: same, or improved where the figure fell beyond tolerance).
CHANGE_OF = {"regression": REGRESSED, "inconclusive": INCONCLUSIVE}
#: Whose recorded rules judge each later run: its own (``each``) or the first run's (``first``).
RULES_FROM = ("each", "first")


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

    ``figures``: the value of every compared measure (:func:`kvcache.analysing.judge.measure_table.selected`,
    ``compared``) by its name, a per-key one as ``{key: value}`` (``gpu``: counted passes per GPU class); ``intervals``
    their bootstrap
    intervals; ``verdict`` the run's own gate status of the class. ``changes`` are SAME/REGRESSED/IMPROVED/
    INCONCLUSIVE against the baseline by measure (none where there is nothing to compare: the baseline itself, or a
    value missing on either side); ``deltas`` the differences, in each figure's unit; ``memory_figure`` which memory
    figure the held column's Δ is of; ``judged`` the judge's verdicts of the class against the first run."""

    present: bool
    figures: dict[str, Any] = field(default_factory=dict)
    intervals: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    verdict: str | None = None
    reason: str | None = None
    changes: dict[str, str] = field(default_factory=dict)
    deltas: dict[str, float | None] = field(default_factory=dict)
    memory_figure: str = ""
    judged: dict[str, Verdict] | None = None

    @property
    def counted(self) -> float | None:
        return self.figures.get("counted")

    @property
    def timed(self) -> float | None:
        return self.figures.get("timed")

    @property
    def gpus(self) -> dict[str, float | None] | None:
        return self.figures.get("gpu")


@dataclass(frozen=True)
class LedgerCell:
    """One op of one run's per-op timed ledger: timed passes, their interval, and the change the ledger verdict
    against the first run gives that op ("" for the first run, or where the op is not judged)."""

    timed: float | None
    timed_ci: tuple[float, float] | None
    change: str = ""


@dataclass(frozen=True)
class Regression:
    """A measure of one cache class in one run beyond what the baseline allows."""

    cache: str
    run: str
    measure: str
    reason: str
    status: str = "regression"  # or, under --strict, the verdict's status (inconclusive, not-measured, drift)

    def line(self) -> str:
        return f"{self.status}: {self.cache} in {self.run}: {self.measure}: {self.reason}"


@dataclass
class Comparison:
    """Plain result of :func:`compare`: ``cells[cache][i]`` is the class in ``runs[i]``; ``runs[0]`` is the baseline."""

    runs: list[RunInfo]
    caches: list[str]
    cells: dict[str, list[Cell]]
    regressions: list[Regression] = field(default_factory=list)
    rules: list[Rules] = field(default_factory=list)  # rules[i - 1]: what runs[i] is judged by
    ledger: dict[tuple[str, str], list[LedgerCell | None]] = field(default_factory=dict)  # (cache, op): per run
    variables: dict[str, list[str | None]] = field(default_factory=dict)  # differing env variables: value per run
    overridden: tuple[str, ...] = ()  # the rules given, in place of each run's own
    rules_from: str = "each"  # whose recorded rules judged each later run: its own or the first run's
    strict: bool = False  # --strict: what --kv-strict fails in the suite fails here too (strict_failures)
    strict_failures: list[Regression] = field(default_factory=list)  # status "inconclusive (--strict)", ...

    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys(r.device for r in self.runs))


# --- one run --------------------------------------------------------------------------------------------------


def cell_of(run: Run, cache: str) -> Cell:
    """The figures of ``cache`` in ``run`` (no changes yet: :func:`_against` adds them)."""
    kv = run.record
    if cache not in run.caches():
        return Cell(present=False, reason=skip_reason(kv, cache))
    figures: dict[str, Any] = {}
    intervals: dict[str, tuple[float, float] | None] = {}
    compared = measure_table.selected("compared")
    shown_with = {m.verdict for m in compared if m.verdict}  # a column may show its verdict's other figures
    for m in (m for m in measure_table.MEASURES if m in compared or (m.verdict in shown_with and not m.per_key)):
        if m.per_key:
            keys = measure_table.keys_of(kv, m, cache)
            figures[m.name] = {k: measure_table.value_of(kv, m, cache, k) for k in keys} if keys else None
            continue
        figures[m.name] = measure_table.value_of(kv, m, cache)
        if m.interval:
            record = measure_table.record_of(kv, m, cache)
            intervals[m.name] = interval(getattr(record, m.interval, None)) if figures[m.name] is not None else None
    verdicts = kv.verdict.get(cache)
    return Cell(present=True, figures=figures, intervals=intervals,
                verdict=str(gate.status_of(verdicts)) if verdicts else None)


def _labels(runs: Sequence[Run]) -> list[str]:
    return tables.unique_labels([run.label for run in runs], [run.path for run in runs])


def _setup(run: Run) -> str:
    ident = identity.of_run(run.record)
    return f"{ident.model}, {ident.dtype}"


def _with_min_r2(kv: KV, min_r2: float | None) -> KV:
    return kv if min_r2 is None else replace(kv, settings=replace(kv.settings, min_r2=min_r2))


def baseline_of(run: Run, *, min_r2: float | None = None) -> dict[str, dict[str, BaselineEntry]]:
    """A run as a baseline, ``{measure: {cache: entry}}``: what recording it would keep, read back as the gate reads
    a baseline file (same rules; ``min_r2``, when given, in place of the run's own)."""
    entries, _ = baselines.entries_of_run(_with_min_r2(run.record, min_r2), run.datetime)
    as_file = baselines.BaselineFile.from_json({"devices": entries}, f"{run.path} as a baseline")
    recorded, _ = baselines.for_run(as_file, identity.of_run(run.record))
    return recorded


def rules_of(run: Run, **override: Any) -> Rules:
    """The rules ``run``'s gate judged it with (:meth:`Rules.from_settings` of its ``kv.settings``), each rule in
    ``override`` in place of the run's; RecordError naming the file and the value when its settings cannot judge
    (a NaN ``min_r2`` would let any fit through)."""
    try:
        return Rules.from_settings(run.record.settings, **override)
    except (TypeError, ValueError) as exc:
        raise RecordError(f"{run.path}: kv.settings cannot judge: {exc}") from None


def judge_against(run: Run, base: Run, rules: Rules, *, base_min_r2: float | None = None) -> \
        dict[str, dict[str, Verdict]]:
    """``run``'s verdicts ``{cache: {measure: Verdict}}`` with ``base`` as its baseline: the session-end gate's
    judge, by ``rules`` (those ``run`` was judged with, :func:`rules_of`); ``base`` is a baseline by the rules of
    recording it (its own ``min_r2``, as when it was recorded, unless ``base_min_r2`` is given)."""
    first = f"the first run ({Path(base.path).name})"
    keys = dict.fromkeys(GROUPS, first)
    base_entries = baseline_of(base, min_r2=base_min_r2)
    torches = [identity.of_run(r.record).torch for r in (base, run)]
    if torches[0] != torches[1]:
        for measure, what in (("overhead", "op counts are"), ("memory", "memory is")):
            base_entries[measure] = {}
            keys[measure] = (f"{first} on torch {torches[0]}: {what} compared on one torch release only, this run "
                             f"has {torches[1]}")
    verdicts = gate.judge_run(run.record, base_entries, rules, keys)
    base_kv = _with_min_r2(base.record, base_min_r2)
    for cache, by_verdict in verdicts.items():
        if cache not in base_kv.fit or by_verdict["timed"].status != "no-baseline":
            continue
        problem = baselines.timed_problem(base_kv, cache)
        if problem:
            by_verdict["timed"].reason = f"the first run's timed passes are no baseline: {problem}"
    return verdicts


# --- the comparison --------------------------------------------------------------------------------------------


def compare(runs: Sequence[Run], *, rules_from: str = "each", require_classes: bool = False, strict: bool = False,
            **rules: float | None) -> Comparison:
    """Compare every run against ``runs[0]`` with the gate's judge (see the module docstring): each later run by
    the rules it was judged with (its settings; ``rules_from="first"``: by the first run's, so that a later run
    cannot loosen its own judge, as a pull request's head could). ``rules``: any of the judge's tolerance-like rules
    (:data:`kvcache.analysing.options.RULE_DEFAULTS`: ``tolerance``, ``counted_tolerance``, ``min_r2``, ...); one
    given (not None) replaces every run's own. ``require_classes``: every class with counted passes in the first run
    must have counted passes in each later run; one that has none (skipped, unsupported, not run) is a regression
    of its counted passes (:func:`missing_classes`), and so is each GPU class the first run has counted passes for
    and a later one lacks (:func:`missing_gpu_figures`). ``strict``: what ``--kv-strict`` fails in the suite fails
    here (:func:`strict_failures`); no run's recorded one applies. RecordError when a run's settings cannot judge."""
    if not runs:
        raise ValueError("compare needs at least one run")
    unknown = sorted(set(rules) - set(RULE_DEFAULTS))
    if unknown:
        raise TypeError(f"compare() got rules it does not know: {', '.join(unknown)}")
    if rules_from not in RULES_FROM:
        raise ValueError(f"rules_from {rules_from!r} is not one of {', '.join(RULES_FROM)}")
    override = {name: rules[name] for name in RULE_DEFAULTS if rules.get(name) is not None}
    all_rules = [rules_of(runs[0] if rules_from == "first" else run, **override, strict=strict) for run in runs[1:]]
    infos = [RunInfo(r.path, r.transformers, r.device, label, _setup(r)) for r, label in zip(runs, _labels(runs))]
    seen: dict[str, None] = {}
    for run in runs:
        seen.update(dict.fromkeys(run.caches()))
        seen.update(dict.fromkeys(str(s.cache) for s in run.record.skipped if s.context is None))
    comparison = Comparison(infos, list(seen), {}, [], all_rules, variables=variables_that_differ(runs),
                            overridden=tuple(override), rules_from=rules_from, strict=strict)
    judged = [judge_against(run, runs[0], rules, base_min_r2=override.get("min_r2"))
              for run, rules in zip(runs[1:], all_rules)]
    for cache in comparison.caches:
        base = cell_of(runs[0], cache)
        row = [base]
        for info, verdicts, run, rules in zip(infos[1:], judged, runs[1:], all_rules):
            cell, regressions = _against(cell_of(run, cache), base, cache, info.label, verdicts.get(cache), rules)
            row.append(cell)
            comparison.regressions += regressions
        comparison.cells[cache] = row
    if require_classes:
        comparison.regressions += missing_classes(comparison) + missing_gpu_figures(comparison)
    if strict:
        comparison.strict_failures = strict_failures(infos[1:], runs[1:], judged)
    comparison.ledger = ledger_cells(runs, judged)
    return comparison


def strict_failures(infos: Sequence[RunInfo], runs: Sequence[Run], judged: list[dict[str, dict[str, Verdict]]]) -> \
        list[Regression]:
    """``--strict``: what ``--kv-strict`` fails of each later run against the first (``gate.strict_failure``: an
    inconclusive timed verdict, a class skipped where the first run has figures; ``gate.strict_drift``)."""
    out = []
    for info, run, verdicts in zip(infos, runs, judged):
        found = [Regression(cache, info.label, VERDICT_LABELS.get(m, m), v.reason, f"{v.status} (--strict)")
                 for cache, by_measure in verdicts.items() for m, v in by_measure.items()
                 if v.status != "regression" and gate.strict_failure(m, v)]
        problem = gate.strict_drift([r.reason for r in found], run.record.drift)
        if problem:
            found.append(Regression("every class", info.label, "drift", problem, "drift (--strict)"))
        out += found
    return out


def _change(verdict: Verdict | None, improved: bool) -> str:
    """The change a verdict gives a figure: the judge's regression or inconclusive, else improved (shown only,
    never judged) or same."""
    status = verdict.status if verdict is not None else ""
    return CHANGE_OF.get(status) or (IMPROVED if improved else SAME)


def _against(cell: Cell, base: Cell, cache: str, label: str, verdicts: dict[str, Verdict] | None,
             rules: Rules) -> tuple[Cell, list[Regression]]:
    """``cell`` with its changes against ``base`` (from the judge's verdicts) and the regressions they make."""
    if not cell.present or not verdicts:
        return cell, []
    regressions = [Regression(cache, label, VERDICT_LABELS.get(m, m), v.reason) for m, v in verdicts.items()
                   if v.status == "regression"]
    changes: dict[str, str] = {}
    deltas: dict[str, float | None] = {}
    for m in measure_table.selected("compared"):
        now, then = cell.figures.get(m.name), base.figures.get(m.name)
        if m.per_key or finite(now) is None or finite(then) is None:
            continue
        deltas[m.name] = now - then
        if m.name == "timed":
            hi = (cell.intervals.get("timed") or (now, now))[1]
            changes["timed"] = _change(verdicts["timed"], hi < then / (1 + rules.tolerance))
        elif m.name == "intercept":
            changes["intercept"] = CHANGE_OF.get(verdicts["intercept"].status, "") if "intercept" in verdicts else ""
        elif m.exact and m.verdict in verdicts and m.verdict not in ("overhead", "memory"):
            improved, own = now < then - rules_tolerance(rules, m), part_status(verdicts[m.verdict], m.name)
            changes[m.name] = _change(verdicts[m.verdict] if own is None else Verdict(own, ""), improved)
        elif m.verdict in ("overhead", "memory") and m.name in ("ops", "held"):  # the column that leads the verdict
            verdict = verdicts.get(m.verdict)
            judged = verdict is not None and verdict.status != "no-baseline"
            improved = now < then - (rules.memory_tolerance if m.verdict == "memory" else 0)
            changes[m.name] = _change(_without_syncs(verdict), improved) if judged else ""
        elif m.name == "syncs":  # host syncs per step: a part of the overhead verdict, judged where the base has it
            status = part_status(verdicts.get("overhead"), "host_syncs_per_step")
            changes[m.name] = "" if status is None else CHANGE_OF.get(status) or (IMPROVED if now < then else SAME)
    memory_figure = ""
    if "held" in deltas:
        memory_figure, deltas["held"] = memory_moved(cell, base, changes.get("held", ""))
    return replace(cell, changes=changes, deltas=deltas, memory_figure=memory_figure, judged=verdicts), regressions


def _without_syncs(verdict: Verdict | None) -> Verdict | None:
    """The overhead verdict as the ops column shows it: host syncs per step have a column of their own, so a
    regression of that part alone is not the ops column's."""
    parts = verdict.parts if verdict is not None else None
    if not parts or "host_syncs_per_step" not in parts or verdict.status != "regression":
        return verdict
    if any(p.status == "regression" for name, p in parts.items() if name != "host_syncs_per_step"):
        return verdict
    return replace(verdict, status="pass")


def rules_tolerance(rules: Rules, measure: measure_table.Measure) -> float:
    """The tolerance ``rules`` give ``measure`` (its option's rule)."""
    setting = option(measure.tolerance).setting if measure.tolerance else ""
    return float(getattr(rules, setting, 0.0) or 0.0)


def memory_moved(cell: Cell, base: Cell, change: str) -> tuple[str, float]:
    """Which counted memory figure the memory column's Δ is of, and that Δ (passes): of a regression, the figure
    (allocated, peak, held) that grew most; of an improvement, the one that fell most; else held, the figure the
    column leads with. The judge checks all three, so the Δ shown is that of the figure that moved."""
    deltas = {name: cell.figures[name] - base.figures[name] for name in ("held", "peak", "allocated")
              if finite(cell.figures.get(name)) is not None and finite(base.figures.get(name)) is not None}
    if change == REGRESSED:
        figure = max(deltas, key=deltas.__getitem__)
    elif change == IMPROVED:
        figure = min(deltas, key=deltas.__getitem__)
    else:
        figure = "held"
    return figure, deltas[figure]


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
            counted = cell.judged["counted"] if cell.judged and "counted" in cell.judged else None
            if counted is not None and counted.status == "regression":  # not a number: the judge failed it already
                continue
            if not cell.present:
                why = f"skipped: {cell.reason}" if cell.reason else "not in this run (no skip reason recorded)"
            else:
                why = f"no counted passes: {(counted.reason if counted else '') or 'not measured'}"
            out.append(Regression(cache, info.label, VERDICT_LABELS["counted"],
                                  f"the class is required (it has {first.counted:.2f} counted passes in the first "
                                  f"run) and this run has none: {why}"))
    return out


def missing_gpu_figures(comparison: Comparison) -> list[Regression]:
    """A regression of counted passes per GPU class for every GPU class a class has a figure for in the first run
    (``kv.traffic.<cache>.gpus``, --kv-gpus) and none in a later run that has the class (the GPU class not predicted,
    its figure null or left out): a pull request's head cannot drop a GPU class from its own gate any more than a
    class. The head's ``gpus`` verdict is marked too (its part a regression), so that the tables show it. A figure
    that is there but not a number is failed by the judge itself; a class the later run lacks, by
    :func:`missing_classes`."""
    out = []
    for cache in comparison.caches:
        first, *later = comparison.cells[cache]
        base = {gpu: passes for gpu, passes in (first.gpus or {}).items() if passes is not None}
        for info, cell in zip(comparison.runs[1:], later):
            if not base or not cell.present or cell.counted is None:
                continue
            verdict = (cell.judged or {}).get("gpus")
            lost = [gpu for gpu in base if (cell.gpus or {}).get(gpu) is None and not (
                verdict is not None and part_status(verdict, gpu) == "regression")]
            for gpu in lost:
                part = verdict.parts.get(gpu) if verdict is not None and verdict.parts else None
                why = (part.reason if part is not None and part.reason else None) or (
                    "not predicted" if cell.gpus and gpu in cell.gpus else "not in this run")
                reason = (f"{gpu}: the GPU class is required (it has {base[gpu]:.2f} counted passes in the first run) "
                          f"and this run has none: {why}")
                out.append(Regression(cache, info.label, VERDICT_LABELS["gpus"], reason))
                if verdict is not None:
                    was = verdict.reason if verdict.status != "pass" else ""
                    verdict.status = "regression"
                    verdict.parts = {**(verdict.parts or {}), gpu: Part("regression", reason=reason)}
                    verdict.reason = "; ".join(r for r in (reason, was) if r)
    return out


def variables_that_differ(runs: Sequence[Run]) -> dict[str, list[str | None]]:
    """{NAME: value per run (None: not set)} of the environment variables the runs recorded
    (``kv.environment.variables``, those known to change what runs) on which they differ."""
    recorded = [run.record.environment.variables for run in runs]
    out = {}
    for name in dict.fromkeys(str(name) for r in recorded for name in r):
        values = [None if r.get(name) is None else str(r[name]) for r in recorded]
        if len(set(values)) > 1:
            out[name] = values
    return out


def part_status(verdict: Verdict | None, part: str) -> str | None:
    """The status of one part of a verdict (an op of the ledger; weight passes of the overhead; a memory figure),
    None when the verdict has no such part."""
    if verdict is None or not verdict.parts or part not in verdict.parts:
        return None
    return verdict.parts[part].status


def ledger_cells(runs: Sequence[Run], judged: list[dict[str, dict[str, Verdict]]]) -> \
        dict[tuple[str, str], list[LedgerCell | None]]:
    """(cache, op) -> each run's ledger figure for that op (None where the run has no such row), with the change
    the op's part of the ledger verdict against the first run gives it."""
    out: dict[tuple[str, str], list[LedgerCell | None]] = {}
    for i, run in enumerate(runs):
        for cache, rows in run.record.ledger.items():
            verdicts = judged[i - 1].get(cache) if i else None
            ledger = verdicts.get("ledger") if verdicts else None
            for op, row in rows.items():
                change = CHANGE_OF.get(part_status(ledger, op) or "", "")
                out.setdefault((cache, op), [None] * len(runs))[i] = LedgerCell(finite(row.timed),
                                                                                interval(row.timed_ci), change)
    return out


def mismatch(runs: Sequence[Run]) -> str | None:
    """The identity fields (of the measures the runs carry) on which they differ, named with each run's
    value; None when they are comparable."""
    kvs = [run.record for run in runs]
    measures = [m for m, has in (("counted", any(kv.traffic for kv in kvs)), ("timed", any(kv.fit for kv in kvs)))
                if has]
    differing = identity.mismatches([identity.of_run(kv) for kv in kvs], measures or ["counted"])
    if not differing:
        return None
    def named(name: str, values: list[Any]) -> str:
        return ", ".join(f"{Path(r.path).name}: {identity.field_text(name, v)}" for r, v in zip(runs, values))

    return "; ".join(f"{name} ({named(name, values)})" for name, values in differing.items())
