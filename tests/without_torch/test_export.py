"""``kvcache export --format github-action-benchmark``: the ``customSmallerIsBetter`` array, exactly the action's
fields with their types."""

from __future__ import annotations

import json
import math

import pytest
from fakerun import recorded_run, write_run

from kvcache.cli import main


def test_entries_have_exactly_the_actions_fields_with_their_types(tmp_path, capsys):
    run = recorded_run(resamples=200)
    run["kv"]["traffic"]["static"]["weight_passes"] = math.nan  # not a number: left out, never written as NaN
    path = write_run(tmp_path / "run.json", run)
    assert main(["export", str(path), "--format", "github-action-benchmark"]) == 0
    entries = json.loads(capsys.readouterr().out)
    names = [e["name"] for e in entries]
    assert names == [f"{cache}: {m}" for cache in ("dynamic", "static")
                     for m in ("timed passes", "counted passes", "intercept", "ATen ops per step",
                               "host syncs per step", "weight passes",
                               "memory allocated passes", "memory peak passes", "memory held passes")
                     if (cache, m) != ("static", "weight passes")]
    for entry in entries:
        timed = entry["name"].endswith(("timed passes", "intercept"))
        assert set(entry) == {"name", "unit", "value", "extra", *(["range"] if timed else [])}, entry
        assert all(isinstance(entry[k], str) for k in set(entry) - {"value"}), entry
        assert isinstance(entry["value"], (int, float)) and not isinstance(entry["value"], bool), entry
        assert math.isfinite(entry["value"])
    by_name = {e["name"]: e for e in entries}
    assert by_name["dynamic: counted passes"] == {
        "name": "dynamic: counted passes", "unit": "passes", "value": 3.0,
        "extra": "tiny, bfloat16 on cpu: AMD EPYC (1 threads); transformers 5.24.0; torch 2.13.0+cpu"}
    assert by_name["dynamic: ATen ops per step"]["unit"] == "ops" and by_name["dynamic: intercept"]["unit"] == "ms"
    fit = run["kv"]["fit"]["dynamic"]
    lo, hi = fit["passes_ci"]
    assert by_name["dynamic: timed passes"]["range"] == f"{lo:.4g} to {hi:.4g} (bootstrap interval)"


def test_measures_pick_and_out_writes(tmp_path, capsys):
    path = write_run(tmp_path / "run.json", recorded_run(resamples=200))
    out = tmp_path / "bench.json"
    assert main(["export", str(path), "--format", "github-action-benchmark", "--measures", "counted",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert [e["name"] for e in json.loads(out.read_text())] == ["dynamic: counted passes", "static: counted passes"]


@pytest.mark.parametrize("argv, message", [
    (["{run}", "--format", "csv"], "--format 'csv' is not known; choose from github-action-benchmark"),
    (["{run}", "--format", "github-action-benchmark", "--measures", "counted,speed"], "'speed'"),
    (["{tmp}/none.json", "--format", "github-action-benchmark"], "none.json: cannot read"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message):
    run = write_run(tmp_path / "run.json", recorded_run(resamples=200))
    assert main(["export", *[a.format(run=run, tmp=tmp_path) for a in argv]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvcache export: ") and message in err and "\n" not in err, err


def test_memory_is_the_three_passes_figures_in_passes(tmp_path, capsys):
    """Counted memory is exported as its three judged figures, in passes (bytes per KV-cache byte), nothing else of
    ``kv.memory`` (contexts, per-op maps, factors)."""
    run = recorded_run(resamples=200)
    run["kv"]["memory"] = {"dynamic": {"allocated_passes": 1.0, "peak_passes": 0.0167, "held_passes": 2.5,
                                       "peak_factor": 1.0167, "declared_factor": 2.0, "contexts": [256, 512],
                                       "allocated_by_op": {"cat": 1.0}}}
    path = write_run(tmp_path / "run.json", run)
    assert main(["export", str(path), "--format", "github-action-benchmark", "--measures", "memory"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [(e["name"], e["unit"], e["value"]) for e in entries] == [
        ("dynamic: memory allocated passes", "passes", 1.0), ("dynamic: memory peak passes", "passes", 0.0167),
        ("dynamic: memory held passes", "passes", 2.5)]
    assert all(set(e) == {"name", "unit", "value", "extra"} for e in entries)
