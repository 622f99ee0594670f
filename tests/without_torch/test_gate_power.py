"""scripts/gate_power.py without measuring: the command lines it would run, the baseline it gives the measured
runs, and the summary of fake runs (exit statuses and JSON written to a temporary folder)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))  # the scripts import each other as `python scripts/gate_power.py` lets them
import gate_power  # noqa: E402

DEVICE = "cpu: test cpu (2 threads) | tiny | bfloat16"
TYPE = "cpu | tiny | bfloat16"


def options(*argv: str):
    return gate_power.parser().parse_args(list(argv))


def test_measured_runs_are_one_class_each_with_the_gate_on(tmp_path):
    runs = gate_power.measured_runs(options("--runs", "3", "--tolerance", "0.1", "--planted", "twin-planted"),
                                    tmp_path)
    assert [r["cache"] for r in runs] == ["twin-clean", "twin-planted", "twin-planted", "twin-clean",
                                          "twin-clean", "twin-planted"]  # interleaved, order rotated
    for r in runs:
        cmd = r["cmd"]
        assert "--kv-no-gate" not in cmd and "--kv-update-baseline" not in cmd
        assert cmd[cmd.index("--kv-caches") + 1] == r["cache"]  # one class a run: its exit status is its own
        assert cmd[cmd.index("--kv-tolerance") + 1] == "0.1"
        assert cmd[cmd.index("--kv-baseline") + 1] == str(tmp_path / "baseline.json")
        assert cmd[cmd.index("--benchmark-json") + 1] == str(tmp_path / r["json"])
        assert cmd[cmd.index("--kv-seed") + 1] == str(r["repetition"] - 1)
        assert "-m" not in cmd[cmd.index("benchmarks"):]  # the whole suite: counted, timed and drift
    assert len({r["json"] for r in runs}) == len(runs)


def test_planted_takes_a_list_of_classes(tmp_path):
    runs = gate_power.measured_runs(options("--runs", "2", "--planted", "twin-planted,twin-read"), tmp_path)
    assert [r["cache"] for r in runs] == ["twin-clean", "twin-planted", "twin-read",
                                          "twin-planted", "twin-read", "twin-clean"]
    with pytest.raises(SystemExit):
        gate_power.planted_classes("twin-clean")
    with pytest.raises(SystemExit):
        gate_power.planted_classes(" , ")


def test_calibration_records_the_clean_baseline(tmp_path):
    cmd = gate_power.calibration_command(options(), tmp_path)
    assert cmd[cmd.index("--kv-caches") + 1] == "twin-clean" and "--kv-update-baseline" in cmd
    assert cmd[cmd.index("--kv-baseline") + 1] == str(tmp_path / "calibration-baseline.json")


def test_planted_baseline_holds_only_the_clean_timed_passes():
    clean = {"timed_passes": 6.1, "counted_passes": 3.0, "model": "tiny", "dtype": "bfloat16"}
    calibration = {"schema": 1, "devices": {DEVICE: {"twin-clean": clean},
                                            TYPE: {"twin-clean": {"counted_passes": 3.0}}}}
    doc = gate_power.measured_baseline(calibration, ["twin-planted", "twin-read"])
    assert doc["devices"][DEVICE]["twin-clean"] == clean
    for cache in ("twin-planted", "twin-read"):
        assert doc["devices"][DEVICE][cache] == {"timed_passes": 6.1, "model": "tiny", "dtype": "bfloat16"}
        assert cache not in doc["devices"][TYPE]  # no counted passes under the device type either
    assert "twin-planted" not in calibration["devices"][DEVICE]  # the calibration baseline is left as it was


@pytest.mark.parametrize("verdict", [
    {"status": "regression", "reason": "", "timed": {"status": "regression"}, "counted": {"status": "no-baseline"}},
    {"timed": {"status": "regression", "value": 7.2, "allowed": 6.7, "reason": ""}, "counted": {"status": "pass"}},
])
def test_timed_status_reads_both_verdict_shapes(verdict, tmp_path):
    """A run of schema 1 (one combined verdict a class) and one of schema 2 (a verdict a measure) read alike."""
    schema = 1 if "status" in verdict else 2
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"benchmarks": [], "kv": {"schema": schema, "verdict": {"twin-planted": verdict}}}))
    assert gate_power.timed_status(gate_power.load_kv(path), "twin-planted") == "regression"
    assert gate_power.timed_status(gate_power.load_kv(tmp_path / "none.json"), "twin-planted") == "missing"


def fake_kv(cache: str, passes: float, status: str, drift: float, *, new_shape: bool = False) -> dict:
    timed = {"status": status, "value": passes, "allowed": 6.71, "reason": ""} if new_shape else \
        {"status": status, "reason": "", "measured": passes}
    verdict = {"timed": timed, "counted": {"status": "pass"}}
    if not new_shape:
        verdict = {"status": status, "reason": "", **verdict}
    return {"schema": 2 if new_shape else 1,
            "settings": {"tolerance": 0.1, "model": "tiny", "contexts": [512, 1024, 2048], "steps": 20, "rounds": 3},
            "environment": {"device_name": "cpu: test cpu", "transformers": "5.24.0", "torch": "2.13.0"},
            "fit": {cache: {"passes": passes, "passes_ci": [passes - 0.2, passes + 0.2]}},
            "drift": {"fraction": drift, "ok": abs(drift) <= 0.1},
            "verdict": {cache: verdict}}


def test_summarize_counts_exit_statuses(tmp_path):
    calibration = fake_kv("twin-clean", 6.1, "no-baseline", 0.01)
    (tmp_path / "calibration.json").write_text(json.dumps({"benchmarks": [], "kv": calibration}))
    # (cache, exit, timed passes, timed verdict, drift, verdict shape); exit decides, not the verdict.
    runs = [("twin-clean", 0, 6.0, "pass", 0.02, False), ("twin-planted", 1, 7.3, "regression", 0.01, False),
            ("twin-planted", 1, 7.0, "inconclusive", -0.13, True), ("twin-clean", 1, 6.2, "inconclusive", -0.12, True),
            ("twin-clean", 0, 6.1, "inconclusive", 0.03, False), ("twin-planted", 3, None, None, None, False)]
    manifest = []
    for i, (cache, code, passes, status, drift, new_shape) in enumerate(runs):
        name = f"{cache}-{i // 2 + 1}"
        manifest.append({"name": name, "cache": cache, "repetition": i // 2 + 1, "json": f"{name}.json", "cmd": [],
                         "exit": code})
        if passes is not None:  # the last planted run crashed: no JSON
            kv = fake_kv(cache, passes, status, drift, new_shape=new_shape)
            (tmp_path / f"{name}.json").write_text(json.dumps({"benchmarks": [], "kv": kv}))
    (tmp_path / "runs.json").write_text(json.dumps(manifest))
    text = gate_power.summarize(tmp_path)
    assert "- clean: builds failed 1/3 (timed verdicts: pass 1, inconclusive 2)" in text
    assert "- planted: builds failed 3/3 (timed verdicts: regression 1, inconclusive 1, missing 1)" in text
    assert "| 1 | twin-planted | red (1) | regression | missing | +1.0% | 7.30 \\[7.10, 7.50\\] | — |" in text
    assert "| 2 | twin-clean | red (1) | inconclusive | missing | -12.0% (beyond) | 6.20 \\[6.00, 6.40\\] | — |" in text
    assert "| 3 | twin-planted | error (3) | missing | missing | — | — | — |" in text
    assert "twin-clean 6.10 timed passes" in text and "tolerance 0.1" in text
