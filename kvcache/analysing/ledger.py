"""The per-op timed ledger, analysed: timed passes per op (``kv.ledger.<cache>.<row>``, a
:class:`~kvcache.analysing.records.timed.LedgerRow`) from the profiled steps (``kv.ledger_points``), each op's
seconds per step fitted against KV bytes like a whole step; rows for the named ops, :data:`OTHER`,
:data:`UNATTRIBUTED`, :data:`PROFILED_STEP` (with ``over_plain``) and :data:`PLAIN_STEP` (docs/gate.md, "Per-op timed
ledger"). Analysing wing: no torch."""

from __future__ import annotations

from kvcache.analysing.estimates import median
from kvcache.analysing.fit import FitError, slope_passes
from kvcache.analysing.options import CONFIDENCE, RESAMPLES
from kvcache.analysing.records.context import RunSettings
from kvcache.analysing.records.counted import Traffic
from kvcache.analysing.records.timed import LedgerPoint, LedgerRow, Point, Speed

OTHER = "(other ops)"
UNATTRIBUTED = "(unattributed)"
PROFILED_STEP = "(profiled step)"
PLAIN_STEP = "(plain step)"
SPECIAL = (OTHER, UNATTRIBUTED, PROFILED_STEP, PLAIN_STEP)
ADDS_UP = 0.15  # the profiled step within this fraction of the plain steps at every context: the ledger adds up
KEEP = 0.05  # timed passes below this, in size, go into OTHER unless the counted breakdown names the op
WEIGHT_OPS = ("linear",)  # the ops that read the weights: their time does not depend on the cache

Series = list[tuple[LedgerPoint, list[float]]]


def op_series(records: list[LedgerPoint]) -> dict[str, Series]:
    """Per row: (profiled point, seconds per step) of every point, ops absent from a point at 0."""
    ops = list(dict.fromkeys(op for r in records for op in r.ops_s))
    out: dict[str, Series] = {op: [] for op in ops}
    out[UNATTRIBUTED], out[PROFILED_STEP] = [], []
    for r in records:
        steps = len(r.step_s)
        for op in ops:
            out[op].append((r, list(r.ops_s.get(op) or [0.0] * steps)))
        attributed = [sum(values[i] for values in r.ops_s.values()) for i in range(steps)]
        out[UNATTRIBUTED].append((r, [t - a for t, a in zip(r.step_s, attributed)]))
        out[PROFILED_STEP].append((r, list(r.step_s)))
    if records and all(r.plain_s for r in records):
        out[PLAIN_STEP] = [(r, list(r.plain_s)) for r in records]
    return out


def step_over_plain(record: LedgerPoint) -> float | None:
    """The profiled step over the plain step of one point, minus 1: the median of each profiled step over the plain
    step taken just before it (steps alternate, ``kvcache.measuring.ledger.blocks``: a slower moment of the machine
    touches both of a pair), or the median over the median where the two differ in number; None without both."""
    if not record.step_s or not record.plain_s:
        return None
    if len(record.step_s) == len(record.plain_s) and all(p > 0 for p in record.plain_s):
        return median([s / p for s, p in zip(record.step_s, record.plain_s)]) - 1
    plain = median(record.plain_s)
    return median(record.step_s) / plain - 1 if plain > 0 else None


def over_plain(records: list[LedgerPoint]) -> dict[str, float] | None:
    """Per context (tokens, as a string, in order): :func:`step_over_plain`; None when no point has plain steps."""
    gaps = sorted((int(r.context), gap) for r in records if (gap := step_over_plain(r)) is not None)
    return {str(context): gap for context, gap in gaps} or None


def _points(name: str, entries: Series) -> list[Point]:
    return [Point(cache=name, context=int(r.context), round=0, kv_bytes=float(r.kv_bytes), samples_s=list(values))
            for r, values in entries]


def _row(points: list[Point], copy_samples: list[float], settings: RunSettings) -> LedgerRow:
    passes, (lo, hi), _ = slope_passes(
        points, copy_samples, confidence=CONFIDENCE if settings.confidence is None else settings.confidence,
        resamples=RESAMPLES if settings.resamples is None else settings.resamples, seed=settings.seed or 0)
    largest = max(points, key=lambda p: p.kv_bytes)
    return LedgerRow.of(timed=passes, timed_ci=[lo, hi], ms=largest.median_s * 1e3)


def class_rows(records: list[LedgerPoint], copy_samples: list[float], counted_by_op: dict[str, float],
               settings: RunSettings) -> dict[str, LedgerRow]:
    """``{row: LedgerRow}`` of one class (see the module docstring); FitError when its profiled contexts give no
    line (fewer than 3, no copy bandwidth)."""
    out: dict[str, LedgerRow] = {}
    other: Series = []
    for name, entries in op_series(records).items():
        row = _row(_points(name, entries), copy_samples, settings)
        if name in SPECIAL or name in counted_by_op or abs(row.timed) >= KEEP:
            out[name] = row
        elif not other:
            other = [(r, list(values)) for r, values in entries]
        else:
            other = [(r, [a + b for a, b in zip(acc, values)]) for (r, acc), (_, values) in zip(other, entries)]
    if other:
        out[OTHER] = _row(_points(OTHER, other), copy_samples, settings)
    gaps = over_plain(records)
    if gaps is not None:
        out[PROFILED_STEP].update(over_plain=gaps)
    ordered = sorted((k for k in out if k not in SPECIAL), key=lambda k: -out[k].timed)
    return {k: out[k] for k in [*ordered, *(s for s in SPECIAL if s in out)]}


def ledger_rows(records: list[LedgerPoint], copy_samples: list[float], traffic: dict[str, Traffic],
                settings: RunSettings) -> tuple[dict[str, dict[str, LedgerRow]], dict[str, str]]:
    """(``kv.ledger``, ``{cache: why there is no ledger}``) from a session's profiled points."""
    by_cache: dict[str, list[LedgerPoint]] = {}
    for r in records:
        by_cache.setdefault(r.cache, []).append(r)
    ledgers, errors = {}, {}
    for cache, mine in by_cache.items():
        try:
            if not copy_samples:
                raise FitError("no copy bandwidth was measured in this run, so op times cannot be turned into passes")
            counted_by_op = traffic[cache].by_op if cache in traffic else {}
            ledgers[cache] = class_rows(mine, copy_samples, counted_by_op, settings)
        except FitError as exc:
            errors[cache] = f"no ledger: {exc}"
    return ledgers, errors


def speed(records: list[LedgerPoint]) -> Speed | None:
    """``kv.speed``: ``weights_ms``, the median over every profiled step of every class and context of the time
    (ms) of the ops that read the weights (:data:`WEIGHT_OPS`): a measure of the machine's decode speed taken in
    the run itself, which the gate compares with the baseline's (a copy benchmark need not follow it); None
    without profiled steps of those ops."""
    per_step = [sum(r.ops_s[op][i] for op in WEIGHT_OPS if op in r.ops_s)
                for r in records for i in range(len(r.step_s)) if any(op in r.ops_s for op in WEIGHT_OPS)]
    if not per_step:
        return None
    return Speed(weights_ms=median(per_step) * 1e3, ops=list(WEIGHT_OPS), steps=len(per_step))
