"""What a decoding strategy adds to a key's counted traffic (``kv.traffic.<cache>#<strategy>``): the strategy, the
rows its cache holds, tokens per step and passes per generated token, and the step's passes by phase (the model's
forward, the reorder, the crop, the draft), each a slope between the counted contexts over the same denominator as
the step's passes (Δ logical KV bytes all live sequences hold)."""

from __future__ import annotations

from typing import Any

from kvcache.analysing.decoding import PHASES
from kvcache.analysing.records.counted import PhaseTraffic, Traffic
from kvcache.measuring.counting.traffic import TrafficCount, op_passes
from kvcache.measuring.decoding.base import OTHER, DecodingStrategy


def outside_phases(count: TrafficCount) -> TrafficCount:
    """The ops of ``count`` charged to none of the phases (:data:`OTHER`): per op, the step's bytes less those of every
    phase scope (phases do not nest: the forward, a reorder, a crop and a draft run one after another)."""
    out = TrafficCount()
    for name, op in count.ops.items():
        read, written, calls = op.read, op.written, op.calls
        for label in PHASES:
            part = count.scopes[label].ops.get(name) if label in count.scopes else None
            if part is not None:
                read, written, calls = read - part.read, written - part.written, calls - part.calls
        if calls > 0 or read or written:
            entry = out.ops[name]
            entry.calls, entry.read, entry.written = calls, read, written
    return out


def phase_passes(counts: dict[int, TrafficCount], held: dict[int, float]) -> dict[str, PhaseTraffic]:
    """{phase: :class:`PhaseTraffic`} for every phase (:data:`PHASES`) some counted step charged an op to, and
    :data:`OTHER` (what none was charged)."""
    contexts = sorted(counts)
    lo, hi = contexts[0], contexts[-1]
    delta = held[hi] - held[lo]
    out = {}
    for label in PHASES:
        if not delta or (label != OTHER and not any(label in counts[c].scopes for c in contexts)):
            continue
        step = {c: outside_phases(counts[c]) if label == OTHER else counts[c].scope(label) for c in contexts}
        out[label] = PhaseTraffic.of(passes=(step[hi].total - step[lo].total) / delta,
                                     by_op=op_passes(step[lo], step[hi], delta),
                                     step_bytes={str(c): step[c].total for c in contexts})
    return out


def add_strategy(strategy: DecodingStrategy, counts: dict[int, TrafficCount], held: dict[int, float],
                 tokens_per_step: float, result: Traffic) -> None:
    """Set ``strategy``, ``rows``, ``tokens_per_step``, ``passes_per_token`` and ``phases`` on ``result``."""
    passes = result.passes
    result.update(strategy=strategy.name, rows=strategy.rows(), tokens_per_step=tokens_per_step,
                  passes_per_token=passes / tokens_per_step if passes is not None and tokens_per_step else None,
                  phases=phase_passes(counts, held))


def scopes_with(strategy: DecodingStrategy, session: Any, scopes: dict[Any, str]) -> dict[Any, str]:
    """The counted step's module scopes with the strategy's own (a draft model)."""
    return {**scopes, **strategy.scopes(session)}
