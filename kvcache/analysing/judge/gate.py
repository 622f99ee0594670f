"""The one judge: every rule that turns measured figures and a baseline into verdicts, for the session-end gate and
``kvcache compare`` alike. Each measure's judge is :mod:`kvcache.analysing.judge.judges`'; this module applies them to
every class of a run (:func:`judge_run`: ``kv.verdict.<cache>.<measure>``) and walks the verdicts
(:func:`failures`, :func:`status_of`: the exit status and its lines). The rules: docs/gate.md. Stdlib only."""

from __future__ import annotations

import math

from kvcache.analysing.judge.decoding_judge import baseline_figures, decoding_figures, judge_decoding
from kvcache.analysing.judge.entries import BaselineEntry
from kvcache.analysing.judge.judges import (
    PRIORITY,
    allowed_passes,
    drift_problem,
    fmt,
    judge_counted,
    judge_gpus,
    judge_intercept,
    judge_ledger,
    judge_memory,
    judge_overhead,
    judge_timed,
)
from kvcache.analysing.judge.measure_table import EXACT_VERDICTS, VERDICT_NAMES
from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.records import KV, Drift, Point, Speed, UnmeasuredDrift, Verdict
from kvcache.analysing.settings import parse_max_passes  # noqa: F401 - its home is the options' parsers


def speed_shift(speed: Speed | None, base_ms: float | None, max_fraction: float) -> Drift | None:
    """A drift-like record when this run reads its weights (``kv.speed.weights_ms``: median ms per step of the
    ``linear`` ops in the ledger's profiled steps, which do not depend on the cache) more than ``max_fraction``
    slower or faster than the run its timed baseline came from (``timed_weights_ms``): the machine's decode speed
    changed between the two sessions, which the copy bandwidth need not show. None when within, or unknown."""
    run_ms = speed.weights_ms if speed is not None else None
    if not run_ms or not base_ms or not math.isfinite(run_ms) or not math.isfinite(base_ms):
        return None
    fraction = run_ms / base_ms - 1
    if abs(fraction) <= max_fraction:
        return None
    return Drift(ok=False, fraction=fraction, max_fraction=max_fraction,
                 problem=f"this run reads its weights {fraction:+.0%} per step against the run the timed baseline "
                         f"came from ({run_ms:.1f} vs {base_ms:.1f} ms, beyond ±{max_fraction:.0%}, --kv-max-drift): "
                         "the machine's decode speed changed between the sessions")


def compile_problems(points: list[Point], cache: str) -> list[str]:
    """Why a compiled class's timed figure cannot be trusted: its points' ``compiled.problem`` (a recompile inside
    the timed steps, a step that ran eagerly), each named once with its context."""
    problems: dict[str, None] = {}
    for p in points:
        if p.cache == cache and p.compiled is not None and p.compiled.problem:
            problems.setdefault(f"at {p.context} tokens: {p.compiled.problem}")
    return list(problems)


def skip_reason(kv: KV, cache: str) -> str | None:
    """Why ``cache`` did not run (``kv.skipped``): the reason of a whole-class skip first, else of a skipped point;
    None when it was not skipped."""
    entries = [s for s in kv.skipped if str(s.cache) == cache]
    whole = [s for s in entries if s.context is None]
    return next((str(s.reason) for s in whole or entries if s.reason), None)


def skipped_with_baseline(verdict: Verdict, skipped: str | None, baseline: float | None, allowed: float | None,
                          label: str, key: str) -> Verdict:
    """``verdict`` of a measure a skipped class did not measure while the baseline holds a figure for it: still
    not-measured, with the skip reason and the baseline's figure, and ``allowed`` set (what
    :func:`unmeasured_baselined` tells such a verdict by): shown in the verdict table, a failure under ``strict``."""
    if verdict.status != "not-measured" or skipped is None or baseline is None:
        return verdict
    return Verdict("not-measured", f"skipped ({skipped}), though the baseline holds {fmt(baseline)} {label} for "
                   f"{key!r}: not judged; --kv-strict fails it", allowed=allowed)


def unmeasured_baselined(verdict: Verdict) -> bool:
    """A verdict of a measure the baseline holds a figure for that the run skipped (:func:`skipped_with_baseline`):
    not-measured with an allowed value, which no other not-measured verdict has."""
    return verdict.status == "not-measured" and verdict.allowed is not None


def judge_run(kv: KV, baseline: dict[str, dict[str, BaselineEntry]], rules: Rules,
              keys: dict[str, str]) -> dict[str, dict[str, Verdict]]:
    """Verdicts of every class of a run: ``{cache: {measure: verdict}}``.

    ``baseline`` is ``{measure: {cache: entry}}`` (:func:`kvcache.analysing.judge.baseline.for_run`), ``keys`` the
    baseline key of each measure (for messages).
    """
    out = {}
    for cache in dict.fromkeys([*kv.settings.caches, *kv.fit, *kv.traffic, *kv.memory]):
        def entry(measure: str, cache: str = cache) -> BaselineEntry | None:
            return baseline[measure].get(cache) if measure in baseline else None

        bound = rules.max_passes.get(cache)
        counted_base, timed_base, traffic, fit = entry("counted"), entry("timed"), kv.traffic.get(cache), \
            kv.fit.get(cache)
        counted_passes = counted_base.counted_passes if counted_base is not None else None
        timed_passes = timed_base.timed_passes if timed_base is not None else None
        counted_allowed = allowed_passes(counted_passes, rules.counted_tolerance, bound, relative=False)
        timed_allowed = allowed_passes(timed_passes, rules.tolerance, bound, relative=True)
        counted = judge_counted(
            traffic.counted() if traffic is not None else None, key=keys["counted"],
            base_by_op=counted_base.counted_by_op if counted_base is not None else None, allowed=counted_allowed)
        drift: Drift | UnmeasuredDrift | None = kv.drift
        if not drift_problem(drift):  # within the session it held: did the machine change since the baseline?
            drift = speed_shift(kv.speed, timed_base.timed_weights_ms if timed_base is not None else None,
                                rules.max_drift) or drift
        timed = judge_timed(fit, rules=rules, drift=drift, key=keys["timed"], allowed=timed_allowed)
        skipped = skip_reason(kv, cache)  # a skipped class the baseline holds: shown, and failed under strict
        counted = skipped_with_baseline(counted, skipped, counted_passes, counted_allowed, "counted passes",
                                        keys["counted"])
        timed = skipped_with_baseline(timed, skipped, timed_passes, timed_allowed, "timed passes", keys["timed"])
        overhead = judge_overhead(traffic, entry("overhead"), rules=rules, key=keys["overhead"])
        intercept_base = timed_base.timed_intercept_ms if timed_base is not None else None
        intercept = judge_intercept(fit, rules=rules, drift=drift, key=keys["timed"],
                                    allowed=None if intercept_base is None else intercept_base * (1 + rules.tolerance))
        problems = compile_problems(kv.points, cache)
        for verdict in (timed, intercept):
            if problems and verdict.status != "not-measured":
                if verdict.status in ("pass", "regression"):
                    verdict.status, verdict.reason = "inconclusive", ""
                verdict.reason = "; ".join([*([verdict.reason] if verdict.reason else []), *problems])
        ledger = judge_ledger(
            kv.ledger.get(cache), timed_base.timed_ledger if timed_base is not None else None, rules=rules,
            drift=drift, key=keys["timed"], counted_by_op=traffic.by_op if traffic is not None else None,
            base_counted_by_op=counted_base.counted_by_op if counted_base is not None else None)
        judged = {"counted": counted, "timed": timed, "overhead": overhead, "intercept": intercept,
                  "ledger": ledger}  # the gate's judge of each verdict of the measure table (a test keeps them equal)
        if (traffic is not None and traffic.gpus) or (counted_base is not None and counted_base.gpu_passes):
            judged["gpus"] = judge_gpus(traffic.gpu_counted() if traffic is not None else {}, counted_base,
                                        tolerance=rules.counted_tolerance, key=keys["counted"])
        decoding = decoding_figures(traffic) or baseline_figures(counted_base)
        if decoding:  # a --kv-decoding key (<cache>#<strategy>): per token, by phase, the chunked prefill
            judged["decoding"] = judge_decoding(traffic, counted_base, tolerance=rules.counted_tolerance,
                                                key=keys["counted"])
        memory, memory_base = kv.memory.get(cache), entry("memory")
        if memory is not None or memory_base is not None:  # a run from before counted memory has no verdict of it
            judged["memory"] = judge_memory(memory, memory_base, rules=rules,
                                            key=keys.get("memory", keys["overhead"]))
        out[cache] = {name: judged[name] for name in VERDICT_NAMES if name in judged}
    return out


def status_of(verdicts: dict[str, Verdict]) -> str:
    """One status for a class (for tables): the highest-priority status of its measures."""
    statuses = [v.status for v in verdicts.values()]
    return max(statuses, key=lambda s: PRIORITY.get(s, 0)) if statuses else "not-measured"


def strict_failure(measure: str, verdict: Verdict) -> bool:
    """Whether ``--kv-strict`` fails ``verdict`` of ``measure`` (the suite's gate and ``kvcache compare --strict``
    alike): an inconclusive verdict of a timed measure (exact ones are never inconclusive for noise), or a measure of
    a skipped class the baseline holds a figure for (:func:`unmeasured_baselined`)."""
    unsure = measure not in EXACT_VERDICTS and verdict.status == "inconclusive"
    return unsure or unmeasured_baselined(verdict)


def strict_drift(lines: list[str], drift: Drift | UnmeasuredDrift | None) -> str | None:
    """The drift beyond its limit that ``--kv-strict`` fails besides the verdicts' own ``lines`` (None when there is
    none, or when a line names it already)."""
    problem = drift_problem(drift)
    return problem if problem and not any("drift" in line for line in lines) else None


def failures(verdicts: dict[str, dict[str, Verdict]], *, drift: Drift | UnmeasuredDrift | None = None,
             strict: bool = False) -> list[str]:
    """One line per reason the build fails, walking ``kv.verdict.<cache>.<measure>``: every regression;
    with ``strict`` also every verdict :func:`strict_failure` names and a drift beyond its limit."""
    lines = []
    for cache, measures in verdicts.items():
        for measure, v in measures.items():
            if v.status == "regression" or (strict and strict_failure(measure, v)):
                lines.append(f"kv-cache {v.status}: {cache} {measure}: {v.reason}")
    problem = strict_drift(lines, drift) if strict else None
    if problem:
        lines.append(f"kv-cache drift (--kv-strict): {problem}")
    return lines
