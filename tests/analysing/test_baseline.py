"""kvcache.analysing.baseline: what enters a baseline, schema 1 files, locked atomic writes keeping the mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakerun import make_run

from kvcache.analysing import baseline, identity

ROOT = Path(__file__).resolve().parents[2]
DEVICE_KEY = "cpu: test machine | smollm2-135m | bfloat16"
TYPE_KEY = "cpu | smollm2-135m | bfloat16"


def kv(**changes) -> dict:
    out = make_run({"dynamic": 3.0, "static": 1.0})["kv"]
    out = {**out, "session": {"interrupted": False, "exit": "ok", "failed": []}}
    for key, value in changes.items():
        out[key] = value
    return out


def test_keys_follow_run_identity():
    ident = identity.of_run(kv())
    assert identity.key(ident, "timed") == DEVICE_KEY
    assert identity.key(ident, "counted") == TYPE_KEY


def test_a_good_run_records_timed_on_the_machine_and_counted_on_the_device_type():
    entries, refused = baseline.entries_of_run(kv(), "2026-11-29T00:00:00")
    assert refused == []
    assert entries[DEVICE_KEY]["dynamic"]["timed_passes"] == 3.0
    assert "counted_passes" not in entries[DEVICE_KEY]["dynamic"]
    assert entries[TYPE_KEY]["dynamic"]["counted_passes"] == 3.0
    assert entries[TYPE_KEY]["dynamic"]["counted_by_op"]


def garbage_runs():
    good = kv()
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
    doc = baseline.load(path)
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
    doc = baseline.load(path)
    assert doc["schema"] == 2
    assert doc["devices"]["cpu | tiny | bfloat16"]["dynamic"]["counted_passes"] == 3.0
    assert "counted_passes" not in doc["devices"]["cpu: Intel Xeon (2 threads) | tiny | bfloat16"]["dynamic"]
    baseline.update(path, {"cpu | tiny | bfloat16": {"static": {"counted_passes": 1.0}}})
    assert json.loads(path.read_text())["schema"] == 2


def test_the_committed_baseline_loads():
    doc = baseline.load(ROOT / "kv-baseline.json")
    entries, _ = baseline.for_run(doc, {"device_type": "cpu", "model": "tiny", "dtype": "bfloat16",
                                        "device_name": "cpu: somewhere (2 threads)"})
    assert entries["counted"]["dynamic"]["counted_passes"] == pytest.approx(3.0)


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
    path.write_text(json.dumps(baseline.empty()))
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
from kvcache.analysing import baseline
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
    recorded = baseline.load(path)["devices"]["cpu | tiny | bfloat16"]
    assert len(recorded) == writers * count
