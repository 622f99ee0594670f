"""The one judge: every rule that turns measured passes and a baseline into verdicts, used by the
session-end gate and by ``kvcache compare`` alike. Analysing wing: stdlib only.

Verdicts are kept as ``kv.verdict.<cache>.<measure>`` (measures: :data:`MEASURES`), each
``{status, value, allowed, reason}`` plus ``interval`` (timed, intercept), ``grew`` (counted: the ops whose
passes rose) and ``parts`` (overhead). The build's exit status and its failure lines come from walking that
tree (:func:`failures`).

- Counted passes (bytes read + written by one decode step's ops per logical KV byte) are exact:
  *regression* when above the baseline + ``counted_tolerance`` passes (or ``max_passes``).
- Timed passes (copy bandwidth × latency slope) are judged by their bootstrap interval: *regression*
  only when all of it is above baseline × (1 + ``tolerance``), *pass* only when all of it is within;
  a poor fit, drift, a fit that gives no figure or a straddling interval is *inconclusive*, never a
  pass and never red (unless ``strict``).
- Counted overhead (exact, like counted passes): *regression* when ATen ops per step rise by more than
  ``ops_tolerance`` per layer, or weight passes (bytes that do not grow with context / weight bytes) by more
  than ``weight_passes_tolerance``. Its baseline is keyed by the torch release as well.
- Counted memory (exact: bytes one decode step allocates, peaks at and leaves held, per logical KV byte,
  ``kv.memory.<cache>``): *regression* when any of allocated, peak or held passes rises by more than
  ``memory_tolerance`` above the baseline's; keyed by the torch release like the overhead, since allocation
  behaviour may change with it. A class whose measured peak needs more cache sizes than its declared
  ``memory_factor`` is named in the reason (it does not fail the build: the factor only decides which points fit).
- The timed intercept (ms per step with an empty cache) is judged like timed passes, by its interval
  against baseline × (1 + ``tolerance``), inconclusive on a poor fit or drift.
- The per-op ledger (timed passes per op, ``kv.ledger``): each op that moves cache bytes (counted passes in
  the run or the baseline) by its interval against the baseline's figure for that op, allowed
  max(baseline × (1 + ``tolerance``), baseline + ``ledger_tolerance``); an op absent from the baseline is
  matched to a vanished baseline op with the same counted passes (renamed between releases), else judged
  against 0 + ``ledger_tolerance``: a new op with clearly positive timed passes is a regression. A known op
  above its allowed value is inconclusive, not red: between two sessions on one machine single ops moved by
  −28% and +19% while the whole step held (kept in the README); the whole step's timed passes judge it. Drift makes
  every op compared with a baseline figure inconclusive, but not a new op: a change of the machine's speed
  scales an op's time, it cannot make an op appear; a new op is then judged against ``ledger_tolerance`` ×
  (1 + the drift). Ops that
  move no cache bytes (weights, norms), the unattributed time and the other ops are shown, not judged: their
  slopes are noise around 0 that one slow moment during the profiled steps can tilt.
- Drift invalidates, it does not accuse: beyond ``max_drift`` the timed verdicts are inconclusive and
  the build does not fail on it unless ``strict``. The same holds across sessions: when the run reads its
  weights more than ``max_drift`` faster or slower than the run its timed baseline came from
  (:func:`speed_shift`), its timed verdicts against that baseline are inconclusive.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kvcache.analysing.records import jsonable

MEASURES = ("counted", "timed", "overhead", "intercept", "ledger", "memory")
# Measures that are counted, not timed: never inconclusive for noise, so --kv-strict leaves them alone.
EXACT = ("counted", "overhead", "memory")
STATUSES = ("pass", "regression", "inconclusive", "no-baseline", "not-measured")
# Higher wins when the measures of a class are shown as one status.
PRIORITY = {"not-measured": 0, "no-baseline": 1, "pass": 2, "inconclusive": 3, "regression": 4}
# Counted passes are ratios of byte counts; a rounding error must not turn "equal" into a regression.
COUNTED_RELATIVE_SLACK = 1e-9
# A per-op change of counted passes smaller than this is not named as an op that grew.
OP_CHANGE = 0.005


@dataclass(frozen=True)
class Rules:
    """What the judge allows: tolerances (finite, non-negative), absolute bounds, the fit quality asked for, the
    drift allowed against the timed baseline's decode speed. Every value is checked when made (ValueError, one line
    naming the rule and the value): a NaN would fail every comparison and so pass anything."""

    tolerance: float = 0.10
    counted_tolerance: float = 0.05
    min_r2: float = 0.90
    max_passes: dict[str, float] = field(default_factory=dict)
    strict: bool = False
    ops_tolerance: float = 0.5  # ATen ops per layer per step: +1 op in every layer is a regression
    weight_passes_tolerance: float = 0.05
    ledger_tolerance: float = 0.5  # timed passes an op may rise by besides the relative tolerance
    memory_tolerance: float = 0.05  # allocated, peak and held passes may each rise by this much
    max_drift: float = 0.10  # the fraction the decode speed may shift from the timed baseline's (speed_shift)

    #: Every rule a run's settings hold (``kv.settings``, the ``--kv-*`` options of the same names).
    SETTINGS = ("tolerance", "counted_tolerance", "min_r2", "max_passes", "strict", "ops_tolerance",
                "weight_passes_tolerance", "ledger_tolerance", "max_drift", "memory_tolerance")

    def __post_init__(self) -> None:
        for name in ("tolerance", "counted_tolerance", "min_r2", "ops_tolerance", "weight_passes_tolerance",
                     "ledger_tolerance", "max_drift", "memory_tolerance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} {value!r} must be a finite number, at least 0")
        if self.min_r2 > 1:
            raise ValueError(f"min_r2 {self.min_r2!r} must be a number from 0 to 1")
        if not isinstance(self.max_passes, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                for v in self.max_passes.values()):
            raise ValueError(f"max_passes {self.max_passes!r} must map each cache to a finite number above 0")
        if not isinstance(self.strict, bool):
            raise ValueError(f"strict {self.strict!r} must be true or false")

    @classmethod
    def from_settings(cls, settings: dict[str, Any], **override: Any) -> Rules:
        """The rules a run was judged with: its settings (``kv.settings``; a rule it lacks keeps its default), each
        rule in ``override`` replacing the run's. ValueError when a value cannot judge (NaN, out of range)."""
        return cls(**{**{k: settings[k] for k in cls.SETTINGS if settings.get(k) is not None}, **override})

    def describe(self) -> str:
        """One line of the tolerances, for ``kvcache compare``'s preamble."""
        bounds = "".join(f", {cache} at most {value:g} passes" for cache, value in self.max_passes.items())
        return (f"timed ×{1 + self.tolerance:.2f} (interval lower bound), counted +{self.counted_tolerance:g} passes; "
                f"ops per step +{self.ops_tolerance:g} per layer, weight passes +{self.weight_passes_tolerance:g}; "
                f"intercept ×{1 + self.tolerance:.2f}; ledger ×{1 + self.tolerance:.2f} or "
                f"+{self.ledger_tolerance:g} passes per op; memory (allocated, peak, held) "
                f"+{self.memory_tolerance:g} passes; R² at least {self.min_r2:g}; decode speed within "
                f"±{self.max_drift:.0%} of the timed baseline's{bounds}")


@dataclass
class Verdict:
    """The judgement of one measure of one cache class."""

    status: str
    reason: str
    value: float | None = None
    allowed: float | None = None
    interval: tuple[float, float] | None = None
    grew: dict[str, float] | None = None
    parts: dict[str, dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return jsonable({k: v for k, v in asdict(self).items() if v is not None or k in ("value", "allowed")})


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


def drift_problem(drift: dict[str, Any] | None) -> str | None:
    """Why the session's drift (or a speed shift against the baseline, :func:`speed_shift`) makes timed figures
    unjudgeable, or None."""
    if drift and drift.get("ok") is False and drift.get("problem"):
        return str(drift["problem"])
    if drift and drift.get("ok") is False:
        return (f"drift {drift['fraction']:+.1%} of {drift['cache']} at {drift['context']} tokens is beyond the "
                f"allowed ±{drift['max_fraction']:.0%} (--kv-max-drift): the machine's speed changed during the "
                "session")
    return None


def speed_shift(speed: dict[str, Any] | None, base_ms: float | None, max_fraction: float) -> dict[str, Any] | None:
    """A drift-like record when this run reads its weights (``kv.speed.weights_ms``: median ms per step of the
    ``linear`` ops in the ledger's profiled steps, which do not depend on the cache) more than ``max_fraction``
    slower or faster than the run its timed baseline came from (``timed_weights_ms``): the machine's decode speed
    changed between the two sessions, which the copy bandwidth need not show. None when within, or unknown."""
    run_ms = (speed or {}).get("weights_ms")
    if not run_ms or not base_ms or not math.isfinite(run_ms) or not math.isfinite(base_ms):
        return None
    fraction = run_ms / base_ms - 1
    if abs(fraction) <= max_fraction:
        return None
    return {"ok": False, "fraction": fraction, "max_fraction": max_fraction,
            "problem": f"this run reads its weights {fraction:+.0%} per step against the run the timed baseline came "
                       f"from ({run_ms:.1f} vs {base_ms:.1f} ms, beyond ±{max_fraction:.0%}, --kv-max-drift): the "
                       "machine's decode speed changed between the sessions"}


def judge_timed(fit: dict[str, Any] | None, *, allowed: float | None, rules: Rules, drift: dict[str, Any] | None,
                key: str) -> Verdict:
    """Judge a class's timed passes (``kv.fit.<cache>``) by their interval; see the module docstring."""
    return judge_interval(fit, "passes", "passes_ci", "timed passes", allowed=allowed, rules=rules, drift=drift,
                          key=key)


def judge_intercept(fit: dict[str, Any] | None, *, allowed: float | None, rules: Rules,
                    drift: dict[str, Any] | None, key: str) -> Verdict:
    """Judge a class's timed intercept (``kv.fit.<cache>.intercept_ms``, ms per step with an empty cache) by
    its interval, the rules of timed passes."""
    return judge_interval(fit, "intercept_ms", "intercept_ci", "intercept ms", allowed=allowed, rules=rules,
                          drift=drift, key=key)


def judge_interval(fit: dict[str, Any] | None, value_key: str, interval_key: str, label: str, *,
                   allowed: float | None, rules: Rules, drift: dict[str, Any] | None, key: str) -> Verdict:
    """Judge one figure of a timed fit by its bootstrap interval: regression only when all of it is above
    ``allowed``, pass only when all of it is within; otherwise (poor fit, drift, no interval) inconclusive."""
    if not fit:
        return Verdict("not-measured", f"{label} was not measured")
    drifted = drift_problem(drift)
    if fit.get("error") or fit.get(value_key) is None:
        reason = f"no {label} figure: {fit.get('error') or 'no fit'}" + (f"; {drifted}" if drifted else "")
        return Verdict("inconclusive", reason, allowed=allowed)
    value, r2 = float(fit[value_key]), fit.get("r2")
    ci = fit.get(interval_key) or (None, None)
    interval = (ci[0], ci[1]) if None not in ci else None
    verdict = Verdict("inconclusive", "", value=value, allowed=allowed, interval=interval)
    if allowed is None:
        verdict.status, verdict.reason = "no-baseline", no_baseline_reason(key, bounded=value_key == "passes")
        if drifted:
            verdict.reason += f" ({drifted})"
        return verdict
    problems = [p for p in (
        None if r2 is not None and r2 >= rules.min_r2 else f"poor fit: R² {fmt(r2)} < {rules.min_r2:.2f} (--kv-min-r2)",
        drifted,
        None if interval and all(math.isfinite(v) for v in interval) else f"no bootstrap interval for {label}",
    ) if p]
    if problems:
        verdict.reason = "; ".join(problems)
    else:
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


def ops_that_grew(by_op: dict[str, float] | None, base_by_op: dict[str, float] | None) -> dict[str, float]:
    """{op: rise in counted passes} of the ops whose passes rose against the baseline (new ops included)."""
    if not by_op or base_by_op is None:
        return {}
    grew = {op: value - base_by_op.get(op, 0.0) for op, value in by_op.items()}
    return {op: delta for op, delta in sorted(grew.items(), key=lambda kv: -kv[1]) if delta > OP_CHANGE}


def judge_counted(traffic: dict[str, Any] | None, *, allowed: float | None, base_by_op: dict[str, float] | None,
                  key: str) -> Verdict:
    """Judge a class's counted passes (``kv.traffic.<cache>``): regression when above ``allowed``; the
    verdict names the ops that grew when the baseline has a per-op breakdown."""
    passes = (traffic or {}).get("passes")
    if passes is None:
        return Verdict("not-measured", "counted passes were not measured")
    verdict = Verdict("pass", "", value=passes, allowed=allowed)
    if allowed is None:
        verdict.status, verdict.reason = "no-baseline", no_baseline_reason(key)
    elif not math.isfinite(passes):
        verdict.status, verdict.reason = "inconclusive", f"counted passes is {passes}"
    elif passes > allowed * (1 + COUNTED_RELATIVE_SLACK):
        verdict.status = "regression"
        verdict.reason = f"counted passes {fmt(passes)} is above the allowed {fmt(allowed)}"
        if base_by_op is None:
            now = describe_ops(traffic.get("by_op") or {})
            verdict.reason += f"; by op now: {now}"
        else:
            verdict.grew = ops_that_grew(traffic.get("by_op"), base_by_op)
            grew = ", ".join(f"{op} {delta:+.2f}" for op, delta in verdict.grew.items()) or "none of its ops by itself"
            verdict.reason += f"; grew: {grew}"
    else:
        verdict.reason = f"counted passes {fmt(passes)} is within the allowed {fmt(allowed)}"
    return verdict


def judge_overhead(traffic: dict[str, Any] | None, base: dict[str, Any] | None, *, rules: Rules,
                   key: str) -> Verdict:
    """Judge a class's counted overhead (``kv.traffic.<cache>``: ops per step, weight passes) against its
    baseline entry (``ops_per_step``, ``weight_passes``, ``op_calls``): regression when ops per step rise by
    more than ``ops_tolerance`` × layers or weight passes by more than ``weight_passes_tolerance``; the
    reason names the ops whose calls grew. ``value``/``allowed`` are ops per step; ``parts`` has both."""
    traffic = traffic or {}
    ops, weight = traffic.get("ops_per_step"), traffic.get("weight_passes")
    if ops is None:
        return Verdict("not-measured", "counted overhead was not measured")
    if not base or base.get("ops_per_step") is None:
        return Verdict("no-baseline", f"no baseline for {key!r} (op counts are kept per torch release); record "
                       "one with --kv-update-baseline", value=ops)
    layers = traffic.get("layers") or base.get("layers") or 1
    allowed_ops = base["ops_per_step"] + rules.ops_tolerance * layers
    parts = {"ops_per_step": {"value": ops, "allowed": allowed_ops}}
    if weight is not None and base.get("weight_passes") is not None:
        parts["weight_passes"] = {"value": weight, "allowed": base["weight_passes"] + rules.weight_passes_tolerance}
    problems = []
    for name, part in parts.items():
        over = part["value"] > part["allowed"] * (1 + COUNTED_RELATIVE_SLACK)
        part["status"] = "regression" if over else "pass"
        if over:
            problems.append(f"{name.replace('_', ' ')} {fmt_figure(part['value'])} is above the allowed "
                            f"{fmt_figure(part['allowed'])}")
    verdict = Verdict("regression" if problems else "pass", "", value=ops, allowed=allowed_ops, parts=parts)
    if problems:
        grew = calls_that_grew(traffic.get("calls"), base.get("op_calls"))
        verdict.reason = "; ".join(problems) + (f"; calls grew: {grew}" if grew else "")
    else:
        verdict.reason = (f"ops per step {ops} (allowed {fmt_figure(allowed_ops)}: {rules.ops_tolerance:g} per layer "
                          f"over {layers} layers)" + (f", weight passes {weight:.3f}" if weight is not None else "")
                          + " within the baseline")
    return verdict


#: The figures of counted memory the gate judges (``kv.memory.<cache>``) and the baseline field of each.
MEMORY_FIGURES = {"allocated_passes": "memory_allocated_passes", "peak_passes": "memory_peak_passes",
                  "held_passes": "memory_held_passes"}


def judge_memory(memory: dict[str, Any] | None, base: dict[str, Any] | None, *, rules: Rules, key: str) -> Verdict:
    """Judge a class's counted memory (``kv.memory.<cache>``: allocated, peak and held passes, bytes per logical KV
    byte) against its baseline entry (``memory_*_passes``, ``memory_allocated_by_op``): regression when any figure
    rises by more than ``memory_tolerance``; ``value``/``allowed`` are held passes, ``parts`` has all three; the
    reason names the ops that allocate more, and a declared ``memory_factor`` the measured peak exceeds."""
    if not memory or memory.get("held_passes") is None:
        return Verdict("not-measured", "counted memory was not measured")
    note = f"; {memory['factor_problem']}" if memory.get("factor_problem") else ""
    held = memory["held_passes"]
    if not base or base.get("memory_held_passes") is None:
        return Verdict("no-baseline", f"no baseline for {key!r} (memory is kept per torch release); record one with "
                       f"--kv-update-baseline{note}", value=held)
    parts: dict[str, dict[str, Any]] = {}
    problems = []
    for name, field_name in MEMORY_FIGURES.items():
        value, reference = memory.get(name), base.get(field_name)
        if value is None or reference is None:
            continue
        allowed = reference + rules.memory_tolerance
        over = not math.isfinite(value) or value > allowed + abs(allowed) * COUNTED_RELATIVE_SLACK
        parts[name] = {"value": value, "allowed": allowed, "status": "regression" if over else "pass"}
        if over:
            problems.append(f"{name.replace('_', ' ')} {fmt_figure(round(value, 4))} is above the allowed "
                            f"{fmt_figure(round(allowed, 4))}")
    allowed_held = parts.get("held_passes", {}).get("allowed")
    verdict = Verdict("regression" if problems else "pass", "", value=held, allowed=allowed_held, parts=parts)
    if problems:
        grew = ops_that_grew(memory.get("allocated_by_op"), base.get("memory_allocated_by_op"))
        verdict.grew = grew or None
        verdict.reason = "; ".join(problems) + (
            f"; allocates more: {', '.join(f'{op} {d:+.2f}' for op, d in grew.items())}" if grew else "")
    else:
        verdict.reason = ("memory " + ", ".join(f"{name.split('_')[0]} {part['value']:.3f}"
                                                for name, part in parts.items()) + " passes within the baseline")
    verdict.reason += note
    return verdict


LEDGER_UNJUDGED = ("(profiled step)",)  # the whole step is judged as timed passes already (and not an op)
COUNTED_MATCH = 0.01  # counted passes within this make a renamed op the same op


def judge_ledger(ledger: dict[str, Any] | None, base: dict[str, float] | None, *, rules: Rules,
                 drift: dict[str, Any] | None, key: str, counted_by_op: dict[str, float] | None = None,
                 base_counted_by_op: dict[str, float] | None = None) -> Verdict:
    """Judge a class's per-op ledger (``kv.ledger.<cache>``: {op: {timed, timed_ci}}) against the baseline's
    {op: timed passes}, op by op (see the module docstring); ``parts`` has each op's verdict."""
    if not ledger:
        return Verdict("not-measured", "the per-op ledger was not measured")
    if base is None:
        return Verdict("no-baseline", f"no ledger in the baseline for {key!r}; record one with --kv-update-baseline")
    drifted = drift_problem(drift)
    counted_by_op, base_counted_by_op = counted_by_op or {}, base_counted_by_op or {}
    vanished = [op for op in base if op not in ledger]
    parts, notes = {}, []
    moving = {op for op, passes in {**base_counted_by_op, **counted_by_op}.items() if passes > OP_CHANGE}
    for op, row in ledger.items():
        if op in LEDGER_UNJUDGED or op not in moving or not isinstance(row, dict) or row.get("timed") is None:
            continue
        reference, label = base.get(op), op
        if reference is None:
            renamed = [old for old in vanished if counted_by_op.get(op) and base_counted_by_op.get(old) and
                       abs(counted_by_op[op] - base_counted_by_op[old]) <= COUNTED_MATCH]
            if renamed:
                reference, label = base[renamed[0]], f"{op} (was {renamed[0]})"
                vanished.remove(renamed[0])
                notes.append(f"{renamed[0]} is now {op} (same counted passes)")
            else:
                reference, label = 0.0, f"{op} (new)"
        floor = max(reference, 0.0)
        allowed = max(floor * (1 + rules.tolerance), floor + rules.ledger_tolerance)
        new = label.endswith("(new)")
        if drifted and new:  # a speed change scales an op's time; it cannot make a new op appear
            allowed *= 1 + abs(float((drift or {}).get("fraction") or 0.0))
        ci = row.get("timed_ci") or (None, None)
        part = {"value": row["timed"], "allowed": allowed, "interval": list(ci), "status": "inconclusive"}
        if drifted and not new:
            part["reason"] = "drift"
        elif None in ci or not all(math.isfinite(v) for v in ci):
            part["reason"] = "no interval"
        elif ci[0] > allowed and new:
            part["status"] = "regression"
        elif ci[0] > allowed:  # a known op: its time varies between sessions; the whole step is judged for it
            part["reason"] = (f"above the allowed, not judged: a known op's timed passes vary between sessions "
                              f"beyond --kv-tolerance ({fmt(reference)} in the baseline); timed passes judge the step")
        elif ci[1] <= allowed:
            part["status"] = "pass"
        else:
            part["reason"] = "straddles"
        parts[label] = part
    if vanished:
        notes.append(f"gone since the baseline: {', '.join(vanished)}")
    worst = max((p["status"] for p in parts.values()), key=lambda st: PRIORITY.get(st, 0), default="pass")
    regressed = {op: p for op, p in parts.items() if p["status"] == "regression"}
    if regressed:
        reason = "; ".join(f"{op}: timed passes {fmt(p['value'])} (interval [{fmt(p['interval'][0])}, "
                           f"{fmt(p['interval'][1])}]) is above the allowed {fmt(p['allowed'])}"
                           for op, p in regressed.items())
    elif worst == "inconclusive":
        unsure = [op for op, p in parts.items() if p["status"] == "inconclusive"]
        reason = drifted or f"intervals straddle the allowed values or are missing: {', '.join(unsure)}"
    else:
        reason = f"every op's timed passes within the allowed ({len(parts)} ops)"
    if notes:
        reason += "; " + "; ".join(notes)
    return Verdict(worst, reason, parts=parts)


def calls_that_grew(calls: dict[str, int] | None, base_calls: dict[str, int] | None) -> str:
    """``"add +2, mul +1"``: the ops called more often than in the baseline ("" when unknown or none)."""
    if not calls or base_calls is None:
        return ""
    grew = {op: n - base_calls.get(op, 0) for op, n in calls.items() if n > base_calls.get(op, 0)}
    return ", ".join(f"{op} +{d}" for op, d in sorted(grew.items(), key=lambda kv: -kv[1]))


def fmt_figure(value: float) -> str:
    """A whole number as such (ops), otherwise three decimals (weight passes)."""
    return f"{value:g}" if float(value).is_integer() else f"{value:.3f}"


def counted_traffic(traffic: dict[str, Any] | None) -> dict[str, Any] | None:
    """The counted figure a class is judged (and recorded) by: under ``--kv-compile`` the fused count of the
    compiled step (``kv.traffic.<cache>.compiled.fused``: what runs, per kernel), otherwise the eager count."""
    compiled = (traffic or {}).get("compiled")
    if not isinstance(compiled, dict):
        return traffic
    fused = compiled.get("fused") or {}
    return {"passes": fused.get("passes"), "by_op": fused.get("by_kernel") or {},
            "why_missing": compiled.get("error") or fused.get("error")}


def compile_problems(points: list[dict[str, Any]] | None, cache: str) -> list[str]:
    """Why a compiled class's timed figure cannot be trusted: its points' ``compiled.problem`` (a recompile inside
    the timed steps, a step that ran eagerly), each named once with its context."""
    problems: dict[str, None] = {}
    for p in points or []:
        problem = (p.get("compiled") or {}).get("problem") if p.get("cache") == cache else None
        if problem:
            problems.setdefault(f"at {p.get('context')} tokens: {problem}")
    return list(problems)


def judge_run(kv: dict[str, Any], baseline: dict[str, dict[str, dict[str, Any]]], rules: Rules,
              keys: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Verdicts of every class of a run: ``{cache: {measure: verdict dict}}``.

    ``baseline`` is ``{measure: {cache: entry}}`` (entries as recorded: ``timed_passes``,
    ``counted_passes``, ``counted_by_op``; ``timed_intercept_ms``; overhead: ``ops_per_step``, ...), ``keys`` the
    baseline key of each measure (for messages).
    """
    fits, traffic = kv.get("fit") or {}, kv.get("traffic") or {}
    caches = dict.fromkeys([*(kv.get("settings") or {}).get("caches", []), *fits, *traffic, *(kv.get("memory") or {})])
    out = {}
    for cache in caches:
        bound = rules.max_passes.get(cache)
        counted_base = baseline.get("counted", {}).get(cache) or {}
        timed_base = baseline.get("timed", {}).get(cache) or {}
        overhead_base = baseline.get("overhead", {}).get(cache)
        judged = counted_traffic(traffic.get(cache))
        counted = judge_counted(
            judged, key=keys["counted"], base_by_op=counted_base.get("counted_by_op"),
            allowed=allowed_passes(counted_base.get("counted_passes"), rules.counted_tolerance, bound, relative=False))
        if counted.status == "not-measured" and (judged or {}).get("why_missing"):
            counted.reason = f"no fused count of the compiled step: {judged['why_missing']}"
        drift = kv.get("drift")
        if not drift_problem(drift):  # within the session it held: did the machine change since the baseline?
            drift = speed_shift(kv.get("speed"), timed_base.get("timed_weights_ms"), rules.max_drift) or drift
        timed = judge_timed(
            fits.get(cache), rules=rules, drift=drift, key=keys["timed"],
            allowed=allowed_passes(timed_base.get("timed_passes"), rules.tolerance, bound, relative=True))
        overhead = judge_overhead(traffic.get(cache), overhead_base, rules=rules, key=keys["overhead"])
        intercept_base = timed_base.get("timed_intercept_ms")
        intercept = judge_intercept(
            fits.get(cache), rules=rules, drift=drift, key=keys["timed"],
            allowed=None if intercept_base is None else intercept_base * (1 + rules.tolerance))
        problems = compile_problems(kv.get("points"), cache)
        for verdict in (timed, intercept):
            if problems and verdict.status != "not-measured":
                if verdict.status in ("pass", "regression"):
                    verdict.status, verdict.reason = "inconclusive", ""
                verdict.reason = "; ".join([*([verdict.reason] if verdict.reason else []), *problems])
        ledger = judge_ledger(
            (kv.get("ledger") or {}).get(cache), timed_base.get("timed_ledger"), rules=rules, drift=drift,
            key=keys["timed"], counted_by_op=(traffic.get(cache) or {}).get("by_op"),
            base_counted_by_op=counted_base.get("counted_by_op"))
        out[cache] = {"counted": counted.to_dict(), "timed": timed.to_dict(), "overhead": overhead.to_dict(),
                      "intercept": intercept.to_dict(), "ledger": ledger.to_dict()}
        measured_memory, memory_base = (kv.get("memory") or {}).get(cache), baseline.get("memory", {}).get(cache)
        if measured_memory or memory_base:  # a run from before counted memory existed has no verdict of it
            out[cache]["memory"] = judge_memory(measured_memory, memory_base, rules=rules,
                                                key=keys.get("memory", keys["overhead"])).to_dict()
    return out


def status_of(verdicts: dict[str, Any]) -> str:
    """One status for a class (for tables): the highest-priority status of its measures."""
    statuses = [v.get("status", "not-measured") for v in verdicts.values() if isinstance(v, dict)]
    return max(statuses, key=lambda s: PRIORITY.get(s, 0)) if statuses else "not-measured"


def failures(verdicts: dict[str, dict[str, Any]], *, drift: dict[str, Any] | None = None,
             strict: bool = False) -> list[str]:
    """One line per reason the build fails, walking ``kv.verdict.<cache>.<measure>``: every regression;
    with ``strict`` also every inconclusive timed verdict and a drift beyond its limit."""
    lines = []
    for cache, measures in verdicts.items():
        for measure, v in measures.items():
            if not isinstance(v, dict):
                continue
            status = v.get("status")
            if status == "regression" or (strict and measure not in EXACT and status == "inconclusive"):
                lines.append(f"kv-cache {v['status']}: {cache} {measure}: {v.get('reason')}")
    problem = drift_problem(drift)
    if strict and problem and not any("drift" in line for line in lines):
        lines.append(f"kv-cache drift (--kv-strict): {problem}")
    return lines


def describe_ops(by_op: dict[str, float]) -> str:
    return ", ".join(f"{op} {value:.2f}" for op, value in by_op.items()) or "-"


def parse_max_passes(text: str) -> dict[str, float]:
    """Parse ``--kv-max-passes cache=number,...`` into cache -> maximum passes (positive)."""
    form = "expected cache=number,... (e.g. dynamic=4,static=1.5)"
    limits: dict[str, float] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        cache, sep, value = (part.strip() for part in item.partition("="))
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not cache or not math.isfinite(number):
            raise ValueError(f"--kv-max-passes: bad item {item!r}; {form}")
        if number <= 0:
            raise ValueError(f"--kv-max-passes: {item!r} is not positive; {form}")
        if cache in limits:
            raise ValueError(f"--kv-max-passes: {cache!r} given twice; {form}")
        limits[cache] = number
    return limits


def fmt(value: float | None) -> str:
    """Passes for a message: three significant digits, '?' when unknown."""
    return "?" if value is None else f"{value:.3g}"
