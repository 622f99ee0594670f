"""The statistics every figure of the suite is made of, in one place: the median (of step times in seconds, of
copy bandwidths in GB/s), percentile intervals and bootstrap medians (for the passes interval), and the test of
what counts as a number. Unit-free: each function returns values in the unit it was given. numpy and stdlib only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np


def median(values: Iterable[Any]) -> float:
    """Median of a non-empty sequence of numbers (the mean of the middle two for an even count)."""
    data = sorted(float(v) for v in values)
    if not data:
        raise ValueError("median of an empty sequence")
    mid = len(data) // 2
    return data[mid] if len(data) % 2 else (data[mid - 1] + data[mid]) / 2


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number; None for None, bools, text, NaN, infinities and integers too
    large for a float (``10**400``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value) if math.isfinite(value) else None
    except OverflowError:
        return None


def interval(value: Any) -> tuple[float, float] | None:
    """``value`` as a ``(low, high)`` interval when it is a pair of finite numbers (a recorded ``*_ci``); None for
    anything else (a missing bound, NaN, text, another length)."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    lo, hi = finite(value[0]), finite(value[1])
    return None if lo is None or hi is None else (lo, hi)


def percentile_interval(values: np.ndarray, lower: float, upper: float) -> tuple[float, float]:
    """(lower, upper) percentiles (0-100) of the finite values; (nan, nan) when there are none."""
    finite_values = values[np.isfinite(values)]
    if finite_values.size == 0:
        return (math.nan, math.nan)
    lo, hi = np.percentile(finite_values, [lower, upper])
    return (float(lo), float(hi))


def bootstrap_medians(samples: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` medians of ``samples`` resampled with replacement (same size as ``samples``)."""
    picks = rng.integers(0, samples.size, size=(count, samples.size))
    return np.median(samples[picks], axis=1)
