"""What a step's bytes mean against the machine and the model: the bandwidth a step achieves (GB/s = 1e9 bytes/s,
bytes read + written) and its share of the copy bandwidth, and the crossovers, the contexts (tokens) at which
the cache's bytes or a step's cache traffic equal the weights' bytes. Stdlib only."""

from __future__ import annotations

from kvcache.analysing.estimates import finite
from kvcache.analysing.records.context import ModelGeometry
from kvcache.analysing.records.counted import Memory, Traffic
from kvcache.analysing.records.timed import CacheCrossovers, Crossovers, Fit, FitFailure


def achieved_gbps(counted_bytes: float | None, median_step_s: float | None) -> float | None:
    """Achieved bandwidth of a decode step in GB/s (1e9 bytes/s): its counted bytes (read + write) over its
    median time in seconds; None when either is missing or not positive."""
    moved, seconds = finite(counted_bytes), finite(median_step_s)
    return moved / seconds / 1e9 if moved and seconds and moved > 0 and seconds > 0 else None


def achieved_fraction(achieved: float | None, copy_gbps: float | None) -> float | None:
    """The achieved bandwidth's share of the copy bandwidth (both GB/s, read + write): memory-bandwidth
    utilisation. The analysis sets it against the session's median copy bandwidth (``kv.copy_gbps``), the
    same one the timed passes are; None when either is missing or not positive."""
    achieved, copy = finite(achieved), finite(copy_gbps)
    return achieved / copy if achieved and copy and achieved > 0 and copy > 0 else None


def crossover_context(weight_bytes: float | None, bytes_per_token: float | None,
                      passes: float | None = 1.0) -> float | None:
    """The context (tokens) at which ``passes`` × the cache's bytes equal the weights' bytes:
    ``weight_bytes / (passes × bytes_per_token)``. With ``passes`` 1, where the cache holds as many bytes as the
    weights; with a step's passes, where its cache traffic equals one read of the weights. None when an input
    is missing or not positive."""
    values = [finite(v) for v in (weight_bytes, bytes_per_token, passes)]
    if any(v is None or v <= 0 for v in values):
        return None
    weights, per_token, times = values
    return weights / (times * per_token)


def crossovers(model: ModelGeometry, fits: dict[str, Fit | FitFailure], traffic: dict[str, Traffic],
               memory: dict[str, Memory]) -> Crossovers:
    """``kv.crossovers``: the context (tokens) at which the cache holds as many bytes as the weights (logical KV
    bytes, ``model.weight_bytes`` / ``model.bytes_per_token``), and per class the contexts at which a step's cache
    traffic equals one read of the weights, from the timed passes (``kv.fit``) and from the counted ones
    (``kv.traffic``), and at which the bytes the class really holds (``kv.memory.<cache>.held_passes`` × the
    logical KV bytes) equal the weights (``held_tokens``); None where there is no figure. One rule for all:
    :func:`crossover_context`."""
    weights, per_token = model.weight_bytes, model.bytes_per_token
    out = Crossovers(cache_holds_weights_tokens=crossover_context(weights, per_token))
    for cache in dict.fromkeys([*fits, *traffic]):
        fit, counted = fits.get(cache), traffic.get(cache)
        out.by_cache[cache] = CacheCrossovers(
            timed_tokens=crossover_context(weights, per_token, fit.passes if isinstance(fit, Fit) else None),
            counted_tokens=crossover_context(weights, per_token, counted.passes if counted else None))
        held = memory[cache].held_passes if cache in memory else None
        if held is not None:
            out.by_cache[cache].held_tokens = crossover_context(weights, per_token, held)
    return out
