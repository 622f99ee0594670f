"""Every file a command reads or writes is a record (docs/records.md, "Files"): old files of every format still load,
and the settings a run records are the session's settings' fields, declared once."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from kvcache.analysing import identity
from kvcache.analysing.jsonrecord import BOOKKEEPING
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
