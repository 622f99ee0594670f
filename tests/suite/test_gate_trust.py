"""Nothing bypasses or fools the gate, end to end on ``tiny``: pytest-xdist, an interrupted baseline update,
a deselected copy-bandwidth test, and drift that invalidates timed verdicts without failing the build.

Nothing here asserts on timing: the timed runs are judged against bounds so loose (1000 passes) that only
the rules under test decide the outcome.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvrun import describe, load_json, output, run_batch, run_suite

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("xdist")

PLUGINS = Path(__file__).resolve().parent / "plugins"
TIMED = ["--kv-model", "tiny", "--kv-caches", "dynamic,static", "--kv-contexts", "128,256,512", "--kv-steps", "3",
         "--kv-warmup", "0", "--kv-copy-mib", "8"]
LOOSE = ["--kv-max-passes", "dynamic=1000,static=1000"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate-trust")
    none = ["--kv-baseline", "none"]
    baseline = tmp / "baseline.json"
    baseline.write_text(json.dumps({"schema": 2, "devices": {}}))
    cases = {
        "interrupt": [*TIMED, "--kv-rounds", "2", "-p", "kv_interrupt", "--kv-update-baseline", "--kv-baseline",
                      str(baseline), "--benchmark-json", str(tmp / "interrupt.json")],
        "nocopy": [*TIMED, *LOOSE, *none, "--kv-rounds", "1", "-k", "not copy_bandwidth",
                   "--benchmark-json", str(tmp / "nocopy.json")],
        "drift": [*TIMED, *LOOSE, *none, "--kv-rounds", "1", "--kv-max-drift", "0",
                  "--benchmark-json", str(tmp / "drift.json")],
        "strict": [*TIMED, *LOOSE, *none, "--kv-rounds", "1", "--kv-max-drift", "0", "--kv-strict"],
        "update-regression": ["-m", "counted", "--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-max-passes",
                              "dynamic=1", "--kv-update-baseline", "--kv-baseline", str(tmp / "updated.json")],
    }
    results = run_batch(cases, pythonpath=[PLUGINS])
    results["xdist-timed"] = run_suite("-p", "xdist", "-n", "2", "--kv-model", "tiny", *none)
    results["xdist-counted"] = run_suite("-p", "xdist", "-n", "2", "-m", "counted", "--kv-model", "tiny",
                                         "--kv-caches", "dynamic,static,inplace", "--kv-max-passes", "dynamic=2",
                                         *none, "--benchmark-json", str(tmp / "xdist.json"))
    return tmp, baseline, results


def test_xdist_refuses_timed_points_with_one_line(runs):
    done = runs[2]["xdist-timed"]
    assert done.returncode == 4, describe(done)
    lines = [line for line in output(done).splitlines() if "pytest-xdist" in line]
    assert len(lines) == 1 and "-n 2" in lines[0] and "-m counted" in lines[0], describe(done)


def test_xdist_counted_run_reaches_one_analysis_and_the_gate(runs):
    tmp, _, results = runs
    done = results["xdist-counted"]
    assert done.returncode == 1, describe(done)
    assert "kv-cache regression: dynamic counted" in output(done), describe(done)
    kv = load_json(tmp / "xdist.json")["kv"]
    assert set(kv["traffic"]) == {"dynamic", "static", "inplace"}  # every worker's classes
    assert kv["verdict"]["dynamic"]["counted"]["status"] == "regression"


def test_interrupted_update_records_no_timed_passes(runs):
    tmp, baseline, results = runs
    done = results["interrupt"]
    assert done.returncode == 2, describe(done)  # pytest's exit status for an interrupted session
    kv = load_json(tmp / "interrupt.json")["kv"]
    assert kv["session"]["interrupted"] is True
    assert "the session did not finish" in output(done)
    devices = load_json(baseline)["devices"]
    # counted passes and counted overhead (exact) only
    assert [key.split(" | torch ")[0] for key in devices] == ["cpu | tiny | bfloat16"] * 2, devices
    assert all("timed_passes" not in entry for by_cache in devices.values() for entry in by_cache.values())


def test_deselected_copy_bandwidth_makes_timed_passes_inconclusive(runs):
    tmp, _, results = runs
    done = results["nocopy"]
    assert done.returncode == 0, describe(done)
    kv = load_json(tmp / "nocopy.json")["kv"]
    for cache in ("dynamic", "static"):
        assert "no copy bandwidth was measured" in kv["fit"][cache]["error"]
        verdict = kv["verdict"][cache]["timed"]
        assert verdict["status"] == "inconclusive" and "no copy bandwidth" in verdict["reason"]


def test_drift_invalidates_timed_verdicts_without_failing_the_build(runs):
    tmp, _, results = runs
    done = results["drift"]
    assert done.returncode == 0, describe(done)
    kv = load_json(tmp / "drift.json")["kv"]
    assert kv["drift"]["ok"] is False
    for cache in ("dynamic", "static"):
        verdict = kv["verdict"][cache]["timed"]
        assert verdict["status"] == "inconclusive" and "--kv-max-drift" in verdict["reason"]
    assert "kv-cache drift:" in output(done) and "--kv-strict makes it fail" in output(done)


def test_strict_fails_the_build_on_drift(runs):
    done = runs[2]["strict"]
    assert done.returncode == 1, describe(done)
    assert "kv-cache inconclusive: dynamic timed:" in output(done), describe(done)


def test_updating_the_baseline_does_not_turn_a_regression_green(runs):
    tmp, _, results = runs
    done = results["update-regression"]
    assert done.returncode == 1, describe(done)
    assert "kv-cache regression: dynamic counted" in output(done), describe(done)
    recorded = load_json(tmp / "updated.json")["devices"]["cpu | tiny | bfloat16"]["dynamic"]
    assert recorded["counted_passes"] == pytest.approx(3.0, abs=0.01)  # the new value is recorded all the same
