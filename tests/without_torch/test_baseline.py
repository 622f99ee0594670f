"""kvcache.analysing.judge.baseline: what enters a baseline, schema 1 files, locked atomic writes keeping the mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakerun import make_run

from kvcache.analysing.judge import baseline
from kvcache.analysing.records import KV, identity

ROOT = Path(__file__).resolve().parents[2]
DEVICE_KEY = "cpu: test machine | smollm2-135m | bfloat16"
TYPE_KEY = "cpu | smollm2-135m | bfloat16"


def raw(**changes) -> dict:
    out = make_run({"dynamic": 3.0, "static": 1.0})["kv"]
    out = {**out, "session": {"interrupted": False, "exit": "ok", "failed": []}}
    for key, value in changes.items():
        out[key] = value
    return out


def kv(**changes) -> KV:
    return KV.from_json(raw(**changes))


def test_keys_follow_run_identity():
    ident = identity.of_run(kv())
    assert identity.baseline_key(ident, "timed") == DEVICE_KEY
    assert identity.baseline_key(ident, "counted") == TYPE_KEY


def test_a_good_run_records_timed_on_the_machine_and_counted_on_the_device_type():
    entries, refused = baseline.entries_of_run(kv(), "2026-11-29T00:00:00")
    assert refused == []
    assert entries[DEVICE_KEY]["dynamic"]["timed_passes"] == 3.0
    assert "counted_passes" not in entries[DEVICE_KEY]["dynamic"]
    assert entries[TYPE_KEY]["dynamic"]["counted_passes"] == 3.0
    assert entries[TYPE_KEY]["dynamic"]["counted_by_op"]


def garbage_runs():
    good = raw()
    fit = good["fit"]["dynamic"]
    yield "negative passes", kv(fit={**good["fit"], "dynamic": {**fit, "passes": -23.78}}), "slope is not positive"
    yield "poor fit", kv(fit={**good["fit"], "dynamic": {**fit, "r2": 0.23}}), "poor fit"
    two = {**fit, "contexts": [512, 1024]}
    yield "two contexts", kv(fit={**good["fit"], "dynamic": two}), "at least 3 distinct contexts"
    yield "fit error", kv(fit={**good["fit"], "dynamic": {"error": "slope is not positive"}}), "slope is not positive"
    yield "drift", kv(drift={**good["drift"], "fraction": 14.2, "ok": False}), "drift +1420.0%"
    yield "drift unchecked", kv(drift={"reason": "deselected"}), "drift not checked"
    yield "interrupted", kv(session={"interrupted": True, "exit": "interrupted", "failed": []}), "did not finish"
    yield "failed point", kv(session={"interrupted": False, "exit": "tests_failed", "failed": ["dynamic"]}), "failed"


@pytest.mark.parametrize(("case", "run", "why"), list(garbage_runs()), ids=[c for c, _, _ in garbage_runs()])
def test_nothing_unjudgeable_enters_a_baseline(tmp_path, case, run, why):
    path = tmp_path / "b.json"
    baseline.update(path, {DEVICE_KEY: {"dynamic": {"timed_passes": 3.1}}})
    entries, refused = baseline.record(path, run, "now")
    assert any(line.startswith("dynamic: timed passes not recorded") and why in line for line in refused), refused
    doc = baseline.load(path).to_json()
    assert doc["devices"][DEVICE_KEY]["dynamic"]["timed_passes"] == 3.1  # the old entry stays
    assert doc["devices"][TYPE_KEY]["dynamic"]["counted_passes"] == 3.0  # counted passes are exact: recorded
    if case not in ("drift", "drift unchecked", "interrupted"):
        assert doc["devices"][DEVICE_KEY]["static"]["timed_passes"] == 1.0  # other classes measured fully are


def test_schema_1_files_load_and_are_upgraded_when_rewritten(tmp_path):
    path = tmp_path / "b.json"
    old = {"schema": 1, "devices": {
        "cpu: Intel Xeon (2 threads) | tiny | bfloat16": {"dynamic": {"timed_passes": 6.5, "counted_passes": 3.0}},
        "cpu | tiny | bfloat16": {"static": {"counted_passes": 1.0}}}}
    path.write_text(json.dumps(old))
    doc = baseline.load(path).to_json()
    assert doc["schema"] == 2
    assert doc["devices"]["cpu | tiny | bfloat16"]["dynamic"]["counted_passes"] == 3.0
    assert "counted_passes" not in doc["devices"]["cpu: Intel Xeon (2 threads) | tiny | bfloat16"]["dynamic"]
    baseline.update(path, {"cpu | tiny | bfloat16": {"static": {"counted_passes": 1.0}}})
    assert json.loads(path.read_text())["schema"] == 2


def test_the_committed_baseline_loads():
    doc = baseline.load(ROOT / "kv-baseline.json")
    entries, _ = baseline.for_run(doc, identity.Identity(device_type="cpu", model="tiny", dtype="bfloat16",
                                                         device_name="cpu: somewhere (2 threads)"))
    assert entries["counted"]["dynamic"].counted_passes == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not JSON"),
        ("[]", "top level is a list"),
        ('{"schema": 3, "devices": {}}', "schema 3"),
        ('{"schema": 2}', "'devices'"),
        ('{"schema": 2, "devices": {"d": {"dynamic": {"timed_passes": "3"}}}}', "timed_passes"),
    ],
)
def test_corrupt_baseline_is_one_line_error_naming_the_file(tmp_path, content, problem):
    path = tmp_path / "baseline.json"
    path.write_text(content)
    with pytest.raises(baseline.BaselineError) as info:
        baseline.load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and problem in message


def test_update_refuses_to_overwrite_a_corrupt_baseline(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text("{not json")
    with pytest.raises(baseline.BaselineError):
        baseline.update(path, {DEVICE_KEY: {"dynamic": {"timed_passes": 3.0}}})
    assert path.read_text() == "{not json"


def test_writes_keep_the_file_mode_and_leave_no_temporary_file(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(baseline.empty().to_json()))
    os.chmod(path, 0o644)
    baseline.update(path, {DEVICE_KEY: {"dynamic": {"timed_passes": 3.0}}})
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]
    new = tmp_path / "new.json"
    baseline.update(new, {DEVICE_KEY: {"dynamic": {"timed_passes": 3.0}}})
    umask = os.umask(0)
    os.umask(umask)
    assert new.stat().st_mode & 0o777 == 0o666 & ~umask


WRITER = """
import sys
from kvcache.analysing.judge import baseline
path, writer, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(count):
    baseline.update(path, {"cpu | tiny | bfloat16": {f"w{writer}-{i}": {"counted_passes": 1.0 + i}}})
"""


def test_concurrent_writers_lose_no_update(tmp_path):
    path = tmp_path / "b.json"
    writers, count = 6, 20
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(w), str(count)], cwd=ROOT)
             for w in range(writers)]
    assert [p.wait(timeout=120) for p in procs] == [0] * writers
    recorded = baseline.load(path).to_json()["devices"]["cpu | tiny | bfloat16"]
    assert len(recorded) == writers * count


# --- every figure finite and in its range, read from a file or recorded from a run (issue 21, section 2) ---

ENTRY = "devices['cpu | tiny | bfloat16']['dynamic']"


@pytest.mark.parametrize(
    ("field", "text", "shown"),
    [
        ("counted_passes", "NaN", "counted_passes is nan"),
        ("counted_passes", "1e309", "counted_passes is inf"),  # reads as infinity
        ("counted_passes", "-Infinity", "counted_passes is -inf"),
        ("counted_passes", "1e300", "counted_passes is 1e+300"),
        ("counted_passes", "0", "counted_passes is 0"),
        ("timed_passes", "-3.0", "timed_passes is -3.0"),
        ("timed_intercept_ms", "-0.697", "timed_intercept_ms is -0.697"),
        ("timed_r2", "NaN", "timed_r2 is nan"),
        ("timed_r2", "1.5", "timed_r2 is 1.5"),
        ("timed_weights_ms", "-5", "timed_weights_ms is -5"),
        ("ops_per_step", "1e30", "ops_per_step is 1e+30"),
        ("ops_per_step", "1680.5", "ops_per_step is 1680.5"),
        ("weight_passes", "-0.1", "weight_passes is -0.1"),
        ("layers", "0", "layers is 0"),
        ("fixed_bytes", "1" + "0" * 400, "fixed_bytes is 1000000000"),  # an integer no float holds
        ("counted_by_op", '{"cat": NaN}', "counted_by_op['cat'] is nan"),
        ("timed_ledger", '{"cat": 1e300}', "timed_ledger['cat'] is 1e+300"),
        ("op_calls", '{"add": -1}', "op_calls['add'] is -1"),
        ("counted_by_op", "3", "counted_by_op is 3"),
        ("transformers", "5", "transformers is 5"),
    ],
)
def test_a_baseline_file_with_a_figure_out_of_range_is_refused_naming_the_entry_and_the_value(
        tmp_path, field, text, shown):
    """NaN or 1e309 passes were accepted ("within the allowed nan": the gate then passes anything), and so were a
    negative intercept, R² NaN, weights_ms -5, 1e300 passes and 1e30 ops per step."""
    path = tmp_path / "b.json"
    entry = '{"counted_passes": 3.0, "' + field + '": ' + text + "}"  # NaN, 1e309: json.loads reads them
    path.write_text('{"schema": 2, "devices": {"cpu | tiny | bfloat16": {"dynamic": ' + entry + "}}}")
    with pytest.raises(baseline.BaselineError) as info:
        baseline.load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    assert f"{ENTRY}.{shown}" in message and "expected" in message, message
    assert len(message) < 300, message


def test_figures_in_range_and_nulls_load():
    """In range, falling per-op slopes and a negative fixed-bytes intercept included (an op seen at the low counted
    context only has a falling slope: traffic.op_passes keeps it)."""
    entry = {"counted_passes": 3.0, "counted_by_op": {"cat": 2.0, "sdpa": 1.0, "copy_": -0.1}, "timed_passes": 1e4,
             "timed_r2": 1.0, "timed_intercept_ms": 0.0, "timed_weights_ms": None, "timed_ledger": {"norm": -0.2},
             "ops_per_step": 0, "data_ops_per_step": 1290, "weight_passes": 0.0, "fixed_bytes": -(10**6),
             "layers": 30, "op_calls": {"add": 30}, "recorded": "now", "torch": None, "something_new": "kept"}
    assert baseline.problem_of({"schema": 2, "devices": {"k": {"dynamic": entry}}}) is None


def test_update_never_writes_a_figure_out_of_range(tmp_path):
    path = tmp_path / "b.json"
    baseline.update(path, {TYPE_KEY: {"dynamic": {"counted_passes": 3.0}}})
    before = path.read_text()
    with pytest.raises(baseline.BaselineError, match="counted_passes is nan"):
        baseline.update(path, {TYPE_KEY: {"dynamic": {"counted_passes": float("nan")}}})
    assert path.read_text() == before


def out_of_range_runs():
    good = raw()
    fit = good["fit"]["dynamic"]
    yield "timed R² NaN", kv(fit={**good["fit"], "dynamic": {**fit, "r2": float("nan")}}), "R² is nan"
    settings = {**good["settings"], "min_r2": float("nan")}
    yield "min_r2 NaN", kv(settings=settings, fit={**good["fit"], "dynamic": {**fit, "r2": 0.01}}), "min_r2 is nan"
    yield "1e300 passes", kv(fit={**good["fit"], "dynamic": {**fit, "passes": 1e300}}), "timed passes is 1e+300"


@pytest.mark.parametrize(("case", "run", "why"), list(out_of_range_runs()), ids=[c for c, _, _ in out_of_range_runs()])
def test_timed_figures_out_of_range_are_not_recorded(tmp_path, case, run, why):
    path = tmp_path / "b.json"
    baseline.update(path, {DEVICE_KEY: {"dynamic": {"timed_passes": 3.1, "timed_r2": 0.99}}})
    _, refused = baseline.record(path, run, "now")
    assert any(line.startswith("dynamic: timed passes not recorded") and why in line for line in refused), refused
    recorded = baseline.load(path).to_json()["devices"][DEVICE_KEY]
    assert recorded["dynamic"]["timed_passes"] == 3.1 and recorded["dynamic"]["timed_r2"] == 0.99  # the old stays
    if case != "min_r2 NaN":  # a run's min_r2 judges every class of it
        assert recorded["static"]["timed_passes"] == 1.0


def test_a_negative_intercept_or_decode_speed_is_recorded_as_null_beside_the_passes(tmp_path):
    """A fit with a negative intercept (-0.697 ms at R² 0.95) entered the baseline; compare then called a clean run
    a regression against an allowed -0.767. Now its passes are recorded and the intercept is not (null: the
    intercept is not judged against it); so is a decode speed of -5 ms."""
    good = raw()
    run = kv(fit={**good["fit"], "dynamic": {**good["fit"]["dynamic"], "intercept_ms": -0.697, "r2": 0.95}},
             speed={"weights_ms": -5.0})
    path = tmp_path / "b.json"
    baseline.update(path, {DEVICE_KEY: {"dynamic": {"timed_passes": 3.1, "timed_intercept_ms": 30.0}}})
    _, refused = baseline.record(path, run, "now")
    assert any("dynamic: timed_intercept_ms is -0.697" in line and "recorded as null" in line for line in refused)
    assert any("dynamic: timed_weights_ms is -5.0" in line for line in refused), refused
    recorded = baseline.load(path).to_json()["devices"][DEVICE_KEY]["dynamic"]
    assert recorded["timed_passes"] == 3.0 and recorded["timed_intercept_ms"] is None
    assert recorded["timed_weights_ms"] is None


def test_counted_figures_out_of_range_are_not_recorded(tmp_path):
    """1e300 counted passes and 1e30 ATen ops per step were recorded."""
    good = raw()
    traffic = {"dynamic": {**good["traffic"]["dynamic"], "passes": 1e300},
               "static": {**good["traffic"]["static"], "ops_per_step": 1e30}}
    path = tmp_path / "b.json"
    entries, refused = baseline.record(path, kv(traffic=traffic), "now")
    assert "dynamic: counted passes not recorded: counted_passes is 1e+300, expected a finite number above 0 and at " \
           "most 10000, or null" in refused
    assert any(line.startswith("static: counted overhead not recorded: ops_per_step is 1e+30") for line in refused)
    devices = baseline.load(path).to_json()["devices"]
    assert "dynamic" not in devices[TYPE_KEY] and devices[TYPE_KEY]["static"]["counted_passes"] == 1.0
    overhead = identity.baseline_key(identity.of_run(KV.from_json(good)), "overhead")
    assert "static" not in devices[overhead] and devices[overhead]["dynamic"]["ops_per_step"] == 1680
