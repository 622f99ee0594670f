"""``kvcache baseline RUN.json``: a finished run recorded as the baseline, then judged against it."""

from __future__ import annotations

import json

from fakerun import make_run, write_run

from kvcache import analysis, gate
from kvcache.cli import main


def test_records_timed_and_counted_passes(tmp_path, capsys):
    run = write_run(tmp_path / "run.json", make_run({"dynamic": 3.0, "static": 1.0}))
    baseline = tmp_path / "kv-baseline.json"
    assert main(["baseline", str(run), "--baseline", str(baseline)]) == 0
    doc = json.loads(baseline.read_text())
    by_device = doc["devices"][analysis.baseline_key("cpu: test machine", "smollm2-135m", "bfloat16")]
    assert by_device["dynamic"]["timed_passes"] == 3.0
    assert by_device["dynamic"]["counted_passes"] == 3.0
    by_type = doc["devices"][analysis.baseline_key("cpu", "smollm2-135m", "bfloat16")]
    assert by_type["static"] == {**by_type["static"], "counted_passes": 1.0}
    assert "timed_passes" not in by_type["static"]  # timed passes belong to one machine, not a device type
    assert "dynamic: timed_passes 3.000, counted_passes 3.000" in capsys.readouterr().out


def test_bad_run_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["baseline", str(bad), "--baseline", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvcache baseline: ") and str(bad) in err and "\n" not in err


def judged(run: dict, baseline: dict) -> dict:
    """The kv section of a recorded run analysed again against ``baseline``."""
    settings = {**run["kv"]["settings"], "caches": ["dynamic"], "confidence": 0.95, "resamples": 200, "seed": 0,
                "max_drift": 0.1, "tolerance": 0.1, "counted_tolerance": 0.05, "max_passes": {}, "min_r2": 0.9}
    raw = {**run["kv"], "copy": run["kv"]["copy"]["measurements"]}
    return analysis.analyse(run["benchmarks"], raw, settings, baseline)


def test_counted_gate_against_a_recorded_baseline(tmp_path):
    """A planted +2 counted passes against the recorded clean run is a regression; the clean run passes."""
    clean = make_run({"dynamic": 3.0})
    path = tmp_path / "b.json"
    analysis.record_baseline(str(path), clean["kv"], "2026-11-29T00:00:00")
    assert judged(clean, gate.load_baseline(path))["verdict"]["dynamic"]["counted"]["status"] == "pass"
    kv = judged(make_run({"dynamic": 3.0}, counted={"dynamic": 5.0}), gate.load_baseline(path))
    assert kv["verdict"]["dynamic"]["counted"]["status"] == "regression"
    assert any("dynamic counted passes 5 exceed the allowed 3.05" in line for line in analysis.failures(kv))
