"""kvcache.fit on synthetic runs whose true passes are known (tests/fakerun.py)."""

from __future__ import annotations

import math

import pytest
from fakerun import BYTES_PER_TOKEN, WEIGHT_BYTES, make_run

from kvcache.fit import FitError, PassesFit, fit_passes, least_squares, measure_drift
from kvcache.records import Point, points_from_benchmarks

CONTEXTS = (512, 1024, 2048, 3072, 4096, 6144, 8192)


def fitted(truth: float = 3.0, *, noise: float = 0.01, rounds: int = 3, steps: int = 50, seed: int = 0,
           contexts: tuple[int, ...] = CONTEXTS, fit_seed: int = 0, copy_gbps: float = 20.0) -> PassesFit:
    run = make_run({"dynamic": truth}, contexts=contexts, rounds=rounds, steps=steps, noise=noise, seed=seed,
                   copy_gbps=copy_gbps)
    points = points_from_benchmarks(run["benchmarks"])
    copy = run["kv"]["copy"]["measurements"][0]["samples_gbps"]
    return fit_passes(points, copy, bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES, seed=fit_seed)


def point(context: int, samples: tuple[float, ...], *, round: int = 0, cache: str = "dynamic") -> Point:
    return Point(cache=cache, context=context, round=round, kv_bytes=BYTES_PER_TOKEN * context, samples_s=samples)


def test_least_squares_exact_line():
    line = least_squares([1, 2, 3, 4], [3, 5, 7, 9])
    assert (line.intercept, line.slope, line.r2, line.n) == pytest.approx((1, 2, 1, 4))


def test_least_squares_flat_line_has_r2_one():
    assert least_squares([1, 2], [5, 5]).r2 == 1.0


def test_least_squares_needs_two_distinct_x():
    with pytest.raises(FitError, match="needs at least two distinct contexts, got 1"):
        least_squares([2, 2, 2], [1, 2, 3])


def test_passes_recovered_within_two_percent():
    fit = fitted(3.0)
    assert fit.passes == pytest.approx(3.0, rel=0.02)
    assert fit.intercept_ms == pytest.approx(30.0, rel=0.02)
    assert fit.copy_gbps == 20.0
    assert fit.effective_gbps == pytest.approx(20.0 / 3.0, rel=0.02)
    assert fit.slope_ms_per_gb == pytest.approx(3.0 / 20.0 * 1e3, rel=0.02)
    assert fit.r2 > 0.99
    assert fit.n_points == len(CONTEXTS) * 3
    assert fit.contexts == list(CONTEXTS)


def test_interval_contains_truth():
    fit = fitted(3.0)
    lo, hi = fit.passes_ci
    assert lo < 3.0 < hi
    assert lo < fit.passes < hi
    assert fit.intercept_ci[0] < 30.0 < fit.intercept_ci[1]
    eff_lo, eff_hi = fit.effective_gbps_ci
    assert eff_lo < 20.0 / 3.0 < eff_hi
    assert 0 < fit.ci_relative_width < 0.05


def test_bootstrap_is_deterministic_with_a_seed():
    assert fitted(fit_seed=7).to_dict() == fitted(fit_seed=7).to_dict()
    assert fitted(fit_seed=7).passes_ci != fitted(fit_seed=8).passes_ci


def test_derived_quantities():
    fit = fitted(3.0, noise=0.0)
    assert fit.passes == pytest.approx(3.0)
    assert fit.weight_read_ms == pytest.approx(WEIGHT_BYTES / 20e9 * 1e3)
    assert fit.crossover_tokens == pytest.approx(WEIGHT_BYTES / (3.0 * BYTES_PER_TOKEN))


def test_negative_slope_keeps_passes_but_no_bandwidth():
    points = [point(512, (0.03,)), point(1024, (0.02,))]
    fit = fit_passes(points, [20.0], bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES, resamples=10)
    assert fit.passes < 0
    assert fit.effective_gbps is None
    assert fit.crossover_tokens is None
    assert fit.effective_gbps_ci == (None, None)


def test_to_dict_is_json_ready():
    data = fitted().to_dict()
    assert isinstance(data["passes_ci"], list)
    assert data["cache"] == "dynamic"
    assert set(data) >= {"intercept_ms", "effective_gbps", "passes", "r2", "n_points", "passes_ci", "intercept_ci",
                         "confidence", "weight_read_ms", "crossover_tokens", "contexts", "ci_relative_width"}


def test_one_context_is_a_fit_error():
    with pytest.raises(FitError, match="two distinct contexts, got 1"):
        fitted(contexts=(1024,))


def test_mixed_caches_and_missing_copy_are_fit_errors():
    with pytest.raises(FitError, match="one cache class"):
        fit_passes([point(512, (0.03,)), point(1024, (0.04,), cache="static")], [20.0],
                   bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES)
    with pytest.raises(FitError, match="copy bandwidth"):
        fit_passes([point(512, (0.03,)), point(1024, (0.04,))], [],
                   bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES)


def test_drift():
    drift = measure_drift(point(512, (0.100,)), point(512, (0.105,)), 0.1)
    assert drift.fraction == pytest.approx(0.05)
    assert (drift.first_ms, drift.last_ms) == pytest.approx((100.0, 105.0))
    assert drift.ok
    slowed = measure_drift(point(512, (0.100,)), point(512, (0.120,)), 0.1)
    assert not slowed.ok
    assert slowed.to_dict()["fraction"] == pytest.approx(0.2)
    sped_up = measure_drift(point(512, (0.100,)), point(512, (0.080,)), 0.1)
    assert not sped_up.ok
    assert math.isinf(measure_drift(point(512, (0.0,)), point(512, (0.1,)), 0.1).fraction)


def test_drift_of_different_points_is_an_error():
    with pytest.raises(ValueError, match="one point twice"):
        measure_drift(point(512, (0.1,)), point(1024, (0.1,)), 0.1)
