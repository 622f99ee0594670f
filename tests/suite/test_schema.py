"""A real run (``pytest benchmarks`` on ``tiny``) against the JSON Schema in the package and through the records:
the file validates, a broken copy of it does not, and ``KV.from_json`` / ``to_json`` give back the same section.
Nothing here asserts on timing (``--kv-no-gate``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from kvrun import describe, load_json, run_suite

from kvcache.analysing.records import KV, SCHEMA, json_schema, load_run

pytest.importorskip("torch")
pytest.importorskip("transformers")
jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("schema")
    path = tmp / "run.json"
    done = run_suite("--kv-model", "tiny", "--kv-caches", "dynamic,static", "--kv-contexts", "128,256,512",
                     "--kv-rounds", "1", "--kv-steps", "3", "--kv-warmup", "0", "--kv-copy-mib", "8", "--kv-no-gate",
                     "--kv-gpus", "t4,a100,h100", "--kv-baseline", "none",
                     "--benchmark-json", str(path))
    assert done.returncode == 0, describe(done)
    return path, load_json(path)


@pytest.fixture(scope="module")
def validator():
    validator = jsonschema.Draft202012Validator(json_schema())
    validator.check_schema(validator.schema)
    return validator


def test_a_real_run_validates(real_run, validator):
    _, doc = real_run
    assert doc["kv"]["schema"] == SCHEMA
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert errors == []


def test_a_broken_real_run_is_rejected(real_run, validator):
    _, doc = real_run
    broken = copy.deepcopy(doc)
    broken["kv"]["verdict"]["dynamic"]["timed"]["status"] = "maybe"
    errors = list(validator.iter_errors(broken))
    assert [list(e.absolute_path) for e in errors] == [["kv", "verdict", "dynamic", "timed", "status"]]
    wrong_type = copy.deepcopy(doc)
    wrong_type["kv"]["traffic"]["static"]["passes"] = "1.0"
    assert not validator.is_valid(wrong_type)


def test_a_real_run_round_trips_losslessly(real_run):
    path, doc = real_run
    record = KV.from_json(doc["kv"])
    assert json.dumps(record.to_json(), sort_keys=True) == json.dumps(doc["kv"], sort_keys=True)
    run = load_run(path)
    assert run.record.to_json() == doc["kv"]
    assert {p.cache for p in record.points} == {"dynamic", "static"} and len(run.points) == 6


def test_the_records_know_every_key_a_real_run_writes(real_run):
    """Every key the suite writes below the top of ``kv`` is a field of its record (none left in ``extra``)."""
    record = KV.from_json(real_run[1]["kv"])
    sections = {f"kv.{key}" for key in record.extra}  # whole sections beside the known ones may be added
    assert [path for path in record.unknown_keys("kv") if path not in sections] == []


def test_backends_and_gpus_are_recorded_and_typed(real_run, validator):
    _, doc = real_run
    dynamic = doc["kv"]["traffic"]["dynamic"]
    assert set(dynamic["backends"]) == {"cudnn", "flash", "efficient", "math"}
    assert dynamic["gpus"]["t4"]["backend"] == "math" and dynamic["gpus"]["a100"]["backend"] == "flash"
    assert "flash" in dynamic["gpus"]["t4"]["rejected"]
    broken = copy.deepcopy(doc)
    broken["kv"]["traffic"]["dynamic"]["gpus"]["t4"]["passes"] = "25"
    assert [list(e.absolute_path) for e in validator.iter_errors(broken)] == [
        ["kv", "traffic", "dynamic", "gpus", "t4", "passes"]]
    broken = copy.deepcopy(doc)
    broken["kv"]["traffic"]["dynamic"]["backends"]["math"]["surprise"] = 1
    assert not validator.is_valid(broken)
