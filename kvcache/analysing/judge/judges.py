"""The judge of each measure of one class: its figure (a record of the run's ``kv`` section) against its baseline
entry (a :class:`~kvcache.analysing.judge.entries.BaselineEntry`) by :class:`~kvcache.analysing.judge.rules.Rules`, as a
:class:`~kvcache.analysing.records.Verdict`. The rules themselves are listed in :mod:`kvcache.analysing.judge.gate`,
which calls these for every class of a run. Stdlib only."""

from __future__ import annotations

import math
from typing import Union

from kvcache.analysing import tables
from kvcache.analysing.estimates import finite
from kvcache.analysing.judge.entries import BaselineEntry
from kvcache.analysing.judge.measure_table import of_verdict
from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.options import MIN_OP_PASSES, RULE_DEFAULTS
from kvcache.analysing.records import (
    Counted,
    Drift,
    Fit,
    FitFailure,
    LedgerRow,
    Memory,
    Part,
    RunSettings,
    Traffic,
    UnmeasuredDrift,
    Verdict,
)

STATUSES = ("pass", "regression", "inconclusive", "no-baseline", "not-measured")
# Higher wins when the measures of a class are shown as one status.
PRIORITY = {"not-measured": 0, "no-baseline": 1, "pass": 2, "inconclusive": 3, "regression": 4}
# Counted passes are ratios of byte counts; a rounding error must not turn "equal" into a regression.
COUNTED_RELATIVE_SLACK = 1e-9
# The whole step, profiled or plain: judged as timed passes already (and not an op).
LEDGER_UNJUDGED = ("(profiled step)", "(plain step)")
COUNTED_MATCH = 0.01  # counted passes within this make a renamed op the same op

DriftRecord = Union[Drift, UnmeasuredDrift, None]  # typing.Union: this alias is evaluated, on Python 3.9 too


def fmt(value: float | None) -> str:
    """Passes for a message: three significant digits, '?' when unknown."""
    return "?" if value is None else f"{value:.3g}"


def fmt_figure(value: float) -> str:
    """A whole number as such (ops), otherwise three decimals (weight passes)."""
    return f"{value:g}" if float(value).is_integer() else f"{value:.3f}"


def allowed_passes(baseline_passes: float | None, tolerance: float, max_passes: float | None, *,
                   relative: bool) -> float | None:
    """The tighter of the baseline plus tolerance and ``max_passes``; None when neither is given.

    ``relative``: baseline × (1 + tolerance) (timed passes); otherwise baseline + tolerance passes
    (counted passes, an exact measure).
    """
    limits = []
    if baseline_passes is not None:
        limits.append(baseline_passes * (1 + tolerance) if relative else baseline_passes + tolerance)
    if max_passes is not None:
        limits.append(max_passes)
    return min(limits) if limits else None


def no_baseline_reason(key: str, *, bounded: bool = True) -> str:
    """Why there is nothing to judge against; ``bounded``: the measure also takes ``--kv-max-passes``."""
    bound = " or pass --kv-max-passes cache=number" if bounded else ""
    return f"no baseline for {key!r}; record one with --kv-update-baseline{bound}"


def poor_fit(r2: object, min_r2: float) -> str | None:
    """Why a timed fit's figures (passes, intercept) are not to be quoted, with a baseline or without: its R² below
    ``min_r2`` (``--kv-min-r2``), or no R² at all; None for a fit good enough."""
    value = finite(r2)
    if value is not None and value >= min_r2:
        return None
    return f"poor fit: R² {fmt(value)} < {min_r2:.2f} (--kv-min-r2)"


def min_r2_of(settings: RunSettings) -> float:
    """The ``--kv-min-r2`` a run was judged by (its ``kv.settings``), the default where it recorded none usable."""
    value = finite(settings.min_r2)
    return value if value is not None and 0 <= value <= 1 else RULE_DEFAULTS["min_r2"]


def drift_problem(drift: DriftRecord) -> str | None:
    """Why the session's drift (or a speed shift against the baseline, :func:`kvcache.analysing.judge.gate.speed_shift`)
    makes timed figures unjudgeable, or None."""
    if not isinstance(drift, Drift) or drift.ok is not False:
        return None
    if drift.problem:
        return drift.problem
    fraction = "a change beyond measure" if drift.fraction is None else f"{drift.fraction:+.1%}"
    return (f"drift {fraction} of {drift.cache} at {drift.context} tokens is beyond the allowed "
            f"±{drift.max_fraction:.0%} (--kv-max-drift): the machine's speed changed during the session")


def ops_that_grew(by_op: dict[str, float] | None, base_by_op: dict[str, float] | None) -> dict[str, float]:
    """{op: rise in counted passes} of the ops whose passes rose against the baseline (new ops included)."""
    if not by_op or base_by_op is None:
        return {}
    grew = {op: value - base_by_op.get(op, 0.0) for op, value in by_op.items()}
    return {op: delta for op, delta in sorted(grew.items(), key=lambda kv: -kv[1]) if delta > MIN_OP_PASSES}


def calls_that_grew(calls: dict[str, int] | None, base_calls: dict[str, int] | None) -> str:
    """``"add +2, mul +1"``: the ops called more often than in the baseline ("" when unknown or none)."""
    if not calls or base_calls is None:
        return ""
    grew = {op: n - base_calls.get(op, 0) for op, n in calls.items() if n > base_calls.get(op, 0)}
    return ", ".join(f"{op} +{d}" for op, d in sorted(grew.items(), key=lambda kv: -kv[1]))


def judge_timed(fit: Fit | FitFailure | None, *, allowed: float | None, rules: Rules, drift: DriftRecord,
                key: str) -> Verdict:
    """Judge a class's timed passes (``kv.fit.<cache>``) by their interval; see :mod:`kvcache.analysing.judge.gate`."""
    return judge_interval(fit, "passes", "passes_ci", "timed passes", allowed=allowed, rules=rules, drift=drift,
                          key=key)


def judge_intercept(fit: Fit | FitFailure | None, *, allowed: float | None, rules: Rules, drift: DriftRecord,
                    key: str) -> Verdict:
    """Judge a class's timed intercept (``kv.fit.<cache>.intercept_ms``, ms per step with an empty cache) by
    its interval, the rules of timed passes."""
    return judge_interval(fit, "intercept_ms", "intercept_ci", "intercept ms", allowed=allowed, rules=rules,
                          drift=drift, key=key)


def judge_interval(fit: Fit | FitFailure | None, value_name: str, interval_name: str, label: str, *,
                   allowed: float | None, rules: Rules, drift: DriftRecord, key: str) -> Verdict:
    """Judge one figure of a timed fit (the field ``value_name``, its interval ``interval_name``) by its bootstrap
    interval: regression only when all of it is above ``allowed``, pass only when all of it is within; otherwise
    (poor fit, drift, no interval) inconclusive."""
    if fit is None:
        return Verdict("not-measured", f"{label} was not measured")
    drifted = drift_problem(drift)
    if isinstance(fit, FitFailure) or getattr(fit, value_name) is None:
        why = fit.error if isinstance(fit, FitFailure) else "no fit"
        return Verdict("inconclusive", f"no {label} figure: {why}" + (f"; {drifted}" if drifted else ""),
                       allowed=allowed)
    value, r2, ci = float(getattr(fit, value_name)), fit.r2, getattr(fit, interval_name)
    interval = [ci[0], ci[1]] if ci is not None and None not in ci else None
    verdict = Verdict("inconclusive", "", value=value, allowed=allowed, interval=interval)
    poor = poor_fit(r2, rules.min_r2)
    if allowed is None:
        verdict.status, verdict.reason = "no-baseline", no_baseline_reason(key, bounded=value_name == "passes")
        if drifted:
            verdict.reason += f" ({drifted})"
        if poor:  # nothing to judge against, and still a figure not to quote
            verdict.reason += f"; {poor}: not to be quoted"
        return verdict
    problems = [p for p in (
        poor,
        drifted,
        None if interval and all(math.isfinite(v) for v in interval) else f"no bootstrap interval for {label}",
    ) if p]
    if problems:
        verdict.reason = "; ".join(problems)
        return verdict
    lo, hi = interval
    described = f"{label} {fmt(value)} (interval [{fmt(lo)}, {fmt(hi)}])"
    if lo > allowed:
        verdict.status, verdict.reason = "regression", f"{described} is above the allowed {fmt(allowed)}"
    elif hi <= allowed:
        verdict.status, verdict.reason = "pass", f"{described} is within the allowed {fmt(allowed)}"
    else:
        width = (hi - lo) / abs(value) if value else math.inf
        verdict.reason = (f"interval [{fmt(lo)}, {fmt(hi)}] straddles the allowed {fmt(allowed)} (wide interval: "
                          f"{width:.0%} of the value); more rounds or steps would narrow it")
    return verdict


def judge_counted(counted: Counted | None, *, allowed: float | None, base_by_op: dict[str, float] | None,
                  key: str) -> Verdict:
    """Judge a class's counted passes (:meth:`~kvcache.analysing.records.counted.Traffic.counted`): regression
    when above ``allowed``, or when not a finite number (NaN, infinite, text: a counted figure is exact, so one that
    cannot be judged is no pass, and inconclusive would let it through: --kv-strict leaves exact measures alone); the
    verdict names the ops that grew when the baseline has a per-op breakdown."""
    if counted is None or counted.passes is None:
        if counted is not None and counted.why_missing:
            return Verdict("not-measured", counted.why_missing)
        return Verdict("not-measured", "counted passes were not measured")
    passes = counted.passes
    verdict = Verdict("pass", "", value=passes, allowed=allowed)
    if allowed is None:
        verdict.status, verdict.reason = "no-baseline", no_baseline_reason(key)
    elif finite(passes) is None:  # NaN, infinite, or not a number at all (a hand-edited run): never a pass
        verdict.status = "regression"
        verdict.reason = (f"counted passes is {passes!r}, not a finite number, where {fmt(allowed)} is allowed: an "
                          "exact figure that cannot be judged fails")
    elif passes > allowed * (1 + COUNTED_RELATIVE_SLACK):
        verdict.status = "regression"
        verdict.reason = f"counted passes {fmt(passes)} is above the allowed {fmt(allowed)}"
        if base_by_op is None:
            verdict.reason += f"; by op now: {tables.by_op(counted.by_op)}"
        else:
            verdict.grew = ops_that_grew(counted.by_op, base_by_op)
            grew = tables.by_op(verdict.grew, "+.2f") if verdict.grew else "none of its ops by itself"
            verdict.reason += f"; grew: {grew}"
    else:
        verdict.reason = f"counted passes {fmt(passes)} is within the allowed {fmt(allowed)}"
    return verdict


def judge_gpus(counted: dict[str, Counted], base: BaselineEntry | None, *, tolerance: float, key: str) -> Verdict:
    """Judge the counted passes each GPU class would move (``kv.traffic.<cache>.gpus``, --kv-gpus: the step under the
    SDPA backend torch's rules select there) like counted passes (:func:`judge_counted`), each against the baseline's
    figure for that class (``gpu_passes``, ``gpu_by_op``: the baseline is keyed by GPU class within the counted
    entry) + ``tolerance``; a class not predicted (attention that is not SDPA) is not-measured with its reason. The
    verdict is the worst of the classes (``parts``: one per class, passes against allowed), its reason the non-passing
    classes' reasons (the ops that grew among them)."""
    if not counted:
        return Verdict("not-measured", "no GPU class was predicted (--kv-gpus)")
    parts: dict[str, Part] = {}
    reasons: dict[str, list[str]] = {}  # reason -> the GPU classes it is given for
    for gpu, figure in counted.items():
        base_passes = (base.gpu_passes or {}).get(gpu) if base is not None else None
        base_by_op = (base.gpu_by_op or {}).get(gpu) if base is not None else None
        if figure.passes is None:
            verdict = Verdict("not-measured", figure.why_missing or "not predicted")
        else:
            verdict = judge_counted(figure, key=key, base_by_op=base_by_op,
                                    allowed=allowed_passes(base_passes, tolerance, None, relative=False))
            if verdict.status == "no-baseline":
                verdict.reason = (f"no baseline for {key!r} on this GPU class; record one with --kv-update-baseline "
                                  "--kv-gpus")
        parts[gpu] = Part(verdict.status, value=verdict.value, allowed=verdict.allowed,
                          reason=verdict.reason if verdict.status != "pass" else None)
        if verdict.status != "pass":
            reasons.setdefault(verdict.reason, []).append(gpu)
    statuses = [p.status for p in parts.values()]
    worst = max(statuses, key=lambda s: PRIORITY.get(s, 0))
    if worst == "not-measured" and "pass" in statuses:
        worst = "pass"
    reason = "; ".join(f"{', '.join(gpus)}: {why}" for why, gpus in reasons.items()) or (
        f"counted passes of {', '.join(parts)} within the allowed per GPU class")
    return Verdict(worst, reason, parts=parts)


def judge_overhead(traffic: Traffic | None, base: BaselineEntry | None, *, rules: Rules, key: str) -> Verdict:
    """Judge a class's counted overhead (``kv.traffic.<cache>``: ops per step, weight passes, host syncs per step)
    against its baseline entry (``ops_per_step``, ``weight_passes``, ``op_calls``, ``host_syncs_per_step``,
    ``host_sync_calls``): regression when ops per step rise by more than ``ops_tolerance`` × layers, weight passes
    by more than ``weight_passes_tolerance``, or host syncs per step at all (each one makes a GPU's host wait); the
    reason names the ops whose calls (syncs) grew. ``value``/``allowed`` are ops per step; ``parts`` has each."""
    if traffic is None or traffic.ops_per_step is None:
        return Verdict("not-measured", "counted overhead was not measured")
    ops, weight = traffic.ops_per_step, traffic.weight_passes
    if base is None or base.ops_per_step is None:
        return Verdict("no-baseline", f"no baseline for {key!r} (op counts are kept per torch release); record "
                       "one with --kv-update-baseline", value=ops)
    layers = traffic.layers or base.layers or 1
    allowed_ops = base.ops_per_step + rules.ops_tolerance * layers
    parts = {"ops_per_step": Part("pass", value=ops, allowed=allowed_ops)}
    if weight is not None and base.weight_passes is not None:
        parts["weight_passes"] = Part("pass", value=weight, allowed=base.weight_passes + rules.weight_passes_tolerance)
    syncs = traffic.host_syncs_per_step
    if syncs is not None and base.host_syncs_per_step is not None:
        parts["host_syncs_per_step"] = Part("pass", value=syncs, allowed=base.host_syncs_per_step)
    problems = []
    for name, part in parts.items():
        if part.value > part.allowed * (1 + COUNTED_RELATIVE_SLACK):
            part.status = "regression"
            problems.append(f"{name.replace('_', ' ')} {fmt_figure(part.value)} is above the allowed "
                            f"{fmt_figure(part.allowed)}")
    verdict = Verdict("regression" if problems else "pass", "", value=ops, allowed=allowed_ops, parts=parts)
    if problems:
        grew = calls_that_grew(traffic.calls, base.op_calls)
        synced = calls_that_grew(traffic.host_syncs, base.host_sync_calls) if "host_syncs_per_step" in parts else ""
        verdict.reason = "; ".join(problems) + (f"; calls grew: {grew}" if grew else "") + (
            f"; host syncs grew: {synced}" if synced else "")
    else:
        verdict.reason = (f"ops per step {ops} (allowed {fmt_figure(allowed_ops)}: {rules.ops_tolerance:g} per layer "
                          f"over {layers} layers)" + (f", weight passes {weight:.3f}" if weight is not None else "")
                          + (f", host syncs per step {syncs}" if "host_syncs_per_step" in parts else "")
                          + " within the baseline")
    return verdict


def judge_memory(memory: Memory | None, base: BaselineEntry | None, *, rules: Rules, key: str) -> Verdict:
    """Judge a class's counted memory (``kv.memory.<cache>``: allocated, peak and held passes, bytes per logical KV
    byte) against its baseline entry (``memory_*_passes``, ``memory_allocated_by_op``): regression when any figure
    rises by more than ``memory_tolerance``; ``value``/``allowed`` are held passes, ``parts`` has all three; the
    reason names the ops that allocate more, and a declared ``memory_factor`` the measured peak exceeds."""
    if memory is None or memory.held_passes is None:
        return Verdict("not-measured", "counted memory was not measured")
    note = f"; {memory.factor_problem}" if memory.factor_problem else ""
    held = memory.held_passes
    if base is None or base.memory_held_passes is None:
        return Verdict("no-baseline", f"no baseline for {key!r} (memory is kept per torch release); record one with "
                       f"--kv-update-baseline{note}", value=held)
    parts: dict[str, Part] = {}
    problems = []
    for measure in of_verdict("memory"):
        name = measure.field
        value, reference = getattr(memory, name), getattr(base, measure.baseline)
        if value is None or reference is None:
            continue
        allowed = reference + rules.memory_tolerance
        over = finite(value) is None or value > allowed + abs(allowed) * COUNTED_RELATIVE_SLACK
        parts[name] = Part("regression" if over else "pass", value=value, allowed=allowed)
        if over:
            problems.append(f"{name.replace('_', ' ')} {fmt_figure(round(value, 4))} is above the allowed "
                            f"{fmt_figure(round(allowed, 4))}")
    allowed_held = parts["held_passes"].allowed if "held_passes" in parts else None
    verdict = Verdict("regression" if problems else "pass", "", value=held, allowed=allowed_held, parts=parts)
    if problems:
        grew = ops_that_grew(memory.allocated_by_op, base.memory_allocated_by_op)
        verdict.grew = grew or None
        verdict.reason = "; ".join(problems) + (
            f"; allocates more: {tables.by_op(grew, '+.2f')}" if grew else "")
    else:
        verdict.reason = ("memory " + ", ".join(f"{name.split('_')[0]} {part.value:.3f}"
                                                for name, part in parts.items()) + " passes within the baseline")
    verdict.reason += note
    return verdict


def judge_ledger(ledger: dict[str, LedgerRow] | None, base: dict[str, float] | None, *, rules: Rules,
                 drift: DriftRecord, key: str, counted_by_op: dict[str, float] | None = None,
                 base_counted_by_op: dict[str, float] | None = None) -> Verdict:
    """Judge a class's per-op ledger (``kv.ledger.<cache>``: {op: row}) against the baseline's {op: timed passes},
    op by op (see :mod:`kvcache.analysing.judge.gate`); ``parts`` has each op's verdict, keyed by op, a new op marked
    ``new``, a renamed one with the baseline op it replaced in ``was``."""
    if not ledger:
        return Verdict("not-measured", "the per-op ledger was not measured")
    if base is None:
        return Verdict("no-baseline", f"no ledger in the baseline for {key!r}; record one with --kv-update-baseline")
    drifted = drift_problem(drift)
    counted_by_op, base_counted_by_op = counted_by_op or {}, base_counted_by_op or {}
    vanished = [op for op in base if op not in ledger]
    parts: dict[str, Part] = {}
    notes = []
    moving = {op for op, passes in {**base_counted_by_op, **counted_by_op}.items() if passes > MIN_OP_PASSES}
    for op, row in ledger.items():
        if op in LEDGER_UNJUDGED or op not in moving or row.timed is None:
            continue
        part = Part("inconclusive", value=row.timed)
        reference = base.get(op)
        if reference is None:
            renamed = [old for old in vanished if counted_by_op.get(op) and base_counted_by_op.get(old) and
                       abs(counted_by_op[op] - base_counted_by_op[old]) <= COUNTED_MATCH]
            if renamed:
                reference, part.was = base[renamed[0]], renamed[0]
                vanished.remove(renamed[0])
                notes.append(f"{renamed[0]} is now {op} (same counted passes)")
            else:
                reference, part.new = 0.0, True
        floor = max(reference, 0.0)
        part.allowed = max(floor * (1 + rules.tolerance), floor + rules.ledger_tolerance)
        if drifted and part.new:  # a speed change scales an op's time; it cannot make a new op appear
            part.allowed *= 1 + abs(drift.fraction or 0.0)
        ci = row.timed_ci or [None, None]
        part.interval = list(ci)
        if drifted and not part.new:
            part.reason = "drift"
        elif None in ci or not all(math.isfinite(v) for v in ci):
            part.reason = "no interval"
        elif ci[0] > part.allowed and part.new:
            part.status = "regression"
        elif ci[0] > part.allowed:  # a known op: its time varies between sessions; the whole step is judged for it
            part.reason = (f"above the allowed, not judged: a known op's timed passes vary between sessions "
                           f"beyond --kv-tolerance ({fmt(reference)} in the baseline); timed passes judge the step")
        elif ci[1] <= part.allowed:
            part.status = "pass"
        else:
            part.reason = "straddles"
        parts[op] = part
    if vanished:
        notes.append(f"gone since the baseline: {', '.join(vanished)}")
    worst = max((p.status for p in parts.values()), key=lambda st: PRIORITY.get(st, 0), default="pass")
    regressed = {op: p for op, p in parts.items() if p.status == "regression"}
    if regressed:
        reason = "; ".join(f"{part_label(op, p)}: timed passes {fmt(p.value)} (interval [{fmt(p.interval[0])}, "
                           f"{fmt(p.interval[1])}]) is above the allowed {fmt(p.allowed)}"
                           for op, p in regressed.items())
    elif worst == "inconclusive":
        unsure = [part_label(op, p) for op, p in parts.items() if p.status == "inconclusive"]
        reason = drifted or f"intervals straddle the allowed values or are missing: {', '.join(unsure)}"
    else:
        reason = f"every op's timed passes within the allowed ({len(parts)} ops)"
    if notes:
        reason += "; " + "; ".join(notes)
    return Verdict(worst, reason, parts=parts)


def part_label(op: str, part: Part) -> str:
    """How a message names a ledger op: ``"clone (new)"``, ``"concat (was cat)"``, or the op."""
    if part.new:
        return f"{op} (new)"
    return f"{op} (was {part.was})" if part.was else op
