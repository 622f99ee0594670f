"""Every file a command reads or writes is a record (docs/records.md, "Files"): old files of every format still load,
and the settings a run records are the session's settings' fields, declared once."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from kvcache.analysing import identity, jsonfile
from kvcache.analysing.file_records import SentinelState
from kvcache.analysing.jsonrecord import BOOKKEEPING, RecordError
from kvcache.analysing.records import RunSettings
from kvcache.analysing.settings import Settings

DATA = Path(__file__).resolve().parents[1] / "data"

#: kv.settings's keys as RunSettings declared them by hand before it was made from Settings: the JSON is unchanged.
SETTINGS_KEYS = [
    "model", "device", "dtype", "caches", "contexts", "counted_contexts", "fill", "warmup", "steps", "rounds", "order",
    "seed", "copy_bytes", "copy_repeats", "max_drift", "baseline", "update_baseline", "tolerance", "counted_tolerance",
    "memory_tolerance", "ops_tolerance", "weight_passes_tolerance", "ledger_tolerance", "max_passes", "min_r2",
    "confidence", "resamples", "gate", "strict", "remeasure", "remeasure_seconds", "ledger_steps", "threads", "compile",
    "driver", "gpus", "batch", "ragged", "model_path"]


def test_run_settings_are_the_settings_fields_declared_once():
    names = [f.name for f in fields(RunSettings) if f.name not in BOOKKEEPING]
    assert names == [f.name for f in fields(Settings)] + ["model_path"] == SETTINGS_KEYS


def test_recorded_settings_write_the_json_they_always_wrote():
    recorded = identity.recorded_settings(Settings(gpus=()))
    out = recorded.to_json()
    assert list(out) == [k for k in SETTINGS_KEYS if k not in ("gpus", "model_path")]
    assert out["caches"] == ["dynamic", "static"] and out["counted_contexts"] == [256, 512]
    assert out["max_passes"] == {} and out["threads"] == 1 and out["copy_bytes"] == 1024 << 20
    assert identity.recorded_settings(Settings(gpus=("t4",))).to_json()["gpus"] == ["t4"]
    assert RunSettings.from_json(out).to_json() == out


def test_a_recorded_runs_settings_round_trip_unchanged():
    settings = json.loads((DATA / "tiny-run.json").read_text())["kv"]["settings"]
    read = RunSettings.from_json(settings, "kv.settings")
    assert read.to_json() == settings and list(read.to_json()) == list(settings)
    assert read.caches == ["dynamic", "static"] and read.gpus == [] and read.model_path is None


# --- the sentinel's state ------------------------------------------------------------------------------------------

SHA = "0123456789abcdef" * 2 + "01234567"
OPEN = {"figure": "traffic.dynamic.passes", "label": "dynamic counted passes", "cache": "dynamic", "measure": "passes",
        "path": ["traffic", "dynamic", "passes"], "unit": "", "tolerance": 0.05, "kind": "changed", "commit": SHA,
        "candidates": [], "subject": "a change", "date": "2026-12-01", "parent": SHA, "before": 3.0, "after": 4.0,
        "change": 1.0, "ops": {"aten::cat": 1.0}, "reproduce": "kvcache bisect ...", "found_at": SHA, "now": 4.0}


def old_state(**change) -> dict:
    """A state as the sentinel wrote it before its record (format 1)."""
    return {"kvcache_sentinel_state": 1, "origin": None, "branch": "main", "options": ["--kv-model", "tiny"],
            "probe_identity": "x", "commit": SHA, "subject": "s", "date": "d", "figures": {OPEN["figure"]: 3.0},
            "open": [OPEN], **change}


def test_an_old_sentinel_state_loads_and_is_written_back_unchanged(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(old_state(), indent=1) + "\n")
    state = SentinelState.load(path, f"--state {path}")
    assert state.commit == SHA and state.figures == {OPEN["figure"]: 3.0} and state.open == [OPEN]
    assert json.dumps(state.to_json(), indent=1) + "\n" == path.read_text()
    jsonfile.write_json(tmp_path / "again.json", state.to_json())
    assert (tmp_path / "again.json").read_text() == path.read_text()
    bare = {k: v for k, v in old_state().items() if k not in ("origin", "branch", "subject", "date", "open")}
    path.write_text(json.dumps(bare))  # the keys a state may lack read as their defaults
    state = SentinelState.load(path, "--state x")
    assert (state.branch, state.origin, state.open, state.subject) == ("main", None, [], "")


@pytest.mark.parametrize(("change", "says"), [
    ({"open": [{k: v for k, v in OPEN.items() if k != "before"}]}, "its open[0] before is None, not a finite number"),
    ({"open": [{"before": 3.0}]}, "its open[0] has no figure"),
    ({"open": ["x"]}, "its open[0] is str, expected an object"),
    ({"open": [{**OPEN, "before": float("nan")}]}, "its open[0] before is nan"),
    ({"open": [{**OPEN, "commit": None, "candidates": [], "parent": ""}]}, "names no commit, no candidates"),
    ({"open": {"x": 1}}, "its open is {'x': 1}, expected a list"),
    ({"figures": {"x": float("nan")}}, "its figures['x'] is nan, not a finite number"),
    ({"figures": {"x": float("inf")}}, "its figures['x'] is inf, not a finite number"),
    ({"figures": {"x": "3"}}, "its figures['x'] is '3', not a finite number"),
    ({"commit": "main"}, "its commit 'main' is not a full commit sha"),
    ({"commit": SHA[:12]}, "is not a full commit sha"),
    ({"commit": None}, "its commit is None, expected a string"),
    ({"options": "--kv-model tiny"}, "its options is '--kv-model tiny', expected a list"),
    ({"kvcache_sentinel_state": 2}, "(kvcache_sentinel_state 2 is not one of the accepted 1)"),
])
def test_a_damaged_sentinel_state_is_refused_in_one_line(tmp_path, change, says):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(old_state(**change)))
    with pytest.raises(RecordError) as caught:
        SentinelState.load(path, f"--state {path}")
    message = str(caught.value)
    assert says in message and message.startswith(f"--state {path} is not a kvcache sentinel state"), message
    assert "\n" not in message
