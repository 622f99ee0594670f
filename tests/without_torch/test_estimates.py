"""kvcache.analysing.estimates: the one home of the median, percentile intervals, bootstrap medians and what counts
as a number; no other module of the package defines them."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from kvcache.analysing import estimates as stats

PACKAGE = Path(__file__).resolve().parents[2] / "kvcache"
SHARED = ("median", "finite", "percentile_interval", "bootstrap_medians")


def test_median_of_odd_and_even_counts():
    assert stats.median([3, 1, 2]) == 2.0
    assert stats.median([4, 1, 3, 2]) == 2.5
    assert stats.median(np.array([0.5, 0.25])) == 0.375
    with pytest.raises(ValueError, match="empty"):
        stats.median([])


@pytest.mark.parametrize("value", [None, True, "3", math.nan, math.inf, -math.inf, [1.0]])
def test_finite_refuses_what_is_not_a_finite_number(value):
    assert stats.finite(value) is None


def test_finite_accepts_ints_floats_and_numpy_numbers():
    assert stats.finite(3) == 3.0 and isinstance(stats.finite(3), float)
    assert stats.finite(np.int64(7)) == 7.0 and stats.finite(np.float32(0.5)) == 0.5


def test_percentile_interval_ignores_non_finite_values():
    values = np.array([1.0, 2.0, 3.0, 4.0, 5.0, np.nan, np.inf])
    assert stats.percentile_interval(values, 0, 100) == (1.0, 5.0)
    assert stats.percentile_interval(values, 25, 75) == (2.0, 4.0)
    lo, hi = stats.percentile_interval(np.array([np.nan]), 2.5, 97.5)
    assert math.isnan(lo) and math.isnan(hi)


def test_bootstrap_medians_are_seeded_medians_of_resamples():
    samples = np.array([1.0, 2.0, 3.0, 10.0])
    first = stats.bootstrap_medians(samples, 500, np.random.default_rng(3))
    again = stats.bootstrap_medians(samples, 500, np.random.default_rng(3))
    assert first.shape == (500,) and np.array_equal(first, again)
    assert first.min() >= 1.0 and first.max() <= 10.0 and len(set(first.tolist())) > 1
    assert set(stats.bootstrap_medians(np.full(5, 2.0), 10, np.random.default_rng(0))) == {2.0}


def test_the_statistics_are_defined_only_in_stats():
    """One home: no other module of the package defines its own median, interval or number test."""
    homes: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in SHARED:
                homes.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    assert homes == {name: ["analysing/estimates.py"] for name in SHARED}
