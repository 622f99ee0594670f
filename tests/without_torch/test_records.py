"""The ``kv`` section as records: one path to and from JSON (``KV.from_json`` / ``KV.to_json``) that loses
nothing, carries the schema version and keeps keys it does not know; the JSON Schema in the package says the
same as the records. Runs made with tests/fakerun.py (this schema, as written and as the analysis writes it), and
files of older schemas upgraded on the way in (:func:`test_a_file_of_an_older_schema_loads_as_the_same_records`)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from typing import Any

import pytest
from fakerun import analysed, make_run, schema_1, schema_2, write_run

from kvcache.analysing.judge import judges
from kvcache.analysing.records import (
    KV,
    SCHEMA,
    AmortisedTraffic,
    BackendCount,
    CacheCrossovers,
    CompiledTraffic,
    Copy,
    CopyMeasurement,
    Drift,
    Environment,
    Fit,
    FitFailure,
    FusedCount,
    GpuPrediction,
    Identity,
    KindMemory,
    KindTraffic,
    LayerKinds,
    LedgerPoint,
    LedgerRow,
    Memory,
    MemoryBeyond,
    MemorySlopes,
    MemoryStep,
    ModelGeometry,
    Part,
    Point,
    PointCompile,
    Probe,
    RecordError,
    RunSettings,
    ServedBatch,
    Session,
    Skip,
    Speed,
    Traffic,
    TrafficBeyond,
    UnmeasuredDrift,
    Verdict,
    json_schema,
    load_run,
    upgrade_kv,
)

# The schema's definition of each record type.
DEFINITIONS = {"kv": KV, "fit": Fit, "fit_failure": FitFailure, "traffic": Traffic, "probe": Probe, "drift": Drift,
               "unmeasured_drift": UnmeasuredDrift, "verdict": Verdict, "point": Point, "copy": Copy,
               "copy_measurement": CopyMeasurement, "session": Session, "skip": Skip, "memory": Memory, "part": Part,
               "ledger_row": LedgerRow, "ledger_point": LedgerPoint, "speed": Speed,
               "cache_crossovers": CacheCrossovers, "compiled_traffic": CompiledTraffic, "fused_count": FusedCount,
               "compiled_point": PointCompile, "memory_step": MemoryStep, "settings": RunSettings,
               "environment": Environment, "identity": Identity, "model": ModelGeometry,
               "traffic_beyond": TrafficBeyond, "traffic_kind": KindTraffic, "served_batch": ServedBatch,
               "backend_count": BackendCount, "gpu_prediction": GpuPrediction, "memory_slopes": MemorySlopes,
               "memory_beyond": MemoryBeyond, "memory_kind": KindMemory, "amortised_traffic": AmortisedTraffic}
# Sections a later release may add keys to: the schema leaves them open.
OPEN = ("kv", "settings", "environment", "identity", "model")


def as_text(value: Any) -> str:
    """JSON text with sorted keys: equal texts mean nothing was lost, not even an int turned float."""
    return json.dumps(value, sort_keys=True)


def unknown_below_the_top(record: KV) -> list[str]:
    """Keys that no record type knows, except whole sections beside the known ones (``kv.extra``)."""
    sections = {f"kv.{key}" for key in record.extra}
    return [path for path in record.unknown_keys("kv") if path not in sections]


@pytest.fixture(scope="module")
def written() -> dict[str, Any]:
    """A run with its ``kv`` section as the session-end analysis writes it."""
    return analysed(make_run(rounds=2, contexts=(512, 1024, 2048), steps=5), resamples=50)


def test_schema_1_run_round_trips_losslessly():
    kv = schema_1(make_run())["kv"]
    assert kv["schema"] == 1
    back = KV.from_json(kv).to_json()
    assert as_text(back) == as_text(upgrade_kv(kv))
    # keys a schema 1 file never had stay absent: none is made up on the way through
    assert "cache" not in back["fit"]["dynamic"]
    assert "points" not in back


def test_analysed_run_round_trips_losslessly(written):
    assert as_text(KV.from_json(written["kv"]).to_json()) == as_text(written["kv"])


def test_the_records_know_every_key_the_analysis_writes(written):
    assert unknown_below_the_top(KV.from_json(written["kv"])) == []


def test_analysis_builds_typed_parts(written):
    record = KV.from_json(written["kv"])
    assert isinstance(record.fit["dynamic"], Fit) and record.fit["dynamic"].passes == pytest.approx(3.0, rel=0.1)
    assert isinstance(record.traffic["static"], Traffic) and isinstance(record.probe["static"], Probe)
    assert isinstance(record.verdict["dynamic"]["counted"], Verdict)
    assert record.verdict["dynamic"]["counted"].status == "no-baseline"
    assert isinstance(record.copy, Copy) and isinstance(record.copy.measurements[0], CopyMeasurement)
    assert isinstance(record.session, Session) and record.session.exit == "ok"
    assert {(p.cache, p.context) for p in record.points} == {(c, n) for c in ("dynamic", "static")
                                                             for n in (512, 1024, 2048)}
    point = record.points[0]
    assert point.median_s * 1e3 == pytest.approx(point.median_ms) and point.samples_ms == written["kv"]["points"][0][
        "samples_ms"]
    assert isinstance(record.drift, UnmeasuredDrift) and "not measured again" in record.drift.reason


# The counted parts only some runs have (sliding windows, --kv-batch, SDPA backends, --kv-gpus, CUDA), as the
# measuring wing writes them.
WINDOWED = {"contexts": [8192, 12288], "step_bytes": {"8192": 9_000_000, "12288": 9_000_000},
            "kv_bytes": {"8192": 4_194_304.0, "12288": 4_194_304.0}}
SLIDING = {"layers": 2, "window": 4096, "passes": 1.02, "by_op": {"cat": 1.0}, "grows": True, "growth_bytes": 65536,
           "stops_growing_at": 4096, "step_bytes": {"1024": 1_000_000, "2048": 1_065_536},
           "kv_bytes": {"1024": 65536.0, "2048": 131072.0}, "beyond": {**WINDOWED, "growth_bytes": 0}}
LINEAR = {"layers": 1, "window": None, "passes": None, "by_op": {}, "grows": False, "growth_bytes": 0,
          "stops_growing_at": 0, "step_bytes": {"1024": 4096, "2048": 4096}, "kv_bytes": {"1024": 0.0, "2048": 0.0}}
TRAFFIC_PARTS = {
    "beyond": WINDOWED, "kinds": {"sliding": SLIDING, "linear": LINEAR},
    "allocated_bytes": {"1024": 131072.0, "2048": 262144.0}, "allocated_passes": 2.5,
    "batch": {"size": 3, "ragged": True},
    "backends": {"math": {"passes": 25.3, "by_op": {"bmm": 20.0}},
                 "flash": {"passes": None, "by_op": {}, "error": "flash takes no mask"}},
    "gpus": {"t4": {"backend": "math", "rejected": {"flash": "needs sm80"}, "passes": 25.3, "by_op": {"bmm": 20.0}},
             "a100": {"backend": "mixed", "rejected": {}, "passes": 3.1, "by_op": {"cat": 2.0},
                      "by_call": {"flash": 2, "math": 1}},
             "cpu": {"backend": None, "rejected": {}, "passes": None, "by_op": {}, "error": "not predicted: x"}},
}
MEMORY_PARTS = {
    "allocator": {"allocated_passes": 1.1, "peak_passes": 0.1, "held_passes": 1.0, "peak_factor": 1.2},
    "per_allocated": {"allocated_passes": 0.5, "peak_passes": 0.01, "held_passes": 0.9},
    "beyond": {"contexts": [8192, 12288], "held": {"8192": 5_000_000, "12288": 5_000_000}, "held_growth_bytes": 0,
               "kv_bytes": {"8192": 4_194_304.0, "12288": 4_194_304.0}},
    "kinds": {"sliding": {"layers": 2, "allocated_passes": 1.0, "held_passes": 1.0, "allocated_growth_bytes": 65536,
                          "held_growth_bytes": 65536},
              "linear": {"layers": 1, "allocated_passes": None, "held_passes": None, "allocated_growth_bytes": 0,
                         "held_growth_bytes": 0}},
}


def with_counted_parts(kv: dict[str, Any]) -> dict[str, Any]:
    kv = copy.deepcopy(kv)
    kv["traffic"]["dynamic"].update(copy.deepcopy(TRAFFIC_PARTS))
    kv["memory"]["dynamic"].update(copy.deepcopy(MEMORY_PARTS))
    return kv


def test_every_counted_part_is_a_record_and_round_trips():
    """Windows, batches, SDPA backends, GPU classes, the allocator: each a record, read and written back as it was
    (key order included), known to the schema."""
    kv = with_counted_parts(make_run(memory=True)["kv"])
    record = KV.from_json(kv)
    traffic, memory = record.traffic["dynamic"], record.memory["dynamic"]
    assert isinstance(traffic.beyond, TrafficBeyond) and traffic.beyond.contexts == [8192, 12288]
    sliding, linear = traffic.kinds["sliding"], traffic.kinds["linear"]
    assert isinstance(sliding, KindTraffic) and isinstance(sliding.beyond, TrafficBeyond)
    assert sliding.beyond.growth_bytes == 0 and linear.grows is False and linear.passes is None
    assert traffic.batch == ServedBatch(size=3, ragged=True)
    assert isinstance(traffic.backends["math"], BackendCount) and traffic.backends["flash"].error
    assert all(isinstance(g, GpuPrediction) for g in traffic.gpus.values())
    assert traffic.gpus["a100"].by_call == {"flash": 2, "math": 1} and traffic.gpus["cpu"].backend is None
    counted = traffic.gpu_counted()
    assert counted["t4"].passes == 25.3 and counted["cpu"].why_missing == "not predicted: x"
    assert isinstance(memory.allocator, MemorySlopes) and memory.allocator.peak_factor == 1.2
    assert isinstance(memory.per_allocated, MemorySlopes) and memory.per_allocated.peak_factor is None
    assert isinstance(memory.beyond, MemoryBeyond) and memory.beyond.held_growth_bytes == 0
    assert isinstance(memory.kinds["linear"], KindMemory) and memory.kinds["linear"].held_passes is None
    back = record.to_json()
    assert as_text(back) == as_text(kv)
    for section, parts in (("traffic", TRAFFIC_PARTS), ("memory", MEMORY_PARTS)):  # the same keys in the same order
        assert [json.dumps(back[section]["dynamic"][key]) for key in parts] == [json.dumps(v) for v in parts.values()]
    assert "peak_factor" not in back["memory"]["dynamic"]["per_allocated"]  # absent stays absent
    assert unknown_below_the_top(record) == []
    for older in (schema_2, schema_1):  # the same parts in a file of an older schema: the same records
        upgraded = KV.from_json(older({"kv": kv})["kv"]).to_json()
        assert as_text([upgraded["traffic"], upgraded["memory"]]) == as_text([back["traffic"], back["memory"]])


def test_the_schema_validates_every_counted_part():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema())
    run = analysed(make_run(memory=True), resamples=50)
    validator.validate({**run, "kv": with_counted_parts(run["kv"])})
    broken = with_counted_parts(run["kv"])
    broken["memory"]["dynamic"]["beyond"]["surprise"] = 1
    assert not validator.is_valid({**run, "kv": broken})

def test_fit_failure_drift_and_skip_records_are_chosen_by_their_keys():
    kv = make_run()["kv"]
    kv["fit"]["dynamic"] = {"error": "needs at least 3 distinct contexts, got 2", "n_points": 2}
    kv["skipped"] = [{"cache": "offloaded", "context": None, "reason": "needs a GPU"}]
    record = KV.from_json(kv)
    assert isinstance(record.fit["dynamic"], FitFailure) and record.fit["dynamic"].n_points == 2
    assert isinstance(record.fit["static"], Fit)
    assert isinstance(record.drift, Drift) and record.drift.ok is True
    assert record.skipped == [Skip(cache="offloaded", context=None, reason="needs a GPU")]
    kv["drift"] = {"reason": "only one round"}
    assert isinstance(KV.from_json(kv).drift, UnmeasuredDrift)


def test_unknown_keys_survive_a_round_trip(written):
    kv = copy.deepcopy(written["kv"])
    kv["later_section"] = {"dynamic": {"tokens": 1791}}  # a section a later issue adds
    kv["fit"]["dynamic"]["new_figure"] = 1.5
    kv["verdict"]["dynamic"]["compiled"] = {"status": "pass", "reason": "", "value": 1.0, "allowed": 2.0,
                                            "margin": 0.5}
    kv["points"][0]["device_time_ms"] = [1.0, 2.0]
    record = KV.from_json(kv)
    assert record.extra == {"later_section": {"dynamic": {"tokens": 1791}}}
    assert record.fit["dynamic"].extra == {"new_figure": 1.5}
    assert record.verdict["dynamic"]["compiled"].extra == {"margin": 0.5}
    assert sorted(record.unknown_keys("kv")) == ["kv.fit.dynamic.new_figure", "kv.later_section",
                                                 "kv.points[0].device_time_ms", "kv.verdict.dynamic.compiled.margin"]
    assert as_text(record.to_json()) == as_text(kv)


def test_a_field_set_after_reading_is_written_even_where_the_key_was_absent():
    record = KV.from_json(make_run()["kv"])
    record.fit["dynamic"].cache = "dynamic"
    assert record.to_json()["fit"]["dynamic"]["cache"] == "dynamic"


def test_schema_version_is_carried():
    assert KV().to_json()["schema"] == SCHEMA
    upgraded = KV.from_json(schema_2(make_run())["kv"])  # schema 2 in, this schema out
    assert upgraded.schema == SCHEMA and upgraded.to_json()["schema"] == SCHEMA
    assert json_schema()["$defs"]["kv"]["properties"]["schema"] == {"const": SCHEMA}
    for schema in (SCHEMA + 1, None, "2"):
        with pytest.raises(RecordError, match=f"kv: schema {schema!r} is not one of the supported 1, 2, 3"):
            KV.from_json({**make_run()["kv"], "schema": schema})


def test_non_finite_numbers_are_written_as_null():
    record = KV(copy_gbps=float("nan"), fit={"dynamic": Fit(passes=3.0, r2=float("inf"))})
    out = record.to_json()
    assert out["copy_gbps"] is None and out["fit"]["dynamic"]["r2"] is None
    json.dumps(out, allow_nan=False)


@pytest.mark.parametrize(("part", "value", "where"), [
    ("fit", {"dynamic": [3.0]}, "kv.fit.dynamic: expected an object, got list"),
    ("verdict", {"dynamic": {"timed": {"reason": "no status"}}}, "kv.verdict.dynamic.timed: no 'status'"),
    ("points", {"cache": "dynamic"}, "kv.points: expected a list, got dict"),
    ("points", [{"cache": "dynamic", "context": 512}], "kv.points[0]: no 'kv_bytes'"),
    ("traffic", {"dynamic": {"by_op": {}}}, "kv.traffic.dynamic: no 'passes'"),
])
def test_a_malformed_part_is_a_one_line_error_naming_it(tmp_path, part, value, where):
    run = analysed(make_run(contexts=(512, 1024, 2048), steps=3), resamples=20)
    run["kv"][part] = value
    with pytest.raises(RecordError) as raised:
        KV.from_json(run["kv"])
    assert str(raised.value) == where
    path = write_run(tmp_path / "bad.json", run)
    with pytest.raises(RecordError, match=f"^{re.escape(f'{path}: {where}')}$"):
        load_run(path)


def test_load_run_gives_the_records_that_write_the_section_back(tmp_path, written):
    run = load_run(write_run(tmp_path / "run.json", written))
    assert isinstance(run.record, KV) and run.record.to_json() == written["kv"]
    assert run.points == run.record.points and all(isinstance(p, Point) for p in run.points)


def test_a_file_of_an_older_schema_loads_as_the_same_records(tmp_path):
    """The upgrade, once: one run as the plugin of each schema wrote it loads as the records of this schema. Schema 2
    said a new or renamed ledger op in the part's key (``"clone (new)"``, ``"concat (was cat)"``), schema 3 keys the
    part by the op and says it in ``new`` / ``was``: the same records. Schema 1 (one combined verdict a class; no
    identity, session, points or crossovers) gives what it holds: every other section the same, the identity made
    from its environment and settings, each class's counted and timed verdict."""
    run = make_run(points=True)
    part = {"value": 2.4, "allowed": 0.5, "interval": [1.9, 2.9], "status": "regression"}
    run["kv"]["verdict"]["dynamic"]["ledger"] = {
        "status": "regression", "reason": "clone (new): timed passes 2.4", "value": None, "allowed": None,
        "parts": {"clone": {**part, "new": True}, "concat": {**part, "status": "pass", "was": "cat"},
                  "scaled_dot_product_attention": {**part, "status": "pass"}}}
    current = load_run(write_run(tmp_path / "schema-3.json", run)).record
    assert current.schema == SCHEMA and as_text(current.to_json()) == as_text(run["kv"])

    labelled = schema_2(run)
    assert list(labelled["kv"]["verdict"]["dynamic"]["ledger"]["parts"]) == [
        "clone (new)", "concat (was cat)", "scaled_dot_product_attention"]
    upgraded = load_run(write_run(tmp_path / "schema-2.json", labelled)).record
    assert upgraded.schema == SCHEMA and as_text(upgraded.to_json()) == as_text(current.to_json())
    parts = upgraded.verdict["dynamic"]["ledger"].parts
    assert parts["clone"].new and parts["clone"].was is None and parts["concat"].was == "cat"
    assert upgrade_kv(current.to_json())["verdict"] == current.to_json()["verdict"]  # this schema: unchanged

    oldest = load_run(write_run(tmp_path / "schema-1.json", schema_1(run))).record.to_json()
    newest = current.to_json()
    assert oldest["schema"] == SCHEMA
    for key in set(newest) - {"verdict", "session", "points", "crossovers"}:
        assert as_text(oldest.get(key)) == as_text(newest[key]), key
    assert oldest["session"]["exit"] == "unknown (schema 1)" and "points" not in oldest
    for cache, measures in newest["verdict"].items():
        for measure in ("counted", "timed"):
            assert ({k: oldest["verdict"][cache][measure][k] for k in ("status", "value", "allowed")}
                    == {k: measures[measure][k] for k in ("status", "value", "allowed")}), (cache, measure)


def test_the_schema_describes_the_records():
    defs = json_schema()["$defs"]
    for name, record in DEFINITIONS.items():
        known = [f.name for f in dataclasses.fields(record) if f.name not in ("extra", "absent")]
        if record is Point:  # its steps are written in ms (and their median); ``kind`` is never in kv.points
            known = [*(k for k in known if k not in ("samples_s", "kind")), "median_ms", "samples_ms"]
        assert sorted(defs[name]["properties"]) == sorted(known), name
    assert defs["verdict"]["properties"]["status"]["enum"] == list(judges.STATUSES)
    assert all(defs[name].get("additionalProperties", True) is True for name in OPEN)  # later sections and keys
    kinds = defs["model"]["properties"]["kinds"]["additionalProperties"]["properties"]
    assert sorted(kinds) == sorted(f.name for f in dataclasses.fields(LayerKinds) if f.name not in ("extra", "absent"))
    assert sorted(defs["crossovers"]["properties"]) == ["cache_holds_weights_tokens"]  # then one entry per class
    closed = [name for name in DEFINITIONS if name not in OPEN]
    assert all(defs[name]["additionalProperties"] is False for name in closed)


def test_the_schema_validates_an_analysed_run_and_rejects_a_broken_one(written):
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema())
    validator.check_schema(validator.schema)
    validator.validate(written)
    later = copy.deepcopy(written)
    later["kv"]["later_section"] = {"dynamic": 1791}  # a later section is allowed beside the known ones
    validator.validate(later)
    broken = copy.deepcopy(written)
    broken["kv"]["verdict"]["dynamic"]["timed"]["status"] = "maybe"
    with pytest.raises(jsonschema.ValidationError, match="'maybe' is not one of"):
        validator.validate(broken)
    for part, change in (("schema", 1), ("fit", {"dynamic": {"passes": "3"}}), ("points", [{"cache": "x"}])):
        wrong = copy.deepcopy(written)
        wrong["kv"][part] = change
        assert not validator.is_valid(wrong), part


@pytest.mark.parametrize("key", ["fit", "traffic", "memory", "verdict", "skipped", "ledger", "settings"])
def test_a_null_object_or_list_reads_as_empty_not_as_a_crash_later(written, key):
    kv = copy.deepcopy(written["kv"])
    kv[key] = None
    record = KV.from_json(kv)
    assert getattr(record, key) == getattr(KV(), key) and key not in record.to_json()  # empty, not written as null
    assert isinstance(record.caches(), list)


def test_a_wrong_container_is_a_one_line_record_error(written):
    kv = copy.deepcopy(written["kv"])
    kv["traffic"]["dynamic"]["by_op"] = ["cat", 2.0]
    with pytest.raises(RecordError, match=r"by_op: expected an object, got list"):
        KV.from_json(kv)


@pytest.mark.parametrize("where", ["traffic.dynamic.passes", "fit.static.passes_ci[1]", "traffic.dynamic.ops_per_step"])
def test_an_integer_too_large_for_a_number_is_refused_where_the_run_is_read(tmp_path, where):
    """Issue 49 item 7: 10**400 (JSON allows it) crashed six commands with OverflowError; the run is refused in one
    line naming the key, and a figure that overflows is no number to the rest (``finite``)."""
    from kvcache.analysing.estimates import finite
    from kvcache.analysing.records import RecordError, load_run

    doc = make_run()
    parent, _, leaf = where.rpartition(".")
    node = doc["kv"]
    for key in parent.split("."):
        node = node[key]
    if leaf.endswith("]"):
        node[leaf.split("[")[0]][1] = 10**400
    else:
        node[leaf] = 10**400
    path = write_run(tmp_path / "huge.json", doc)
    with pytest.raises(RecordError) as raised:
        load_run(path)
    assert str(raised.value) == (f"{path}: kv.{where} is an integer of about 401 digits, too large for a number "
                                 "(the largest is about 1.8e308)")
    assert finite(10**400) is None and finite(-(10**400)) is None and finite(10**300) == 1e300
