"""Passes from timed points: the line of step latency against KV-cache bytes, and its bootstrap interval.

A decode step that moves its KV cache ``passes`` times through memory costs
``passes * kv_bytes / copy_bandwidth`` seconds more than a step with an empty cache, so the slope of
latency (s) against logical KV bytes (bytes) is seconds per byte, its inverse is the effective
bandwidth (bytes/s) and ``passes = slope * copy_bandwidth``. Bandwidths are in GB/s (1e9 bytes/s) and
count bytes read plus bytes written, like the copy they are compared with. numpy and stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvcache.analysing.bandwidth import crossover_context
from kvcache.analysing.estimates import bootstrap_medians, finite, median, percentile_interval
from kvcache.analysing.options import CONFIDENCE, RESAMPLES
from kvcache.analysing.records.jsonrecord import jsonable
from kvcache.analysing.records.timed import Drift, Fit, FitFailure, Point

GB = 1e9
MS_PER_S = 1e3
# Two points always lie on a line (R² 1.000 whatever they are): a third context is what lets the fit be judged.
MIN_CONTEXTS = 3
NO_FIGURE = "no passes figure"


class FitError(ValueError):
    """The points cannot be fitted (too few distinct contexts, no copy bandwidth, ...); one-line message."""


@dataclass(frozen=True)
class LineFit:
    """Ordinary least squares ``y = intercept + slope * x`` over ``n`` points, with its R²."""

    intercept: float
    slope: float
    r2: float
    n: int


def least_squares(x: Sequence[float], y: Sequence[float]) -> LineFit:
    """Least-squares line through (x, y); FitError when x has fewer than two distinct values."""
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise FitError(f"x and y must be equal-length sequences, got {xs.shape} and {ys.shape}")
    distinct = len(np.unique(xs))
    if distinct < 2:
        raise FitError(f"needs at least two distinct contexts, got {distinct}")
    dx = xs - xs.mean()
    dy = ys - ys.mean()
    slope = float(np.dot(dx, dy) / np.dot(dx, dx))
    intercept = float(ys.mean() - slope * xs.mean())
    ss_res = float(np.sum((dy - slope * dx) ** 2))
    ss_tot = float(np.sum(dy**2))
    if ss_tot == 0:
        r2 = 1.0 if ss_res == 0 else 0.0
    else:
        r2 = 1.0 - ss_res / ss_tot
    return LineFit(intercept=intercept, slope=slope, r2=r2, n=len(xs))


def fit_passes(
    points: Sequence[Point],
    copy_samples_gbps: Sequence[float],
    *,
    bytes_per_token: int,
    weight_bytes: int,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Fit:
    """Fit the passes of one cache class from its timed points and the session's copy bandwidth samples.

    The point estimate fits every (context, round) point's median step time (s) against its
    ``kv_bytes``; the copy bandwidth is the median of ``copy_samples_gbps``. The intervals come from a
    seeded hierarchical bootstrap (rounds within each context, then steps within each round, plus the
    copy samples), see :func:`bootstrap_lines`. The figure is a :class:`~kvcache.analysing.records.timed.Fit`: passes =
    slope (s/byte) × copy bandwidth (bytes/s), ``intercept_ms`` the step with an empty cache (ms),
    ``effective_gbps`` 1 / slope (GB/s), ``*_ci`` bootstrap percentile intervals at ``confidence`` (a resampled line
    may fall, so the passes interval may reach 0 or below and a bandwidth bound be None), ``weight_read_ms`` the time
    to move the weights once at the copy bandwidth, ``crossover_tokens`` the context at which the step's cache
    traffic equals ``weight_bytes``.

    No passes figure (FitError, one line saying why) from fewer than ``MIN_CONTEXTS`` distinct contexts,
    from step times that are not finite, or from a slope that is not positive and finite.
    """
    if not 0 < confidence < 1:
        raise FitError(f"confidence must be between 0 and 1, got {confidence}")
    if resamples < 1:
        raise FitError(f"resamples must be at least 1, got {resamples}")
    caches = sorted({p.cache for p in points})
    if len(caches) > 1:
        raise FitError(f"points of one cache class expected, got {', '.join(caches)}")
    contexts = sorted({p.context for p in points})
    if len(contexts) < MIN_CONTEXTS:
        raise FitError(too_few_contexts(len(contexts)))
    flat = not_growing(points)
    if flat:
        raise FitError(flat)
    copy_samples = np.asarray(copy_samples_gbps, dtype=np.float64) * GB
    if copy_samples.size == 0 or not np.all(np.isfinite(copy_samples)) or median(copy_samples) <= 0:
        raise FitError("needs positive, finite copy bandwidth samples")
    check_finite(points)

    line = least_squares([p.kv_bytes for p in points], [p.median_s for p in points])
    copy_bps = median(copy_samples)
    check_slope(line.slope)
    passes = line.slope * copy_bps
    if not (math.isfinite(passes) and passes > 0):  # a positive slope too small or large for floats
        raise FitError(f"passes {passes} is not positive and finite; {NO_FIGURE}")

    rng = np.random.default_rng(seed)
    slopes, intercepts = bootstrap_lines(points, resamples, rng)
    copies = bootstrap_medians(copy_samples, resamples, rng)
    lower, upper = 50 * (1 - confidence), 50 * (1 + confidence)
    passes_ci = percentile_interval(slopes * copies, lower, upper)
    slope_lo, slope_hi = percentile_interval(slopes, lower, upper)

    lo, hi = passes_ci
    fit = Fit(**jsonable({  # a bound that is not finite is None, as the record is written
        "passes": passes,
        "intercept_ms": line.intercept * MS_PER_S,
        "effective_gbps": gbps_from_slope(line.slope),
        "passes_ci": passes_ci,
        "r2": line.r2,
        "n_points": len(points),
        "cache": caches[0],
        "slope_ms_per_gb": line.slope * MS_PER_S * GB,
        "contexts": contexts,
        "copy_gbps": copy_bps / GB,
        "intercept_ci": tuple(v * MS_PER_S for v in percentile_interval(intercepts, lower, upper)),
        "effective_gbps_ci": (gbps_from_slope(slope_hi), gbps_from_slope(slope_lo)),
        "confidence": confidence,
        "resamples": resamples,
        "weight_read_ms": weight_bytes / copy_bps * MS_PER_S,
        "crossover_tokens": crossover_context(weight_bytes, bytes_per_token, passes),
        "ci_relative_width": (hi - lo) / passes,  # passes > 0 here
    }))
    per_token = per_token_figures(points, passes, passes_ci)
    if per_token:
        fit.update(**jsonable(per_token))
    return fit


#: Two points' tokens per step are the same figure within this relative difference (a mean of whole tokens).
SAME_TOKENS = 1e-9


def per_token_figures(points: Sequence[Point], passes: float, passes_ci: Sequence[float]) -> dict[str, object]:
    """The fit's figures per generated token where the points gained several tokens a step (their
    ``tokens_per_step``): ``tokens_per_step``, ``passes_per_token`` = passes / tokens and ``passes_per_token_ci``
    (the passes interval over the same tokens) when every point gained the same; ``per_token_problem`` (why there is
    none) when they differ, never a figure of mixed steps; nothing when no point says (one token a step)."""
    tokens = [p.tokens_per_step for p in points if p.tokens_per_step is not None]
    if not tokens:
        return {}
    if len(tokens) < len(points):
        return {"per_token_problem": f"tokens per step known at {len(tokens)} of {len(points)} points; no timed "
                                     "passes per generated token"}
    first = tokens[0]
    if not (math.isfinite(first) and first > 0):
        return {"per_token_problem": f"tokens per step {first:g} is not positive; no timed passes per generated "
                                     "token"}
    if any(abs(t - first) > SAME_TOKENS * abs(first) for t in tokens):
        seen = ", ".join(f"{t:g} at {p.context} (round {p.round})" for p, t in distinct_tokens(points))
        return {"per_token_problem": f"tokens per step differ between points: {seen}; no timed passes per generated "
                                     "token (steps of different gains are not one line)"}
    return {"tokens_per_step": first, "passes_per_token": passes / first,
            "passes_per_token_ci": tuple(bound / first for bound in passes_ci)}


def distinct_tokens(points: Sequence[Point]) -> list[tuple[Point, float]]:
    """The first point of each different ``tokens_per_step`` (within :data:`SAME_TOKENS`), in the points' order."""
    out: list[tuple[Point, float]] = []
    for p in points:
        t = p.tokens_per_step
        if t is not None and all(abs(t - seen) > SAME_TOKENS * abs(seen) for _, seen in out):
            out.append((p, t))
    return out


def slope_passes(points: Sequence[Point], copy_samples_gbps: Sequence[float], *, confidence: float = CONFIDENCE,
                 resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, tuple[float, float], float]:
    """(passes, interval, R²) of any series of per-step times against KV bytes: the slope × the median copy
    bandwidth, the interval from the same hierarchical bootstrap as :func:`fit_passes`. Unlike a whole
    step's passes, the figure may be zero or negative (an op whose time does not grow with context).
    FitError on fewer than MIN_CONTEXTS contexts, no copy bandwidth, or times that are not finite."""
    contexts = sorted({p.context for p in points})
    if len(contexts) < MIN_CONTEXTS:
        raise FitError(too_few_contexts(len(contexts)))
    copy_samples = np.asarray(copy_samples_gbps, dtype=np.float64) * GB
    if copy_samples.size == 0 or not np.all(np.isfinite(copy_samples)) or median(copy_samples) <= 0:
        raise FitError("needs positive, finite copy bandwidth samples")
    check_finite(points)
    line = least_squares([p.kv_bytes for p in points], [p.median_s for p in points])
    rng = np.random.default_rng(seed)
    slopes, _ = bootstrap_lines(points, resamples, rng)
    copies = bootstrap_medians(copy_samples, resamples, rng)
    lower, upper = 50 * (1 - confidence), 50 * (1 + confidence)
    lo, hi = percentile_interval(slopes * copies, lower, upper)
    return line.slope * median(copy_samples), (lo, hi), line.r2


def not_growing(points: Sequence[Point]) -> str | None:
    """Why the points give no line when the cache holds the same KV bytes at several of their contexts (every layer
    past its sliding window), so that fewer than MIN_CONTEXTS distinct sizes remain; None otherwise. Such a range is
    reported as a cache that does not grow, not as a poor fit."""
    by_size: dict[float, list[int]] = {}
    for p in points:
        by_size.setdefault(round(p.kv_bytes), [])
        if p.context not in by_size[round(p.kv_bytes)]:
            by_size[round(p.kv_bytes)].append(p.context)
    if len(by_size) >= MIN_CONTEXTS or all(len(c) < 2 for c in by_size.values()):
        return None
    size = max(by_size, key=lambda k: len(by_size[k]))
    same = by_size[size]
    return (f"the cache does not grow from {min(same)} to {max(same)} tokens (it holds {size:,.0f} "
            f"KV bytes at each: every layer is past its sliding window); {len(by_size)} distinct cache sizes, a line "
            f"needs {MIN_CONTEXTS}: measure contexts below the window")


def too_few_contexts(count: int) -> str:
    """Why ``count`` distinct contexts (fewer than MIN_CONTEXTS) give no passes figure."""
    return f"needs at least {MIN_CONTEXTS} distinct contexts for a line that can be judged, got {count}"


def check_finite(points: Sequence[Point]) -> None:
    """FitError naming the contexts whose step times or KV bytes are NaN or infinite."""
    bad = sorted({p.context for p in points
                  if not (math.isfinite(p.kv_bytes) and all(math.isfinite(s) for s in p.samples_s))})
    if bad:
        where = ", ".join(str(c) for c in bad)
        raise FitError(f"step times are not finite (NaN or inf) at context {where}; {NO_FIGURE}")


def check_slope(slope_s_per_byte: float) -> None:
    """FitError unless the slope (s/byte) is positive and finite: latency must grow with context."""
    if not math.isfinite(slope_s_per_byte):
        raise FitError(f"slope is not finite ({slope_s_per_byte}); {NO_FIGURE}")
    if slope_s_per_byte <= 0:
        as_bandwidth = f"{1 / slope_s_per_byte / GB:.2f} GB/s" if slope_s_per_byte else "0 ms per GB"
        raise FitError(f"slope is not positive ({as_bandwidth}): latency did not grow with context; {NO_FIGURE}")


def record_problem(fit: Fit | FitFailure, *, named_contexts: bool = False) -> str | None:
    """Why a ``kv.fit.<cache>`` record gives no passes figure, or None when it gives one.

    Its ``error`` where the analysis recorded one; for runs written before fits were checked, the same
    rules applied to what the record holds (passes not positive and finite, fewer than MIN_CONTEXTS
    distinct contexts; with ``named_contexts``, a fit that does not name its contexts has none)."""
    if isinstance(fit, FitFailure):
        return fit.error
    # a record with only the bandwidth: passes = copy bandwidth / effective bandwidth
    passes = fit.passes if fit.passes is not None else fit.effective_gbps
    if finite(passes) is None:
        return f"passes are not a finite number; {NO_FIGURE}"
    if passes <= 0:
        return f"slope is not positive: latency did not grow with context; {NO_FIGURE}"
    contexts = [] if fit.contexts is None and named_contexts else fit.contexts
    if isinstance(contexts, list) and len(set(contexts)) < MIN_CONTEXTS:
        return too_few_contexts(len(set(contexts)))
    return None


def gbps_from_slope(slope_s_per_byte: float) -> float | None:
    """Effective bandwidth in GB/s of a slope in s/byte; None when the slope is not positive."""
    return 1 / slope_s_per_byte / GB if slope_s_per_byte > 0 else None


def context_draws(x: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``resamples`` draws, with replacement, of as many of the points at ``x`` (KV bytes, one point per
    context) as there are, each draw with two distinct sizes or more (a line needs two; a draw without is drawn
    again): the cases bootstrap of a line with one point per context, shape (resamples, len(x))."""
    picks = rng.integers(0, x.size, size=(resamples, x.size))
    if np.unique(x).size < 2:
        return picks
    while True:
        flat = (x[picks] == x[picks[:, :1]]).all(axis=1)
        if not flat.any():
            return picks
        picks[flat] = rng.integers(0, x.size, size=(int(flat.sum()), x.size))


def bootstrap_lines(points: Sequence[Point], resamples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Slopes (s/byte) and intercepts (s) of ``resamples`` hierarchical bootstrap refits.

    Per resample and per context, that context's rounds are drawn with replacement; each drawn round
    contributes the median of its per-step samples drawn with replacement (drawn afresh for every draw
    of the round) at its ``kv_bytes``. With one round per context (the per-op ledger's one profiled point,
    ``--kv-rounds 1``), drawing rounds cannot show how much a point measured again would move (on the developers'
    CPU, 10-30% for one profiled point), while its steps vary far less: the contexts themselves are drawn with
    replacement too (:func:`context_draws`), so that the points' scatter about the line is in the interval. All
    resamples are fitted at once.
    """
    by_context: dict[int, list[Point]] = {}
    for point in points:
        by_context.setdefault(point.context, []).append(point)
    xs, ys = [], []
    for rounds in by_context.values():
        picks = rng.integers(0, len(rounds), size=(resamples, len(rounds)))
        x = np.empty(picks.shape)
        y = np.empty(picks.shape)
        for index, point in enumerate(rounds):
            chosen = picks == index
            x[chosen] = point.kv_bytes
            y[chosen] = bootstrap_medians(np.asarray(point.samples_s, dtype=np.float64), int(chosen.sum()), rng)
        xs.append(x)
        ys.append(y)
    x = np.concatenate(xs, axis=1)
    y = np.concatenate(ys, axis=1)
    if len(by_context) >= 2 and all(len(rounds) == 1 for rounds in by_context.values()):
        picks = context_draws(x[0], resamples, rng)
        x, y = np.take_along_axis(x, picks, axis=1), np.take_along_axis(y, picks, axis=1)
    dx = x - x.mean(axis=1, keepdims=True)
    dy = y - y.mean(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        slopes = np.sum(dx * dy, axis=1) / np.sum(dx * dx, axis=1)
    intercepts = y.mean(axis=1) - slopes * x.mean(axis=1)
    return slopes, intercepts


def measure_drift(first: Point, last: Point, max_fraction: float) -> Drift:
    """``kv.drift``: the relative change of the median step time (ms) between two measurements of the same point,
    ``fraction`` = last / first - 1 (inf when the first is 0 ms; written as null), ``ok`` when within
    ``max_fraction``; ``effect``: what a drift beyond the limit does (it invalidates timed verdicts; it fails the build
    only under ``--kv-strict``)."""
    if (first.cache, first.context) != (last.cache, last.context):
        raise ValueError(
            f"drift compares one point twice, got {first.cache}@{first.context} and {last.cache}@{last.context}"
        )
    first_s, last_s = first.median_s, last.median_s
    fraction = last_s / first_s - 1 if first_s > 0 else math.inf
    return Drift(
        cache=first.cache,
        context=first.context,
        first_ms=first_s * MS_PER_S,
        last_ms=last_s * MS_PER_S,
        fraction=fraction,
        max_fraction=max_fraction,
        ok=abs(fraction) <= max_fraction,
        effect=("none: within the limit" if abs(fraction) <= max_fraction else
                "timed verdicts are inconclusive; the build fails on drift only with --kv-strict"),
    )
