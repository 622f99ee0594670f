"""The one judge: every rule that turns measured passes and a baseline into verdicts, used by the
session-end gate and by ``kvcache compare`` alike. Analysing wing: stdlib only.

Verdicts are kept as ``kv.verdict.<cache>.<measure>`` (measures: ``counted``, ``timed``; later issues add
more under the same scheme), each ``{status, value, allowed, reason}`` plus ``interval`` (timed) and
``grew`` (counted: the ops whose passes rose). The build's exit status and its failure lines come from
walking that tree (:func:`failures`).

- Counted passes (bytes read + written by one decode step's ops per logical KV byte) are exact:
  *regression* when above the baseline + ``counted_tolerance`` passes (or ``max_passes``).
- Timed passes (copy bandwidth × latency slope) are judged by their bootstrap interval: *regression*
  only when all of it is above baseline × (1 + ``tolerance``), *pass* only when all of it is within;
  a poor fit, drift, a fit that gives no figure or a straddling interval is *inconclusive*, never a
  pass and never red (unless ``strict``).
- Drift invalidates, it does not accuse: beyond ``max_drift`` the timed verdicts are inconclusive and
  the build does not fail on it unless ``strict``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kvcache.analysing.records import jsonable

MEASURES = ("counted", "timed")
STATUSES = ("pass", "regression", "inconclusive", "no-baseline", "not-measured")
# Higher wins when the measures of a class are shown as one status.
PRIORITY = {"not-measured": 0, "no-baseline": 1, "pass": 2, "inconclusive": 3, "regression": 4}
# Counted passes are ratios of byte counts; a rounding error must not turn "equal" into a regression.
COUNTED_RELATIVE_SLACK = 1e-9
# A per-op change of counted passes smaller than this is not named as an op that grew.
OP_CHANGE = 0.005


@dataclass(frozen=True)
class Rules:
    """What the judge allows: tolerances (finite, non-negative), absolute bounds, the fit quality asked for."""

    tolerance: float = 0.10
    counted_tolerance: float = 0.05
    min_r2: float = 0.90
    max_passes: dict[str, float] = field(default_factory=dict)
    strict: bool = False

    def __post_init__(self) -> None:
        for name in ("tolerance", "counted_tolerance", "min_r2"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} {value!r} must be a finite number, at least 0")

    @classmethod
    def from_settings(cls, settings: dict[str, Any], **override: Any) -> Rules:
        keys = ("tolerance", "counted_tolerance", "min_r2", "max_passes", "strict")
        return cls(**{**{k: settings[k] for k in keys if settings.get(k) is not None}, **override})


@dataclass
class Verdict:
    """The judgement of one measure of one cache class."""

    status: str
    reason: str
    value: float | None = None
    allowed: float | None = None
    interval: tuple[float, float] | None = None
    grew: dict[str, float] | None = None

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


def no_baseline_reason(key: str) -> str:
    return f"no baseline for {key!r}; record one with --kv-update-baseline or pass --kv-max-passes cache=number"


def drift_problem(drift: dict[str, Any] | None) -> str | None:
    """Why the session's drift makes timed figures unjudgeable, or None."""
    if drift and drift.get("ok") is False:
        return (f"drift {drift['fraction']:+.1%} of {drift['cache']} at {drift['context']} tokens is beyond the "
                f"allowed ±{drift['max_fraction']:.0%} (--kv-max-drift): the machine's speed changed during the "
                "session")
    return None


def judge_timed(fit: dict[str, Any] | None, *, allowed: float | None, rules: Rules, drift: dict[str, Any] | None,
                key: str) -> Verdict:
    """Judge a class's timed passes (``kv.fit.<cache>``) by their interval; see the module docstring."""
    if not fit:
        return Verdict("not-measured", "timed passes were not measured")
    drifted = drift_problem(drift)
    if fit.get("error") or fit.get("passes") is None:
        reason = f"no timed passes figure: {fit.get('error') or 'no fit'}" + (f"; {drifted}" if drifted else "")
        return Verdict("inconclusive", reason, allowed=allowed)
    passes, r2 = float(fit["passes"]), fit.get("r2")
    ci = fit.get("passes_ci") or (None, None)
    interval = (ci[0], ci[1]) if None not in ci else None
    verdict = Verdict("inconclusive", "", value=passes, allowed=allowed, interval=interval)
    if allowed is None:
        verdict.status, verdict.reason = "no-baseline", no_baseline_reason(key)
        if drifted:
            verdict.reason += f" ({drifted})"
        return verdict
    problems = [p for p in (
        None if r2 is not None and r2 >= rules.min_r2 else f"poor fit: R² {fmt(r2)} < {rules.min_r2:.2f} (--kv-min-r2)",
        drifted,
        None if interval and all(math.isfinite(v) for v in interval) else "no bootstrap interval for timed passes",
    ) if p]
    if problems:
        verdict.reason = "; ".join(problems)
    else:
        lo, hi = interval
        described = f"timed passes {fmt(passes)} (interval [{fmt(lo)}, {fmt(hi)}])"
        if lo > allowed:
            verdict.status, verdict.reason = "regression", f"{described} is above the allowed {fmt(allowed)}"
        elif hi <= allowed:
            verdict.status, verdict.reason = "pass", f"{described} is within the allowed {fmt(allowed)}"
        else:
            width = (hi - lo) / abs(passes) if passes else math.inf
            verdict.reason = (f"interval [{fmt(lo)}, {fmt(hi)}] straddles the allowed {fmt(allowed)} (wide interval: "
                              f"{width:.0%} of passes); more rounds or steps would narrow it")
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
    ``counted_passes``, ``counted_by_op``), ``keys`` the baseline key of each measure (for messages).
    """
    fits, traffic = kv.get("fit") or {}, kv.get("traffic") or {}
    caches = dict.fromkeys([*(kv.get("settings") or {}).get("caches", []), *fits, *traffic])
    out = {}
    for cache in caches:
        bound = rules.max_passes.get(cache)
        counted_base = baseline.get("counted", {}).get(cache) or {}
        timed_base = baseline.get("timed", {}).get(cache) or {}
        judged = counted_traffic(traffic.get(cache))
        counted = judge_counted(
            judged, key=keys["counted"], base_by_op=counted_base.get("counted_by_op"),
            allowed=allowed_passes(counted_base.get("counted_passes"), rules.counted_tolerance, bound, relative=False))
        if counted.status == "not-measured" and (judged or {}).get("why_missing"):
            counted.reason = f"no fused count of the compiled step: {judged['why_missing']}"
        timed = judge_timed(
            fits.get(cache), rules=rules, drift=kv.get("drift"), key=keys["timed"],
            allowed=allowed_passes(timed_base.get("timed_passes"), rules.tolerance, bound, relative=True))
        problems = compile_problems(kv.get("points"), cache)
        if problems and timed.status != "not-measured":
            if timed.status in ("pass", "regression"):
                timed.status, timed.reason = "inconclusive", ""
            timed.reason = "; ".join([*([timed.reason] if timed.reason else []), *problems])
        out[cache] = {"counted": counted.to_dict(), "timed": timed.to_dict()}
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
            if status == "regression" or (strict and measure != "counted" and status == "inconclusive"):
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
