"""The one judge: every rule that turns measured passes and a baseline into verdicts, used by the
session-end gate and by ``kvcache compare`` alike. Analysing wing: stdlib only.

Verdicts are kept as ``kv.verdict.<cache>.<measure>`` (verdicts: :data:`kvcache.analysing.measure_table.VERDICTS`),
each ``{status, value, allowed, reason}`` plus ``interval`` (timed, intercept), ``grew`` (counted: the ops whose
passes rose) and ``parts`` (overhead, memory, the ledger). The build's exit status and its failure lines come from
walking that tree (:func:`failures`).

- Counted passes (bytes read + written by one decode step's ops per logical KV byte) are exact:
  *regression* when above the baseline + ``counted_tolerance`` passes (or ``max_passes``).
- Timed passes (copy bandwidth × latency slope) are judged by their bootstrap interval: *regression*
  only when all of it is above baseline × (1 + ``tolerance``), *pass* only when all of it is within;
  a poor fit, drift, a fit that gives no figure or a straddling interval is *inconclusive*, never a
  pass and never red (unless ``strict``).
- Counted passes per GPU class (``--kv-gpus``: the step under the SDPA backend torch's own rules select on that
  class, ``kv.traffic.<cache>.gpus``) are judged like counted passes, each class against its own baseline figure
  (``gpu_passes``, keyed by GPU class within the counted entry): measure ``gpus``, one part per class.
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
  matched to a vanished baseline op with the same counted passes (renamed between releases: its part's ``was``),
  else judged against 0 + ``ledger_tolerance`` (its part is ``new``): a new op with clearly positive timed passes
  is a regression. A known op above its allowed value is inconclusive, not red: a single op's timed passes vary
  between sessions more than the whole step's (docs/gate.md), and the whole step's timed passes judge it. Drift
  makes every op compared with a baseline figure inconclusive, but not a new op: a change of the machine's speed
  scales an op's time, it cannot make an op appear; a new op is then judged against ``ledger_tolerance`` ×
  (1 + the drift). Ops that move no cache bytes (weights, norms), the unattributed time and the other ops are
  shown, not judged: their slopes are noise around 0 that one slow moment during the profiled steps can tilt.
- Drift invalidates, it does not accuse: beyond ``max_drift`` the timed verdicts are inconclusive and
  the build does not fail on it unless ``strict``. The same holds across sessions: when the run reads its
  weights more than ``max_drift`` faster or slower than the run its timed baseline came from
  (:func:`speed_shift`), its timed verdicts against that baseline are inconclusive.

Each measure's judge is in :mod:`kvcache.analysing.judges`; this module applies them to every class of a run
(:func:`judge_run`) and walks the verdicts (:func:`failures`, :func:`status_of`).
"""

from __future__ import annotations

import math

from kvcache.analysing.entries import BaselineEntry
from kvcache.analysing.judges import (
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
from kvcache.analysing.measure_table import EXACT_VERDICTS, VERDICT_NAMES
from kvcache.analysing.records import KV, Drift, Point, Speed, UnmeasuredDrift, Verdict
from kvcache.analysing.rules import Rules


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

    ``baseline`` is ``{measure: {cache: entry}}`` (:func:`kvcache.analysing.baseline.for_run`), ``keys`` the
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


def failures(verdicts: dict[str, dict[str, Verdict]], *, drift: Drift | UnmeasuredDrift | None = None,
             strict: bool = False) -> list[str]:
    """One line per reason the build fails, walking ``kv.verdict.<cache>.<measure>``: every regression;
    with ``strict`` also every inconclusive timed verdict, every measure of a skipped class the baseline holds a
    figure for (:func:`unmeasured_baselined`) and a drift beyond its limit."""
    lines = []
    for cache, measures in verdicts.items():
        for measure, v in measures.items():
            unsure = measure not in EXACT_VERDICTS and v.status == "inconclusive"
            if v.status == "regression" or (strict and (unsure or unmeasured_baselined(v))):
                lines.append(f"kv-cache {v.status}: {cache} {measure}: {v.reason}")
    problem = drift_problem(drift)
    if strict and problem and not any("drift" in line for line in lines):
        lines.append(f"kv-cache drift (--kv-strict): {problem}")
    return lines


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
