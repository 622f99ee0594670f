"""kvcache.analysing.judge.gate, the one judge: limits and verdicts (``kv.verdict.<cache>.<measure>``) on fits of
synthetic
runs with known passes, the drift policy, and the failure lines walked from the verdicts."""

from __future__ import annotations

import json
import math

import pytest
from fakerun import BYTES_PER_TOKEN, WEIGHT_BYTES, make_run

from kvcache.analysing.fit import fit_passes
from kvcache.analysing.judge.entries import BaselineEntry
from kvcache.analysing.judge.gate import failures, judge_run, parse_max_passes, status_of
from kvcache.analysing.judge.judges import allowed_passes, judge_counted, judge_timed, ops_that_grew
from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.records import KV, Counted, Drift, Fit, FitFailure, RunSettings, Traffic, points_from_benchmarks

KEY = "cpu: test machine | smollm2-135m | bfloat16"
CONTEXTS = (512, 1024, 2048, 4096, 6144, 8192)
RULES = Rules(tolerance=0.25, min_r2=0.9)
DRIFT_OK = Drift(cache="dynamic", context=512, fraction=0.01, max_fraction=0.1, ok=True)
DRIFT_BAD = Drift(cache="dynamic", context=512, fraction=-0.13, max_fraction=0.1, ok=False)


def fitted(truth: float, *, noise: float = 0.01) -> Fit:
    run = make_run({"dynamic": truth}, contexts=CONTEXTS, rounds=3, steps=30, noise=noise)
    points = points_from_benchmarks(run["benchmarks"])
    return fit_passes(points, [20.0] * 5, bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES, resamples=500)


def judge(fit: Fit | FitFailure | None, baseline: float | None = 3.0, *, drift: Drift | None = DRIFT_OK,
          rules: Rules = RULES):
    allowed = allowed_passes(baseline, rules.tolerance, None, relative=True)
    return judge_timed(fit, allowed=allowed, rules=rules, drift=drift, key=KEY)


# --- --kv-max-passes ---


def test_parse_max_passes():
    assert parse_max_passes("dynamic=4, static=1.5") == {"dynamic": 4.0, "static": 1.5}
    assert parse_max_passes("") == {}


@pytest.mark.parametrize(
    ("text", "bad"),
    [("dynamic", "'dynamic'"), ("dynamic=four", "'dynamic=four'"), ("=3", "'=3'"), ("dynamic=nan", "'dynamic=nan'")],
)
def test_parse_max_passes_names_the_bad_item(text, bad):
    with pytest.raises(ValueError, match="bad item") as info:
        parse_max_passes(f"static=1,{text}")
    assert bad in str(info.value)
    assert "cache=number,..." in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["dynamic=0", "dynamic=-1"])
def test_parse_max_passes_rejects_non_positive(text):
    with pytest.raises(ValueError, match="not positive"):
        parse_max_passes(text)


def test_parse_max_passes_rejects_duplicates():
    with pytest.raises(ValueError, match="twice"):
        parse_max_passes("dynamic=3,dynamic=4")


# --- rules ---


@pytest.mark.parametrize("field", ["tolerance", "counted_tolerance", "min_r2"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -0.1])
def test_tolerances_must_be_finite_and_non_negative(field, value):
    with pytest.raises(ValueError, match=field):
        Rules(**{field: value})


@pytest.mark.parametrize(
    ("settings", "named"),
    [({"min_r2": math.nan}, "min_r2 nan"), ({"min_r2": 1.5}, "min_r2 1.5"), ({"max_drift": math.nan}, "max_drift nan"),
     ({"ledger_tolerance": -1}, "ledger_tolerance -1"), ({"max_passes": {"dynamic": math.nan}}, "max_passes"),
     ({"max_passes": {"dynamic": 0}}, "max_passes"), ({"strict": "yes"}, "strict 'yes'")],
)
def test_a_runs_own_rules_that_cannot_judge_are_refused(settings, named):
    """A run's settings.min_r2 NaN let an R² of 0.01 through: every comparison with NaN is false."""
    with pytest.raises(ValueError) as info:
        Rules.from_settings(RunSettings(caches=["dynamic"], **settings))
    assert named in str(info.value) and "\n" not in str(info.value)


def test_a_runs_own_rules_judge_it_and_an_override_replaces_one():
    rules = Rules.from_settings(RunSettings(tolerance=0.3, min_r2=0.5, max_drift=0.2, ledger_tolerance=1.0,
                                            model="tiny"), tolerance=0.2)
    assert (rules.tolerance, rules.min_r2, rules.max_drift, rules.ledger_tolerance) == (0.2, 0.5, 0.2, 1.0)


def test_allowed_passes_takes_the_tighter_limit():
    assert allowed_passes(3.0, 0.25, None, relative=True) == pytest.approx(3.75)
    assert allowed_passes(3.0, 0.05, None, relative=False) == pytest.approx(3.05)
    assert allowed_passes(3.0, 0.25, 3.5, relative=True) == 3.5
    assert allowed_passes(3.0, 0.25, 9.0, relative=True) == pytest.approx(3.75)
    assert allowed_passes(None, 0.25, 4.0, relative=True) == 4.0
    assert allowed_passes(None, 0.25, None, relative=True) is None


# --- timed verdicts ---


def test_clean_run_passes():
    verdict = judge(fitted(3.0))
    assert verdict.status == "pass", verdict.reason
    assert verdict.allowed == pytest.approx(3.75)


def test_planted_regression_is_caught():
    verdict = judge(fitted(5.0))
    assert verdict.status == "regression", verdict.reason
    assert verdict.value == pytest.approx(5.0, rel=0.02)
    assert "3.75" in verdict.reason


def test_poor_fit_is_inconclusive():
    fit = fitted(3.0, noise=3.0)
    assert fit.r2 < 0.9
    verdict = judge(fit)
    assert verdict.status == "inconclusive"
    assert verdict.reason.startswith("poor fit: R² ")
    assert "< 0.90" in verdict.reason


def test_drift_is_inconclusive_even_for_a_clear_regression():
    verdict = judge(fitted(5.0), drift=DRIFT_BAD)
    assert verdict.status == "inconclusive"
    assert "--kv-max-drift" in verdict.reason and "-13.0%" in verdict.reason


def test_straddling_interval_is_inconclusive():
    fit = fitted(3.0)
    lo, hi = fit.passes_ci
    verdict = judge_timed(fit, allowed=(lo + hi) / 2, rules=RULES, drift=None, key=KEY)
    assert verdict.status == "inconclusive"
    assert "straddles" in verdict.reason


def test_a_fit_without_a_figure_is_inconclusive_with_its_reason():
    verdict = judge(FitFailure(error="slope is not positive", n_points=6))
    assert verdict.status == "inconclusive"
    assert "slope is not positive" in verdict.reason
    assert verdict.value is None


def test_no_fit_and_no_baseline():
    assert judge(None).status == "not-measured"
    verdict = judge(fitted(3.0), baseline=None)
    assert verdict.status == "no-baseline"
    assert KEY in verdict.reason
    assert "--kv-update-baseline" in verdict.reason


# --- counted verdicts ---


def counted(passes, by_op=None):
    return Counted(passes, by_op or {"cat": passes - 1, "scaled_dot_product_attention": 1.0})


def test_counted_judge_is_exact():
    allowed = allowed_passes(3.0, 0.05, None, relative=False)

    def status(passes):
        return judge_counted(counted(passes), allowed=allowed, base_by_op=None, key=KEY).status

    assert [status(p) for p in (3.04, 3.05, 3.06)] == ["pass", "pass", "regression"]
    regression = judge_counted(counted(5.0), allowed=allowed, base_by_op=None, key=KEY)
    assert (regression.value, regression.allowed) == pytest.approx((5.0, 3.05))
    assert judge_counted(None, allowed=allowed, base_by_op=None, key=KEY).status == "not-measured"
    assert judge_counted(counted(3.0), allowed=None, base_by_op=None, key=KEY).status == "no-baseline"


def test_a_counted_regression_names_the_ops_that_grew():
    base = {"cat": 2.0, "scaled_dot_product_attention": 1.0}
    now = {"cat": 2.0, "clone": 2.0, "scaled_dot_product_attention": 1.0}
    verdict = judge_counted(Counted(5.0, now), allowed=3.05, base_by_op=base, key=KEY)
    assert verdict.status == "regression"
    assert verdict.grew == {"clone": 2.0}
    assert "grew: clone +2.00" in verdict.reason
    assert ops_that_grew({"cat": 4.0, "add": 0.001}, {"cat": 2.0}) == {"cat": 2.0}


# --- one run, the verdict tree and the failure lines ---


def run_kv(*, drift=DRIFT_OK, strict=False, timed=5.0, counted_passes=5.0) -> KV:
    def traffic(figure: Counted) -> Traffic:
        return Traffic(passes=figure.passes, by_op=figure.by_op)

    return KV(settings=RunSettings(caches=["dynamic", "static"], strict=strict), drift=drift,
              fit={"dynamic": fitted(timed)},
              traffic={"dynamic": traffic(counted(counted_passes)), "static": traffic(counted(1.0, {"sdpa": 1.0}))})


DYNAMIC_OPS = {"cat": 2.0, "scaled_dot_product_attention": 1.0}
BASE = {"timed": {"dynamic": BaselineEntry(timed_passes=3.0)},
        "counted": {"dynamic": BaselineEntry(counted_passes=3.0, counted_by_op=DYNAMIC_OPS),
                    "static": BaselineEntry(counted_passes=1.0)}}
KEYS = {"timed": KEY, "counted": "cpu | smollm2-135m | bfloat16",
        "overhead": "cpu | smollm2-135m | bfloat16 | torch 2.13.0"}


def test_verdicts_are_kept_per_cache_and_measure():
    verdicts = judge_run(run_kv(), BASE, RULES, KEYS)
    assert set(verdicts) == {"dynamic", "static"}
    assert set(verdicts["dynamic"]) == {"counted", "timed", "overhead", "intercept", "ledger"}
    for v in (verdicts["dynamic"]["counted"], verdicts["dynamic"]["timed"]):
        assert {"status", "value", "allowed", "reason"} <= set(v.to_json())
    assert verdicts["static"]["timed"].status == "not-measured"
    assert status_of(verdicts["dynamic"]) == "regression"
    json.dumps({cache: {m: v.to_json() for m, v in measures.items()} for cache, measures in verdicts.items()})


def test_failures_walk_the_verdicts():
    kv = run_kv()
    verdicts = judge_run(kv, BASE, RULES, KEYS)
    lines = failures(verdicts, drift=kv.drift)
    assert len(lines) == 2
    assert all("\n" not in line for line in lines)
    counted_line = next(line for line in lines if " counted:" in line)
    assert "dynamic" in counted_line and "5" in counted_line and "3.05" in counted_line and "cat +2.00" in counted_line
    timed_line = next(line for line in lines if " timed:" in line)
    assert "3.75" in timed_line


def test_drift_alone_never_fails_the_build_unless_strict():
    kv = run_kv(drift=DRIFT_BAD, timed=3.0, counted_passes=3.0)
    verdicts = judge_run(kv, BASE, RULES, KEYS)
    assert verdicts["dynamic"]["timed"].status == "inconclusive"
    assert failures(verdicts, drift=kv.drift) == []
    strict = failures(verdicts, drift=kv.drift, strict=True)
    assert strict and all("drift" in line for line in strict)


def test_drift_without_a_baseline_does_not_fail_the_build():
    kv = run_kv(drift=DRIFT_BAD, timed=3.0, counted_passes=3.0)
    verdicts = judge_run(kv, {"timed": {}, "counted": {}}, RULES, KEYS)
    assert {verdicts["dynamic"][m].status for m in ("counted", "timed", "intercept")} == {"no-baseline"}
    assert failures(verdicts, drift=kv.drift) == []


@pytest.mark.parametrize("strict", [False, True])
def test_a_skipped_class_the_baseline_holds_is_shown_and_fails_under_strict(tmp_path, strict):
    """Issue 49 item 3: quantized-quanto baselined, optimum-quanto uninstalled: the class was skipped, left out of the
    verdict table, and the gate exited 0, --kv-strict too. Now its row says not measured and why (plain mode: a
    warning line, no failure, as compare without --require-classes), and --kv-strict fails it."""
    from kvcache.analysing import analysis, summary
    from kvcache.analysing.judge import baseline

    reason = "quantized-quanto needs a package that is not installed (pip install optimum-quanto)"
    recorded = make_run({"dynamic": 3.0, "quantized-quanto": 3.0})
    path = tmp_path / "baseline.json"
    baseline.record(path, KV.from_json(recorded["kv"]), "2026-11-29T00:00:00")
    doc = make_run({"dynamic": 3.0})
    doc["kv"]["settings"].update(caches=["dynamic", "quantized-quanto"], strict=strict)
    doc["kv"]["skipped"] = [{"cache": "quantized-quanto", "context": None, "reason": reason}]
    kv = KV.from_json(doc["kv"])
    kv.verdict = analysis.run_verdicts(kv, baseline.load(path))
    counted = kv.verdict["quantized-quanto"]["counted"]
    assert counted.status == "not-measured" and reason in counted.reason and "baseline holds 3" in counted.reason
    assert kv.verdict["quantized-quanto"]["timed"].status == "not-measured"
    row = next(line for line in summary.lines(kv) if line.startswith("quantized-quanto "))
    assert "not-measured [" in row
    failed = analysis.gate_failures(kv)
    warned = analysis.warnings(kv)
    if strict:
        assert any(line.startswith("kv-cache not-measured: quantized-quanto counted: skipped (") for line in failed)
        assert not any("quantized-quanto" in line for line in warned)
    else:
        assert failed == []
        assert any(line.startswith("kv-cache not-measured: quantized-quanto counted: skipped (") for line in warned)
    # a class that is not skipped but simply not selected or deselected (-k, -m) is no such verdict
    doc["kv"]["skipped"] = []
    kv = KV.from_json(doc["kv"])
    kv.verdict = analysis.run_verdicts(kv, baseline.load(path))
    assert not any("quantized-quanto" in line for line in analysis.gate_failures(kv) + analysis.warnings(kv))
    assert "skipped" not in kv.verdict["quantized-quanto"]["counted"].reason
