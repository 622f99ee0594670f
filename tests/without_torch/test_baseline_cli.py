"""``kvcache baseline RUN.json``: a finished run recorded as the baseline, then judged against it."""

from __future__ import annotations

import json

from fakerun import make_run, write_run

from kvcache.analysing import analysis
from kvcache.analysing.judge import baseline
from kvcache.analysing.records import KV
from kvcache.cli import main


def test_records_timed_and_counted_passes(tmp_path, capsys):
    run = write_run(tmp_path / "run.json", make_run({"dynamic": 3.0, "static": 1.0}))
    baseline = tmp_path / "kv-baseline.json"
    assert main(["baseline", str(run), "--baseline", str(baseline)]) == 0
    doc = json.loads(baseline.read_text())
    assert doc["schema"] == 2
    by_device = doc["devices"]["cpu: test machine | smollm2-135m | bfloat16"]
    assert by_device["dynamic"]["timed_passes"] == 3.0
    assert "counted_passes" not in by_device["dynamic"]  # counted passes belong to the device type
    by_type = doc["devices"]["cpu | smollm2-135m | bfloat16"]
    assert by_type["static"] == {**by_type["static"], "counted_passes": 1.0}
    assert "timed_passes" not in by_type["static"]  # timed passes belong to one machine, not a device type
    out = capsys.readouterr().out
    assert "dynamic: timed_passes 3.000" in out and "dynamic: counted_passes 3.000" in out


def test_bad_run_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["baseline", str(bad), "--baseline", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvcache baseline: ") and str(bad) in err and "\n" not in err


def judged(run: dict, doc: dict) -> KV:
    """The kv section of a recorded run judged again against the baseline ``doc``."""
    kv = KV.from_json({**run["kv"], "settings": {**run["kv"]["settings"], "tolerance": 0.1, "counted_tolerance": 0.05}})
    kv.verdict = analysis.run_verdicts(kv, doc)
    return kv


def test_counted_gate_against_a_recorded_baseline(tmp_path):
    """A planted +2 counted passes against the recorded clean run is a regression; the clean run passes."""
    clean = make_run({"dynamic": 3.0})
    path = tmp_path / "b.json"
    baseline.record(str(path), KV.from_json(clean["kv"]), "2026-11-29T00:00:00")
    assert judged(clean, baseline.load(path)).verdict["dynamic"]["counted"].status == "pass"
    kv = judged(make_run({"dynamic": 3.0}, counted={"dynamic": 5.0}), baseline.load(path))
    assert kv.verdict["dynamic"]["counted"].status == "regression"
    assert any("dynamic counted: counted passes 5 is above the allowed 3.05" in line
               for line in analysis.gate_failures(kv))


def garbage_run() -> dict:
    """The run users recorded from: R² 0.23, drift +1420%."""
    run = make_run({"dynamic": 3.0})
    run["kv"]["fit"]["dynamic"].update(passes=957.2, r2=0.23)
    run["kv"]["drift"].update(fraction=14.2, ok=False)
    return run


def test_garbage_timed_passes_are_not_recorded(tmp_path, capsys):
    run = write_run(tmp_path / "run.json", garbage_run())
    path = tmp_path / "kv-baseline.json"
    assert main(["baseline", str(run), "--baseline", str(path)]) == 0
    out = capsys.readouterr().out
    assert "dynamic: timed passes not recorded: poor fit" in out
    doc = json.loads(path.read_text())
    assert "cpu: test machine | smollm2-135m | bfloat16" not in doc["devices"]
    assert doc["devices"]["cpu | smollm2-135m | bfloat16"]["dynamic"]["counted_passes"] == 3.0


def test_a_baseline_file_with_a_figure_out_of_range_is_one_line_and_left_alone(tmp_path, capsys):
    """A baseline holding counted passes NaN was accepted and written back; it is a one-line error (exit 2)
    naming the file, the entry and the value, before anything is recorded."""
    run = write_run(tmp_path / "run.json", make_run({"dynamic": 3.0}))
    path = tmp_path / "kv-baseline.json"
    text = '{"schema": 2, "devices": {"cpu | smollm2-135m | bfloat16": {"dynamic": {"counted_passes": NaN}}}}'
    path.write_text(text)
    assert main(["baseline", str(run), "--baseline", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvcache baseline: ") and "\n" not in err and str(path) in err
    assert "devices['cpu | smollm2-135m | bfloat16']['dynamic'].counted_passes is nan" in err
    assert path.read_text() == text
