"""scripts/gate_power.py's A/B mode (--ab) without measuring: the `kvcache ab` command lines it would run (B sides
rotated, the twin plug-ins on side B only) and the tally of fake runs (clean: red by exit status, every gate on;
twins: caught by the paired timed verdict alone)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))  # the scripts import each other as `python scripts/gate_power.py` lets them
import gate_power  # noqa: E402
import gate_power_ab  # noqa: E402
import gate_power_series  # noqa: E402


def test_ab_runs_rotate_the_b_sides_and_load_each_twin_on_side_b_only(tmp_path):
    opts = gate_power.parser().parse_args(["--ab", "--runs", "2", "--model", "tiny", "--tolerance", "0.1"])
    runs = gate_power_ab.ab_runs(opts, tmp_path)
    assert [r["side"] for r in runs] == ["clean", "copy", "layout", "copy", "layout", "clean"]
    for r in runs:
        cmd = r["cmd"]
        assert cmd[1:4] == ["-m", "kvcache.cli", "ab"]
        assert cmd[cmd.index("--json") + 1] == str(tmp_path / r["json"])
        common = cmd[cmd.index("--") + 1:]
        assert common[common.index("--kv-caches") + 1] == "dynamic" and "--kv-model" in common
        assert "--a-args" not in cmd
        b_args = cmd[cmd.index("--b-args") + 1] if "--b-args" in cmd else ""
        assert b_args == {"clean": "", "copy": "-p kvcache.testing.twin_copy",
                          "layout": "-p kvcache.testing.twin_layout"}[r["side"]]
    with pytest.raises(SystemExit):
        gate_power_ab.ab_sides("clean,nope")


def test_ab_summary_counts_false_alarms_by_exit_and_catches_by_the_timed_verdict(tmp_path):
    def doc(timed: str, counted: str = "pass") -> dict:
        return {"kv": {"schema": 2, "environment": {"device_name": "cpu: test"}, "settings": {"model": "tiny"}},
                "ab": {"dynamic": {"timed": {"status": timed, "ratio": 1.7, "ratio_ci": [1.5, 1.9]},
                                   "counted": {"status": counted}, "ledger": {"cat": {"status": "pass"}}}},
                "ab_run": {"sides": {"a": {"drift": 0.01}, "b": {"drift": -0.02}}}}
    runs = [("ab-clean-1", "clean", 0, doc("pass")), ("ab-copy-1", "copy", 1, doc("regression", "regression")),
            ("ab-layout-1", "layout", 1, doc("inconclusive"))]
    manifest = []
    for name, side, code, content in runs:
        (tmp_path / f"{name}.json").write_text(json.dumps(content))
        manifest.append({"name": name, "side": side, "repetition": 1, "json": f"{name}.json", "exit": code})
    (tmp_path / gate_power_ab.AB_MANIFEST).write_text(json.dumps(manifest))
    text = gate_power_ab.summarize_ab(tmp_path)
    assert "- clean: 0/1 false alarms" in text
    assert "- copy: 1/1 caught" in text
    assert "- layout: 0/1 caught" in text  # red by exit (overhead) is not a catch: the timed verdict decides


def test_resume_keeps_the_finished_runs_and_runs_only_the_missing_ones(tmp_path, monkeypatch):
    """A series stopped after its first run, resumed with --resume: the kept run is neither deleted nor run again; a
    resume under the other --competing setting is refused (one series, one condition)."""
    ran = []
    monkeypatch.setattr(gate_power_series, "run", lambda cmd, log: ran.append(log.stem) or 0)
    opts = gate_power.parser().parse_args(["--ab", "--runs", "2", "--b-sides", "clean,copy", "--resume"])
    kept = {"name": "ab-clean-1", "side": "clean", "repetition": 1, "json": "ab-clean-1.json", "exit": 0,
            "competing": False}
    (tmp_path / "ab-clean-1.json").write_text("{}")
    (tmp_path / gate_power_ab.AB_MANIFEST).write_text(json.dumps([kept]))
    gate_power_ab.measure_ab(opts, tmp_path)
    assert ran == ["ab-copy-1", "ab-copy-2", "ab-clean-2"]
    manifest = json.loads((tmp_path / gate_power_ab.AB_MANIFEST).read_text())
    assert [entry["name"] for entry in manifest] == ["ab-clean-1", *ran]
    assert (tmp_path / "ab-clean-1.json").exists()
    busy = gate_power.parser().parse_args(["--ab", "--runs", "2", "--resume", "--competing"])
    with pytest.raises(SystemExit, match="were run without --competing"):
        gate_power_ab.measure_ab(busy, tmp_path)


def test_more_rounds_within_is_passed_to_kvcache_ab_and_shown_only_when_a_run_has_it(tmp_path):
    opts = gate_power.parser().parse_args(["--ab", "--runs", "1", "--b-sides", "clean"])
    assert "--more-rounds-within" not in gate_power_ab.ab_runs(opts, tmp_path)[0]["cmd"]  # default: off
    opts = gate_power.parser().parse_args(["--ab", "--runs", "1", "--b-sides", "clean", "--more-rounds-within", "5"])
    cmd = gate_power_ab.ab_runs(opts, tmp_path)[0]["cmd"]
    assert cmd[cmd.index("--more-rounds-within") + 1] == "5.0" and cmd.index("--more-rounds-within") < cmd.index("--")
    doc = {"kv": {"schema": 2, "environment": {"device_name": "cpu: test"}, "settings": {"model": "tiny"}},
           "ab": {"dynamic": {"timed": {"status": "inconclusive", "ratio": 1.1, "ratio_ci": [0.9, 1.3]}}},
           "ab_run": {"sides": {"a": {"drift": 0.01}, "b": {"drift": -0.02}},
                      "more_rounds": {"first_rounds": 2, "rounds": 6, "seconds": 123.4, "gave_up": True,
                                      "extensions": [{"rounds": 2}, {"rounds": 2}]}}}
    (tmp_path / "ab-clean-1.json").write_text(json.dumps(doc))
    (tmp_path / gate_power_ab.AB_MANIFEST).write_text(json.dumps(
        [{"name": "ab-clean-1", "side": "clean", "repetition": 1, "json": "ab-clean-1.json", "exit": 0}]))
    text = gate_power_ab.summarize_ab(tmp_path)
    assert "| more rounds |" in text and "gave up, +4 (2×, 123 s)" in text
    del doc["ab_run"]["more_rounds"]
    (tmp_path / "ab-clean-1.json").write_text(json.dumps(doc))
    assert "more rounds" not in gate_power_ab.summarize_ab(tmp_path)
