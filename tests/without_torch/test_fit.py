"""kvcache.analysing.fit on synthetic runs whose true passes are known (tests/fakerun.py)."""

from __future__ import annotations

import math
import re

import pytest
from fakerun import BYTES_PER_TOKEN, WEIGHT_BYTES, analysed, make_run, without

from kvcache.analysing.fit import FitError, context_draws, fit_passes, least_squares, measure_drift, slope_passes
from kvcache.analysing.records import KV, Fit, Point, points_from_benchmarks

CONTEXTS = (512, 1024, 2048, 3072, 4096, 6144, 8192)


def fitted(truth: float = 3.0, *, noise: float = 0.01, rounds: int = 3, steps: int = 50, seed: int = 0,
           contexts: tuple[int, ...] = CONTEXTS, fit_seed: int = 0, copy_gbps: float = 20.0) -> Fit:
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


def test_one_point_per_context_draws_the_contexts_so_their_scatter_is_in_the_interval():
    """One round per context (the per-op ledger): steps 0.1% apart, the points 10-20% off one line (as one profiled
    point per context moves on the developers' CPU). Drawing steps alone gave an interval a few percent wide; the
    contexts are drawn too, so it is as wide as the scatter says. Every draw keeps two distinct sizes."""
    import numpy as np

    contexts, off = (1024, 2048, 4096, 8192, 16384), (1.0, 1.2, 0.9, 0.85, 1.15)
    points = [point(c, tuple(1e-9 * BYTES_PER_TOKEN * c * f * (1 + 0.001 * k) for k in range(-4, 4)))
              for c, f in zip(contexts, off)]
    passes, (lo, hi), _ = slope_passes(points, [10.0] * 5)
    assert (hi - lo) / passes > 0.25, (passes, lo, hi)
    x = np.asarray([p.kv_bytes for p in points])
    picks = context_draws(x, 5000, np.random.default_rng(0))
    assert picks.shape == (5000, 5) and all(len(set(row)) >= 2 for row in picks.tolist())


def test_bootstrap_is_deterministic_with_a_seed():
    assert fitted(fit_seed=7).to_json() == fitted(fit_seed=7).to_json()
    assert fitted(fit_seed=7).passes_ci != fitted(fit_seed=8).passes_ci


def test_derived_quantities():
    fit = fitted(3.0, noise=0.0)
    assert fit.passes == pytest.approx(3.0)
    assert fit.weight_read_ms == pytest.approx(WEIGHT_BYTES / 20e9 * 1e3)
    assert fit.crossover_tokens == pytest.approx(WEIGHT_BYTES / (3.0 * BYTES_PER_TOKEN))


def test_the_fit_is_json_ready():
    data = fitted().to_json()
    assert isinstance(data["passes_ci"], list)
    assert data["cache"] == "dynamic"
    assert set(data) >= {"intercept_ms", "effective_gbps", "passes", "r2", "n_points", "passes_ci", "intercept_ci",
                         "confidence", "weight_read_ms", "crossover_tokens", "contexts", "ci_relative_width"}


def test_one_context_is_a_fit_error():
    with pytest.raises(FitError, match="at least 3 distinct contexts .*, got 1"):
        fitted(contexts=(1024,))


# --- no nonsense printed as a number: a fit that cannot be judged gives no passes figure, and says why -------

def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and message.strip() == message, message
    return message


def test_minimum_of_three_contexts_is_a_named_constant():
    from kvcache.analysing import fit

    assert fit.MIN_CONTEXTS == 3


def test_two_contexts_are_a_fit_error():
    """Two points always fit a line (R² 1.000): nothing can be judged from it."""
    with pytest.raises(FitError) as exc:
        fitted(contexts=(512, 1024))
    assert one_line(exc) == "needs at least 3 distinct contexts for a line that can be judged, got 2"


def test_two_contexts_measured_in_many_rounds_are_still_two():
    with pytest.raises(FitError, match="got 2"):
        fitted(contexts=(512, 1024), rounds=5)


def test_decreasing_latency_is_a_fit_error_naming_the_slope():
    points = [point(512, (0.030,)), point(1024, (0.025,)), point(2048, (0.015,))]  # on one falling line
    with pytest.raises(FitError) as exc:
        fit_passes(points, [20.0], bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES, resamples=10)
    message = one_line(exc)
    assert message.startswith("slope is not positive (")
    # named as 1 / slope, a (negative) bandwidth, as a chart legend would have shown it
    slope = (0.015 - 0.030) / (BYTES_PER_TOKEN * (2048 - 512))
    assert f"{1 / slope / 1e9:.2f} GB/s" in message
    assert "latency did not grow with context" in message and "no passes figure" in message


def test_decreasing_latency_of_a_synthetic_run_is_a_fit_error():
    with pytest.raises(FitError, match="slope is not positive"):
        fitted(-3.0)


def test_flat_latency_is_a_fit_error():
    points = [point(512, (0.03,)), point(1024, (0.03,)), point(2048, (0.03,))]
    with pytest.raises(FitError, match="slope is not positive"):
        fit_passes(points, [20.0], bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES, resamples=10)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_step_times_are_a_fit_error(bad):
    points = [point(512, (0.030, 0.031, 0.032)), point(1024, (0.040, bad, 0.041)), point(2048, (0.05, 0.05, 0.05))]
    with pytest.raises(FitError) as exc:
        fit_passes(points, [20.0], bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES, resamples=10)
    message = one_line(exc)
    assert "not finite" in message and "1024" in message and "no passes figure" in message


def test_all_nan_step_times_are_a_fit_error():
    points = [point(c, (math.nan,) * 3) for c in (512, 1024, 2048)]
    with pytest.raises(FitError, match="not finite"):
        fit_passes(points, [20.0], bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES, resamples=10)


def test_a_fit_has_positive_finite_passes_and_crossover():
    fit = fitted(0.5, noise=0.05, rounds=2, contexts=(512, 1024, 2048))
    assert math.isfinite(fit.passes) and fit.passes > 0
    assert fit.effective_gbps is not None and fit.effective_gbps > 0
    assert fit.crossover_tokens is not None and fit.crossover_tokens > 0


def analysed_fit(run: dict) -> dict:
    return analysed(run)["kv"]["fit"]


def test_analysis_records_why_there_is_no_passes_figure():
    fits = analysed_fit(make_run({"dynamic": -3.0, "static": 1.0}, counted={"dynamic": 3.0, "static": 1.0}))
    assert set(fits["dynamic"]) == {"error", "n_points"}
    assert fits["dynamic"]["error"].startswith("slope is not positive")
    assert fits["static"]["passes"] == pytest.approx(1.0, rel=0.05)
    two = analysed_fit(make_run({"dynamic": 3.0}, contexts=(512, 1024)))
    assert two["dynamic"] == {"error": "needs at least 3 distinct contexts for a line that can be judged, got 2",
                              "n_points": 2}


def summary_row(lines: list[str], cache: str) -> str:
    """The cache's row of the summary's fit table."""
    header = next((i for i, line in enumerate(lines) if line.startswith("cache") and "intercept ms" in line), None)
    assert header is not None, "\n".join(lines)
    end = lines.index("", header) if "" in lines[header:] else len(lines)
    rows = [line for line in lines[header + 2:end] if line.startswith(f"{cache} ")]
    assert len(rows) == 1, "\n".join(lines)
    return rows[0]


@pytest.mark.parametrize("case", ["decreasing", "two-contexts"])
def test_summary_shows_the_reason_and_no_number(case):
    from kvcache.analysing import summary

    if case == "decreasing":
        run = make_run({"dynamic": -3.0, "static": 1.0}, counted={"dynamic": 3.0, "static": 1.0})
        reason = "slope is not positive"
    else:
        run = make_run(contexts=(512, 1024))
        reason = "needs at least 3 distinct contexts"
    kv = analysed(run)["kv"]
    lines = summary.lines(KV.from_json(kv))
    row = summary_row(lines, "dynamic")
    assert reason in row, row
    figures = re.sub(r"\(.*\)", "", row)
    # intercept, GB/s, passes, R², ratio and crossover are all '-': no figure but the counted passes (3.00)
    assert re.findall(r"-?\d[\d,]*\.?\d*", figures) == ["3.00"], row
    # the reason may quote the slope it refused; nothing else printed is negative
    printed = "\n".join(lines).replace(kv["fit"]["dynamic"]["error"], "")
    assert not re.search(r"(?<![\w.])-\d", printed), "a negative number was printed"


def test_summary_shows_the_reason_in_a_timed_only_run():
    """-m timed: no counted traffic, so the class's verdicts are both 'not-measured'; its row still says why."""
    from kvcache.analysing import summary

    run = without(make_run({"dynamic": -3.0}, counted={"dynamic": 3.0}), "traffic")
    run["kv"]["traffic"] = {}
    row = summary_row(summary.lines(KV.from_json(analysed(run)["kv"])), "dynamic")
    assert "slope is not positive" in row, row


def test_mixed_caches_and_missing_copy_are_fit_errors():
    with pytest.raises(FitError, match="one cache class"):
        fit_passes([point(512, (0.03,)), point(1024, (0.04,), cache="static")], [20.0],
                   bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES)
    with pytest.raises(FitError, match="copy bandwidth"):
        fit_passes([point(512, (0.03,)), point(1024, (0.04,)), point(2048, (0.05,))], [],
                   bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES)


def test_drift():
    drift = measure_drift(point(512, (0.100,)), point(512, (0.105,)), 0.1)
    assert drift.fraction == pytest.approx(0.05)
    assert (drift.first_ms, drift.last_ms) == pytest.approx((100.0, 105.0))
    assert drift.ok
    slowed = measure_drift(point(512, (0.100,)), point(512, (0.120,)), 0.1)
    assert not slowed.ok
    assert slowed.to_json()["fraction"] == pytest.approx(0.2)
    sped_up = measure_drift(point(512, (0.100,)), point(512, (0.080,)), 0.1)
    assert not sped_up.ok
    assert math.isinf(measure_drift(point(512, (0.0,)), point(512, (0.1,)), 0.1).fraction)


def test_drift_of_different_points_is_an_error():
    with pytest.raises(ValueError, match="one point twice"):
        measure_drift(point(512, (0.1,)), point(1024, (0.1,)), 0.1)


def test_a_cache_that_stops_growing_is_reported_as_such_not_as_a_poor_fit():
    """Every layer past its sliding window (issue 14): the contexts beyond it hold the same KV bytes, so the points
    give fewer than 3 cache sizes; the reason names the range where the cache does not grow."""
    window_bytes = BYTES_PER_TOKEN * 4096
    points = [Point(cache="dynamic", context=c, round=0, kv_bytes=min(BYTES_PER_TOKEN * c, window_bytes),
                    samples_s=(0.01 + 1e-12 * min(c, 4096),) * 3) for c in (2048, 4096, 8192, 16384)]
    with pytest.raises(FitError) as info:
        fit_passes(points, [20.0] * 5, bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES)
    assert "the cache does not grow from 4096 to 16384 tokens" in one_line(info)
