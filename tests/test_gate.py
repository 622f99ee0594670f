"""kvcache.gate: baselines, limits and verdicts, on fits of synthetic runs with known passes."""

from __future__ import annotations

import json

import pytest
from fakerun import BYTES_PER_TOKEN, WEIGHT_BYTES, make_run

from kvcache.fit import PassesFit, fit_passes
from kvcache.gate import (
    BaselineError,
    Verdict,
    allowed_passes,
    baseline_entry,
    combine,
    failures,
    judge_counted,
    judge_timed,
    load_baseline,
    parse_max_passes,
    update_baseline,
)
from kvcache.records import points_from_benchmarks

DEVICE = "cpu: test machine"
CONTEXTS = (512, 1024, 2048, 4096, 6144, 8192)


def fitted(truth: float, *, noise: float = 0.01) -> PassesFit:
    run = make_run({"dynamic": truth}, contexts=CONTEXTS, rounds=3, steps=30, noise=noise)
    points = points_from_benchmarks(run["benchmarks"])
    return fit_passes(points, [20.0] * 5, bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES, resamples=500)


def judge(fit: PassesFit | None, baseline: float | None = 3.0, *, drift_ok: bool | None = True) -> Verdict:
    allowed = allowed_passes(baseline, 0.25, None, relative=True)
    return judge_timed(fit, allowed=allowed, min_r2=0.9, drift_ok=drift_ok, device=DEVICE)


def entry(timed: float | None, counted: float | None) -> dict:
    return {"timed_passes": timed, "counted_passes": counted, "recorded": "2026-11-29T00:00:00",
            "transformers": "5.24.0", "torch": "2.13.0", "model": "smollm2-135m", "dtype": "bfloat16"}


# --- baseline file ---


def test_missing_baseline_is_empty(tmp_path):
    baseline = load_baseline(tmp_path / "none.json")
    assert baseline == {"schema": 1, "devices": {}}
    assert baseline_entry(baseline, DEVICE, "dynamic") is None


def test_baseline_round_trip_merges(tmp_path):
    path = tmp_path / "sub" / "baseline.json"
    update_baseline(path, DEVICE, {"dynamic": entry(3.0, 3.0), "static": entry(1.0, 1.0)})
    update_baseline(path, "cuda: H200", {"dynamic": entry(2.0, 3.0)})
    update_baseline(path, DEVICE, {"dynamic": {"counted_passes": 2.0}})
    baseline = load_baseline(path)
    assert baseline_entry(baseline, DEVICE, "dynamic") == {**entry(3.0, 3.0), "counted_passes": 2.0}
    assert baseline_entry(baseline, DEVICE, "static") == entry(1.0, 1.0)
    assert baseline_entry(baseline, "cuda: H200", "dynamic")["timed_passes"] == 2.0
    text = path.read_text()
    assert text == json.dumps(baseline, indent=2, sort_keys=True) + "\n"
    assert [p.name for p in path.parent.iterdir()] == ["baseline.json"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not JSON"),
        ("[]", "top level is a list"),
        ('{"schema": 2, "devices": {}}', "schema 2"),
        ('{"schema": 1}', "'devices'"),
        ('{"schema": 1, "devices": {"d": {"dynamic": {"timed_passes": "3"}}}}', "timed_passes"),
    ],
)
def test_corrupt_baseline_is_one_line_error_naming_the_file(tmp_path, content, problem):
    path = tmp_path / "baseline.json"
    path.write_text(content)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert problem in message


def test_update_refuses_to_overwrite_a_corrupt_baseline(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text("{not json")
    with pytest.raises(BaselineError):
        update_baseline(path, DEVICE, {"dynamic": entry(3.0, 3.0)})
    assert path.read_text() == "{not json"


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


# --- allowed passes ---


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
    assert verdict.measured == pytest.approx(5.0, rel=0.02)
    assert "3.75" in verdict.reason


def test_poor_fit_is_inconclusive():
    fit = fitted(3.0, noise=3.0)
    assert fit.r2 < 0.9
    verdict = judge(fit)
    assert verdict.status == "inconclusive"
    assert verdict.reason.startswith("poor fit: R² ")
    assert "< 0.90" in verdict.reason


def test_drift_is_inconclusive():
    verdict = judge(fitted(3.0), drift_ok=False)
    assert verdict.status == "inconclusive"
    assert "--kv-max-drift" in verdict.reason


def test_straddling_interval_is_inconclusive():
    fit = fitted(3.0)
    lo, hi = fit.passes_ci
    verdict = judge_timed(fit, allowed=(lo + hi) / 2, min_r2=0.9, drift_ok=None, device=DEVICE)
    assert verdict.status == "inconclusive"
    assert "straddles" in verdict.reason


def test_no_fit_and_no_baseline():
    assert judge(None).status == "not-measured"
    verdict = judge(fitted(3.0), baseline=None)
    assert verdict.status == "no-baseline"
    assert DEVICE in verdict.reason
    assert "--kv-update-baseline" in verdict.reason


# --- counted verdicts ---


def test_counted_judge_is_exact():
    allowed = allowed_passes(3.0, 0.05, None, relative=False)
    assert judge_counted(3.04, allowed=allowed, device=DEVICE).status == "pass"
    assert judge_counted(3.05, allowed=allowed, device=DEVICE).status == "pass"
    assert judge_counted(3.06, allowed=allowed, device=DEVICE).status == "regression"
    regression = judge_counted(5.0, allowed=allowed, device=DEVICE)
    assert regression.status == "regression"
    assert (regression.measured, regression.allowed) == pytest.approx((5.0, 3.05))
    assert judge_counted(None, allowed=allowed, device=DEVICE).status == "not-measured"
    assert judge_counted(3.0, allowed=None, device=DEVICE).status == "no-baseline"


# --- combining and failures ---


@pytest.mark.parametrize(
    ("timed", "counted", "status"),
    [
        ("regression", "pass", "regression"),
        ("pass", "regression", "regression"),
        ("inconclusive", "pass", "inconclusive"),
        ("no-baseline", "pass", "pass"),
        ("not-measured", "pass", "pass"),
        ("no-baseline", "not-measured", "no-baseline"),
        ("not-measured", "not-measured", "not-measured"),
    ],
)
def test_combine_priority(timed, counted, status):
    combined = combine(Verdict(timed, f"timed is {timed}"), Verdict(counted, f"counted is {counted}"))
    assert combined["status"] == status
    assert combined["timed"]["status"] == timed
    assert combined["counted"]["status"] == counted
    assert f"timed is {timed}" in combined["reason"]
    assert f"counted is {counted}" in combined["reason"]
    json.dumps(combined)


def test_failures_name_cache_measure_and_values():
    timed = judge(fitted(5.0))
    counted = judge_counted(5.0, allowed=3.05, device=DEVICE)
    verdicts = {
        "dynamic": combine(timed, counted),
        "static": combine(judge_counted(1.0, allowed=1.05, device=DEVICE), Verdict("not-measured", "")),
    }
    messages = failures(verdicts)
    assert len(messages) == 2
    timed_message, counted_message = messages
    assert "dynamic" in timed_message and "timed" in timed_message and "3.75" in timed_message
    assert f"{timed.measured:.3g}" in timed_message
    assert "dynamic" in counted_message and "counted" in counted_message
    assert "5" in counted_message and "3.05" in counted_message
    assert all("\n" not in m for m in messages)
