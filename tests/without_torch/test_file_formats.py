"""Every file a command reads or writes is a record (docs/records.md, "Files"): old files of every format still load,
and the settings a run records are the session's settings' fields, declared once."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from kvcache.analysing import history
from kvcache.analysing.judge import baseline
from kvcache.analysing.judge.entries import BaselineEntry
from kvcache.analysing.records import SCHEMA, RunSettings, identity, jsonfile
from kvcache.analysing.records.ab_document import ab_section_json, read_ab_section
from kvcache.analysing.records.file_formats import HistoryEntry, ProbeEntry, SentinelState
from kvcache.analysing.records.jsonrecord import BOOKKEEPING, RecordError
from kvcache.analysing.settings import Settings
from kvcache.bisect import probing

DATA = Path(__file__).resolve().parents[1] / "data"

#: kv.settings's keys as RunSettings declared them by hand before it was made from Settings: the JSON is unchanged.
SETTINGS_KEYS = [
    "model", "device", "dtype", "caches", "contexts", "counted_contexts", "fill", "warmup", "steps", "rounds", "order",
    "seed", "copy_bytes", "copy_repeats", "max_drift", "baseline", "update_baseline", "tolerance", "counted_tolerance",
    "memory_tolerance", "ops_tolerance", "weight_passes_tolerance", "ledger_tolerance", "max_passes", "min_r2",
    "confidence", "resamples", "gate", "strict", "remeasure", "remeasure_seconds", "ledger_steps", "threads", "compile",
    "driver", "gpus", "batch", "ragged", "decoding", "model_path"]


def test_run_settings_are_the_settings_fields_declared_once():
    names = [f.name for f in fields(RunSettings) if f.name not in BOOKKEEPING]
    assert names == [f.name for f in fields(Settings)] + ["model_path"] == SETTINGS_KEYS


def test_recorded_settings_write_the_json_they_always_wrote():
    recorded = identity.recorded_settings(Settings(gpus=()))
    out = recorded.to_json()
    assert list(out) == [k for k in SETTINGS_KEYS if k not in ("gpus", "decoding", "model_path")]
    assert out["caches"] == ["dynamic", "static"] and out["counted_contexts"] == [256, 512]
    assert out["max_passes"] == {} and out["threads"] == 1 and out["copy_bytes"] == 1024 << 20
    assert identity.recorded_settings(Settings(gpus=("t4",))).to_json()["gpus"] == ["t4"]
    decoded = identity.recorded_settings(Settings(decoding=("greedy", "beam:4"))).to_json()
    assert decoded["decoding"] == ["greedy", "beam:4"]
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


# --- the baseline ---------------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_baseline_loads_and_is_written_back_byte_for_byte(tmp_path):
    """The committed kv-baseline.json (schema 2, written by the writer before the record) reads as a record and
    the writer gives back the same text."""
    text = (ROOT / "kv-baseline.json").read_text()
    doc = baseline.load(ROOT / "kv-baseline.json")
    assert doc.schema == 2 and doc.devices and all(isinstance(e, BaselineEntry) for c in doc.devices.values()
                                                   for e in c.values())
    baseline.write(tmp_path / "again.json", doc)
    assert (tmp_path / "again.json").read_text() == text


def test_a_schema_1_baseline_loads_upgraded():
    old = {"schema": 1, "devices": {"cpu: X (2 threads) | tiny | bfloat16": {"dynamic": {
        "timed_passes": 3.1, "timed_r2": 0.99, "counted_passes": 3.0, "recorded": "2026-01-01", "model": "tiny"}}}}
    path = DATA / "baseline-schema-1.json"
    assert json.loads(path.read_text()) == old
    doc = baseline.load(path)
    assert doc.schema == 2
    assert doc.devices["cpu | tiny | bfloat16"]["dynamic"].counted_passes == 3.0
    assert doc.devices["cpu: X (2 threads) | tiny | bfloat16"]["dynamic"].counted_passes is None
    assert doc.to_json()["devices"]["cpu: X (2 threads) | tiny | bfloat16"]["dynamic"] == {
        "timed_passes": 3.1, "timed_r2": 0.99, "recorded": "2026-01-01", "model": "tiny"}


def test_an_unknown_entry_key_is_kept_when_the_baseline_is_rewritten(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"schema": 2, "devices": {"k": {"dynamic": {"counted_passes": 3.0, "new": 1}}}}))
    baseline.update(path, {"k": {"static": {"counted_passes": 1.0}}})
    assert json.loads(path.read_text())["devices"]["k"] == {"dynamic": {"counted_passes": 3.0, "new": 1},
                                                          "static": {"counted_passes": 1.0}}


# --- the history store ----------------------------------------------------------------------------------------------


def test_an_old_history_store_loads_and_is_rewritten_unchanged(tmp_path):
    """A line without ``schema`` (accepted) and a schema-1 line, each kept as it was when an entry is added."""
    lines = [{"commit": "a" * 40, "release": None, "identity": {"device_type": "cpu", "model": "tiny"},
              "setup": "cpu, tiny", "caches": {"dynamic": {"counted": 3.0}}},
             {"schema": 1, "commit": None, "release": "5.24.0", "identity": {"device_type": "cpu", "model": "tiny"},
              "setup": "cpu, tiny", "transformers": "5.24.0", "datetime": "2026-12-01T00:00:00", "run": "r.json",
              "caches": {"dynamic": {"counted": 3.0, "by_op": {"aten::cat": 1.0}}}, "something_new": [1]}]
    store = tmp_path / "h.jsonl"
    text = "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines)
    store.write_text(text)
    entries = history.read_store(store)
    assert [(e.commit, e.release, e.schema) for e in entries] == [("a" * 40, None, 1), (None, "5.24.0", 1)]
    assert entries[1].extra == {"something_new": [1]}
    new = HistoryEntry(commit="b" * 40, identity={"device_type": "cpu", "model": "tiny"}, setup="cpu, tiny",
                       caches={"dynamic": {"counted": 3.5}})
    history.add(store, new)
    assert store.read_text() == text + json.dumps(new.to_json(), sort_keys=True) + "\n"


@pytest.mark.parametrize(("line", "says"), [
    ('{"schema": 2, "commit": "a", "caches": {}}', "h.jsonl:1 is not a history entry (schema 2 is not one of the"),
    ('{"schema": 1, "caches": {}}', "h.jsonl:1 is not a history entry (no commit or release, or no caches)"),
    ('[1]', "h.jsonl:1 is not a history entry (its top level is a list"),
])
def test_a_line_that_is_not_an_entry_is_one_line(tmp_path, line, says):
    store = tmp_path / "h.jsonl"
    store.write_text(line + "\n")
    with pytest.raises(history.HistoryError, match=re.escape(says)):
        history.read_store(store)


# --- the probe cache ------------------------------------------------------------------------------------------------


def test_a_probe_cached_by_the_old_writer_loads_and_is_written_back_the_same(tmp_path):
    cache = probing.ProbeCache(tmp_path, {"options": ["--kv-model", "tiny"]})
    cache.folder.mkdir(parents=True)
    kv = {"schema": 2, "traffic": {"dynamic": {"passes": 3.0}}}  # an older run schema, upgraded on load
    old = {"identity": cache.identity_hash, "item": "c0", "kv": kv, "reason": "", "transformers": "5.24.0",
           "untrusted": ["is_torch_greater_or_equal"], "seconds": 12.5}
    (cache.folder / "c0.json").write_text(json.dumps(old))  # what the writer wrote before ProbeEntry
    found = cache.get(probing.Revision("c0", "c0"))
    assert found is not None and found.cached and found.kv.traffic["dynamic"].passes == 3.0
    assert (found.transformers, found.untrusted, found.seconds) == ("5.24.0", ["is_torch_greater_or_equal"], 12.5)
    skipped = {**old, "kv": None, "reason": "ImportError: old"}
    (cache.folder / "c1.json").write_text(json.dumps(skipped))
    assert cache.get(probing.Revision("c1", "c1")).reason == "ImportError: old"
    assert ProbeEntry.load(cache.folder / "c1.json").to_json() == skipped
    cache.put(probing.ProbeResult(probing.Revision("c2", "c2"), kv=None, reason="ImportError: old",
                                  transformers="5.24.0", untrusted=[], seconds=1.04))
    assert (cache.folder / "c2.json").read_text() == json.dumps({**skipped, "item": "c2", "untrusted": [],
                                                                 "seconds": 1.0})


@pytest.mark.parametrize("text", ["{", "[]", '{"identity": "x"}', '{"kvcache_probe": 2}'])
def test_a_file_that_is_not_a_probe_is_measured_again(tmp_path, text):
    cache = probing.ProbeCache(tmp_path, {"options": []})
    cache.folder.mkdir(parents=True)
    (cache.folder / "c0.json").write_text(text)
    assert cache.get(probing.Revision("c0", "c0")) is None


# --- no record -> dict -> record inside one process -------------------------------------------------------------------


def test_kvcache_traffic_shows_a_class_backends_from_its_record():
    from kvcache.analysing.records import BackendCount, Traffic
    from kvcache.commands.traffic import backend_lines_of

    traffic = Traffic.of(passes=3.0, backends={"math": BackendCount.of(passes=25.26),
                                               "flash": BackendCount.of(error="needs sm80")})
    assert backend_lines_of("dynamic", traffic) == ["backends dynamic: math 25.26 · flash — (needs sm80)"]


# --- the A/B file ---------------------------------------------------------------------------------------------------


def old_ab_file() -> dict:
    """An A/B file as kvcache ab wrote it before its records: side B's kv of schema 2, ab_run without seconds."""
    verdict = {"status": "pass", "reason": "B/A slope ×1.00 [0.98, 1.02] within ×1.100", "value": 1.0,
               "allowed": 1.1, "ratio": 1.0, "ratio_ci": [0.98, 1.02], "a": 3.0, "b": 3.0}
    kv = {"schema": 2, "settings": {"caches": ["dynamic"]}, "traffic": {"dynamic": {"passes": 3.0}}}
    return {"benchmarks": [], "machine_info": {}, "commit_info": {}, "datetime": "2026-12-01T00:00:00+00:00",
            "version": None, "kv": kv, "ab": {"dynamic": {"timed": verdict, "intercept": verdict, "ledger": {
                "aten::cat": verdict}, "counted": {"status": "pass", "reason": "", "value": 3.0, "allowed": 3.15}}},
            "ab_run": {"format": 1, "tolerance": 0.1, "interrupted": None, "failed": [], "items": 4, "pairs": [],
                       "sides": {"a": {"args": [], "release": None}, "b": {"args": [], "release": None}},
                       "paired_drift": {"dynamic": None}, "notes": []},
            "side_a": {"benchmarks": [], "machine_info": {}, "datetime": "2026-12-01T00:00:00+00:00", "kv": kv}}


def test_an_old_ab_file_is_read_by_report_and_comment(tmp_path):
    from kvcache.analysing.report.ab import ab_file_of
    from kvcache.commands.comment import read_ab

    path = tmp_path / "ab.json"
    path.write_text(json.dumps(old_ab_file()))
    found = ab_file_of(path)
    assert found is not None and found.tolerance == 0.1 and found.run.items == 4
    verdicts = read_ab_section(found.ab)
    assert verdicts["dynamic"]["ledger.aten::cat"].ratio == 1.0 and verdicts["dynamic"]["counted"].value == 3.0
    assert ab_section_json(verdicts) == old_ab_file()["ab"]  # what the writer writes of them: the same section
    assert read_ab(str(path)) == old_ab_file()["ab"]
    plain = tmp_path / "run.json"
    plain.write_text(json.dumps({"benchmarks": [], "kv": old_ab_file()["kv"]}))
    assert ab_file_of(plain) is None and read_ab(str(plain)) is None


def test_a_result_stopped_at_start_up_is_written_as_before():
    from kvcache.ab.results import results_before_start
    from kvcache.ab.sides import Side

    sides = [Side(name, {}, ["--kv-dtype", "float32"], Path(f"{name}.log")) for name in "ab"]
    doc = results_before_start(sides, "SIGTERM", 0.1).to_json()
    kv = {"schema": SCHEMA, "session": {"interrupted": True, "exit": "interrupted by SIGTERM", "failed": []}}
    assert doc["kv"] == kv and doc["side_a"] == {"benchmarks": [], "machine_info": {}, "datetime": doc["datetime"],
                                                 "kv": kv}
    assert doc["ab"] == {} and doc["machine_info"] == {} and list(doc) == [
        "benchmarks", "machine_info", "commit_info", "datetime", "version", "kv", "ab", "ab_run", "side_a"]
    assert doc["ab_run"]["notes"] == ["interrupted by SIGTERM during start-up: nothing was measured"]
    assert "seconds" not in doc["ab_run"] and doc["ab_run"]["sides"]["a"]["args"] == ["--kv-dtype", "float32"]


# --- the bisect JSON ------------------------------------------------------------------------------------------------


def test_a_bisect_step_is_written_as_before_and_read_back():
    """``changes[]`` of ``kvcache bisect --json``: the keys in the order the writer always gave them, candidates only
    where items could not be measured."""
    from kvcache.analysing.records.file_formats import BisectStep

    named = BisectStep.of(first_bad="c2", subject="s", date="d", parent="c1", before=3.0, after=4.0, change=1.0,
                          ops={"aten::cat": 1.0}, unit="")
    assert list(named.to_json()) == ["first_bad", "subject", "date", "parent", "before", "after", "change", "ops",
                                     "unit"]
    skipped = BisectStep.of(first_bad=None, subject="s", date="d", parent="c1", before=3.0, after=4.0, change=1.0,
                            ops={}, unit="")
    skipped.update(candidates=["c2", "c3"])
    old = {"first_bad": None, "subject": "s", "date": "d", "parent": "c1", "before": 3.0, "after": 4.0,
           "change": 1.0, "ops": {}, "candidates": ["c2", "c3"], "unit": ""}
    assert skipped.to_json() == old and list(skipped.to_json()) == list(old)
    assert BisectStep.from_json(old) == skipped
