"""The per-op timed ledger, analysed: timed passes per op from profiled steps. Analysing wing: no torch.

Input: the ``ledger`` records of a session (``kvcache.measuring.ledger``): per (cache, context), the seconds
of every profiled step and of each op in it. Per class and op, the op's seconds per step are fitted against
KV bytes like a whole step (:func:`kvcache.analysing.fit.slope_passes`: slope × the session's copy
bandwidth, a bootstrap interval; the figure may be zero or negative). Rows:

- each op whose timed passes reach :data:`KEEP` in size, or that the counted breakdown names;
- :data:`OTHER`: the remaining ops, summed per step;
- :data:`UNATTRIBUTED`: the profiled step's time minus every op's (Python, dispatcher, hooks);
- :data:`STEP`: the profiled step as a whole (= the sum of the rows above, under the profiler).

Output, ``kv.ledger.<cache>.<row>`` = ``{timed, timed_ci, ms}`` (``ms``: median milliseconds per step at the
largest profiled context); the counted passes of the same op are in ``kv.traffic.<cache>.by_op``.
"""

from __future__ import annotations

from typing import Any

from kvcache.analysing.fit import FitError, slope_passes
from kvcache.analysing.records import Point
from kvcache.analysing.stats import median

OTHER = "(other ops)"
UNATTRIBUTED = "(unattributed)"
STEP = "(profiled step)"
SPECIAL = (OTHER, UNATTRIBUTED, STEP)
KEEP = 0.05  # timed passes below this, in size, go into OTHER unless the counted breakdown names the op


def series(records: list[dict[str, Any]]) -> dict[str, list[tuple[dict[str, Any], list[float]]]]:
    """Per row: (record, seconds per step) of every record, ops absent from a record at 0."""
    ops = list(dict.fromkeys(op for r in records for op in r["ops_s"]))
    out: dict[str, list[tuple[dict[str, Any], list[float]]]] = {op: [] for op in ops}
    out[UNATTRIBUTED], out[STEP] = [], []
    for r in records:
        steps = len(r["step_s"])
        for op in ops:
            out[op].append((r, list(r["ops_s"].get(op) or [0.0] * steps)))
        attributed = [sum(values[i] for values in r["ops_s"].values()) for i in range(steps)]
        out[UNATTRIBUTED].append((r, [t - a for t, a in zip(r["step_s"], attributed)]))
        out[STEP].append((r, list(r["step_s"])))
    return out


def _points(name: str, entries: list[tuple[dict[str, Any], list[float]]]) -> list[Point]:
    return [Point(cache=name, context=int(r["context"]), round=0, kv_bytes=float(r["kv_bytes"]),
                  samples_s=tuple(values)) for r, values in entries]


def _row(points: list[Point], copy_samples: list[float], settings: dict[str, Any]) -> dict[str, Any]:
    passes, (lo, hi), _ = slope_passes(points, copy_samples, confidence=settings.get("confidence", 0.95),
                                       resamples=settings.get("resamples", 2000), seed=settings.get("seed", 0))
    largest = max(points, key=lambda p: p.kv_bytes)
    return {"timed": passes, "timed_ci": [lo, hi], "ms": largest.median_s * 1e3}


def analyse_cache(records: list[dict[str, Any]], copy_samples: list[float], counted_by_op: dict[str, float],
                  settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{row: {timed, timed_ci, ms}}`` of one class (see the module docstring); FitError when its profiled
    contexts give no line (fewer than 3, no copy bandwidth)."""
    rows = series(records)
    out: dict[str, dict[str, Any]] = {}
    other: list[tuple[dict[str, Any], list[float]]] = []
    for name, entries in rows.items():
        row = _row(_points(name, entries), copy_samples, settings)
        if name in SPECIAL or name in counted_by_op or abs(row["timed"]) >= KEEP:
            out[name] = row
        elif not other:
            other = [(r, list(values)) for r, values in entries]
        else:
            other = [(r, [a + b for a, b in zip(acc, values)]) for (r, acc), (_, values) in zip(other, entries)]
    if other:
        out[OTHER] = _row(_points(OTHER, other), copy_samples, settings)
    ordered = sorted((k for k in out if k not in SPECIAL), key=lambda k: -out[k]["timed"])
    return {k: out[k] for k in [*ordered, *(s for s in SPECIAL if s in out)]}


def analyse(records: list[dict[str, Any]], copy_samples: list[float], traffic: dict[str, dict[str, Any]],
            settings: dict[str, Any]) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, str]]:
    """(``kv.ledger``, ``{cache: why there is no ledger}``) from a session's ledger records."""
    by_cache: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_cache.setdefault(r["cache"], []).append(r)
    ledgers, errors = {}, {}
    for cache, mine in by_cache.items():
        try:
            if not copy_samples:
                raise FitError("no copy bandwidth was measured in this run, so op times cannot be turned into passes")
            ledgers[cache] = analyse_cache(mine, copy_samples, (traffic.get(cache) or {}).get("by_op") or {},
                                           settings)
        except FitError as exc:
            errors[cache] = f"no ledger: {exc}"
    return ledgers, errors


WEIGHT_OPS = ("linear",)  # the ops that read the weights: their time does not depend on the cache


def speed(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``kv.speed``: ``weights_ms``, the median over every profiled step of every class and context of the time
    (ms) of the ops that read the weights (:data:`WEIGHT_OPS`): a measure of the machine's decode speed taken in
    the run itself, which the gate compares with the baseline's (a copy benchmark need not follow it); None
    without profiled steps of those ops."""
    per_step = [sum(r["ops_s"][op][i] for op in WEIGHT_OPS if op in r["ops_s"])
                for r in records for i in range(len(r["step_s"])) if any(op in r["ops_s"] for op in WEIGHT_OPS)]
    if not per_step:
        return None
    return {"weights_ms": median(per_step) * 1e3, "ops": list(WEIGHT_OPS), "steps": len(per_step)}


def gap(ledger: dict[str, dict[str, Any]], timed_passes: float | None) -> float | None:
    """How far the profiled step's timed passes lie from the unprofiled whole step's: profiled / unprofiled - 1."""
    step = (ledger.get(STEP) or {}).get("timed")
    if step is None or not timed_passes:
        return None
    return step / timed_passes - 1
