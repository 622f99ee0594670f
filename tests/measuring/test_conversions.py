"""One counted figure and one timed figure followed from their measurement to the ``--benchmark-json`` file, every
change of form counted: a figure is a record from the moment it is measured, and becomes JSON only at the process
boundary (:func:`kvcache.analysing.records.measured.to_wire` on the measuring side, ``from_wire`` on the controller, one
JSON text each way) and at the file (``KV.to_json``, then one text written).

The run is the real suite on ``tiny`` (one class, three contexts, one round) in a subprocess whose record machinery
is wrapped: ``Traffic`` and ``Point``'s ``to_json``/``from_json``, the transport's ``json.dumps``/``json.loads``, and
the file writer; each call is logged with the edge it ran inside (None: inside none)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kvrun import describe, run_python

pytest.importorskip("transformers")

MARK = "@@conversions@@"
FOLLOWED = ("dynamic", 256, 0)  # the timed figure followed: this point's steps

DRIVER = """
import json, sys
import pytest
from kvcache.analysing.records import measured
from kvcache.analysing import records
from kvcache.analysing.records.context import RunSettings
from kvcache.analysing.records.counted import Traffic
from kvcache.analysing.records.timed import Point
from kvcache.measuring.session import KVSession
from kvcache.plugin import finish

edge = [None]  # the edge running now
log = []  # [what, figure, edge]
measured_figures = {}

def at_edge(name, fn):
    def wrapped(*args, **kwargs):
        outer, edge[0] = edge[0], name
        try:
            return fn(*args, **kwargs)
        finally:
            edge[0] = outer
    return wrapped

def figure(record_or_data):
    get = record_or_data.get if isinstance(record_or_data, dict) else lambda k: getattr(record_or_data, k, None)
    return [get("cache"), get("context"), get("round"), get("kind") or "timed"]

def spy(cls):
    to_json, from_json = cls.to_json, cls.from_json
    def logged_to_json(self):
        log.append(["to_json", cls.__name__, figure(self), edge[0]])
        return to_json(self)
    def logged_from_json(klass, data, where=""):
        log.append(["from_json", cls.__name__, figure(data), edge[0]])
        return from_json(data, where)
    cls.to_json, cls.from_json = logged_to_json, classmethod(logged_from_json)

spy(Traffic)
spy(Point)
spy(RunSettings)

class Json:  # the transport's json module, its texts counted
    def dumps(self, *args, **kwargs):
        log.append(["json.dumps", None, None, edge[0]])
        return json.dumps(*args, **kwargs)
    def loads(self, *args, **kwargs):
        log.append(["json.loads", None, None, edge[0]])
        return json.loads(*args, **kwargs)
measured.json = Json()
measured.to_wire = at_edge("process boundary", measured.to_wire)  # the transport imports them when it sends
measured.from_wire = at_edge("process boundary", measured.from_wire)
records.KV.to_json = at_edge("file", records.KV.to_json)
write_json = finish._write_json
def logged_write_json(state, path, text):
    log.append(["file text", None, None, "file"])
    return write_json(state, path, text)
finish._write_json = logged_write_json

emit = KVSession.emit
def measured_emit(self, record):
    if isinstance(record, measured.ClassCount):
        measured_figures["passes"] = record.traffic.passes
    if isinstance(record, Point) and (record.cache, record.context, record.round, record.kind) == \\
            ("dynamic", 256, 0, "timed"):
        measured_figures["samples_s"] = list(record.samples_s)
    return emit(self, record)
KVSession.emit = measured_emit

code = int(pytest.main(["benchmarks", "-p", "no:cacheprovider", "-q", *sys.argv[1:]]))
sys.__stdout__.write("\\n" + "@@conversions@@" + json.dumps({"code": code, "log": log, "measured": measured_figures}))
"""


@pytest.fixture(scope="module")
def followed(tmp_path_factory):
    """(the run's result: exit code, conversion log, figures as measured; the run file written)."""
    tmp = tmp_path_factory.mktemp("conversions")
    path = tmp / "run.json"
    args = ["--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-contexts", "256,512,1024", "--kv-steps", "3",
            "--kv-warmup", "0", "--kv-rounds", "1", "--kv-copy-mib", "8", "--kv-no-gate",
            "--kv-baseline", "none", "--benchmark-json", str(path)]
    done = run_python("import sys; sys.argv[1:] = " + json.dumps(args) + "\n" + DRIVER)
    assert MARK in done.stdout, describe(done)
    result = json.loads(done.stdout.rsplit(MARK, 1)[1])
    assert result["code"] == 0, describe(done)
    return result, json.loads(Path(path).read_text())


def conversions(log: list, what: str, kind: str, wanted: list | None = None) -> list:
    """The edges of every ``what`` (``to_json``, ``from_json``) of a ``kind`` record, of one figure when given."""
    return [edge for name, record, figure, edge in log
            if name == what and record == kind and (wanted is None or figure[:len(wanted)] == wanted)]


def test_every_conversion_happens_at_the_process_boundary_or_at_the_file(followed):
    (result, _) = followed
    log = result["log"]
    assert log, "nothing was logged: the spies were not reached"
    assert [entry for entry in log if entry[3] is None] == []


def test_the_counted_figure_changes_form_once_each_way_between_processes_and_once_into_the_file(followed):
    result, run = followed
    log = result["log"]
    assert conversions(log, "to_json", "Traffic") == ["process boundary", "file"]
    assert conversions(log, "from_json", "Traffic") == ["process boundary"]
    assert run["kv"]["traffic"]["dynamic"]["passes"] == result["measured"]["passes"]  # the figure as measured


def test_the_timed_figure_keeps_its_steps_from_measurement_to_file(followed):
    result, run = followed
    log = result["log"]
    cache, context, round_ = FOLLOWED
    wanted = [cache, context, round_, "timed"]
    assert conversions(log, "to_json", "Point", wanted) == ["process boundary", "file"]
    assert conversions(log, "from_json", "Point", wanted) == ["process boundary"]
    measured = result["measured"]["samples_s"]
    point = next(p for p in run["kv"]["points"] if (p["cache"], p["context"], p["round"]) == FOLLOWED)
    assert point["samples_ms"] == pytest.approx([s * 1e3 for s in measured], rel=1e-15)
    # the drift point (the first one measured again) crosses the boundary and never reaches kv.points
    drift = [entry for entry in log if entry[1] == "Point" and entry[2][3] == "drift"]
    assert [(name, edge) for name, _, _, edge in drift] == [("to_json", "process boundary"),
                                                           ("from_json", "process boundary")]


def test_the_settings_are_a_record_from_the_options_to_the_file(followed):
    """The session's settings reach the analysis as a ``RunSettings`` (``identity.recorded_settings``), never read
    from a dict made of them: written once, into the file."""
    result, run = followed
    log = result["log"]
    assert conversions(log, "to_json", "RunSettings") == ["file"]
    assert conversions(log, "from_json", "RunSettings") == []
    assert run["kv"]["settings"]["caches"] == ["dynamic"] and run["kv"]["settings"]["contexts"] == [256, 512, 1024]


def ab_side(slope_s_per_byte: float, seed: int) -> Any:
    """One side of an A/B pair: three contexts, three rounds of timed steps on a line (no torch)."""
    import numpy as np

    from kvcache.analysing.records import KV, SCHEMA

    rng = np.random.default_rng(seed)

    def samples(c: int) -> list[float]:
        return [x * 1e3 for x in (2e-3 + slope_s_per_byte * c * 1000) * (1 + 0.01 * rng.standard_normal(10))]

    points = [{"cache": "dynamic", "context": c, "round": r, "kv_bytes": c * 1000.0, "samples_ms": samples(c)}
              for r in range(3) for c in (1024, 4096, 16384)]
    return KV.from_json({"schema": SCHEMA, "points": points,
                         "settings": {"max_drift": 0.10, "resamples": 200, "confidence": 0.95, "seed": 0}})


def test_a_paired_verdict_is_a_record_until_the_ab_file_is_written(monkeypatch):
    """``kvcache ab``'s verdicts: judged as records, summarised, listed as regressions and looked at for more rounds
    as records, written to JSON once, into the ``--json`` document, and never read back."""
    from kvcache.ab import extend
    from kvcache.ab.results import ABResult, ab_summary
    from kvcache.analysing.judge import paired as ab
    from kvcache.analysing.records.ab_document import ABRunSection, PairedVerdict

    log: list[str] = []
    to_json, from_json = PairedVerdict.to_json, PairedVerdict.from_json.__func__
    monkeypatch.setattr(PairedVerdict, "to_json", lambda self: log.append("to_json") or to_json(self))
    monkeypatch.setattr(PairedVerdict, "from_json",
                        classmethod(lambda cls, data, where="": log.append("from_json") or from_json(cls, data, where)))
    a, b = ab_side(1e-9, 1), ab_side(1.6e-9, 2)
    verdicts = ab.judge(a, b, resamples=200)
    result = ABResult(a, b, verdicts, ABRunSection.of(items=1, pairs=[], notes=[], sides={}), "now")
    assert verdicts["dynamic"]["timed"].status == "regression"
    assert ab.regressions(verdicts) and extend.triggers(verdicts) == [] and extend.inconclusive(verdicts) == []
    assert any("regression" in line for line in ab_summary(result))
    assert log == []  # no verdict became JSON, nor was read from it, before the file
    doc = result.to_json()
    assert log == ["to_json"] * sum(len(measures) for measures in verdicts.values())
    assert doc["ab"]["dynamic"]["timed"]["status"] == "regression"


def test_json_texts_are_one_per_record_each_way_and_one_file(followed):
    result, run = followed
    log = result["log"]
    dumps = [edge for name, _, _, edge in log if name == "json.dumps"]
    loads = [edge for name, _, _, edge in log if name == "json.loads"]
    assert dumps and set(dumps) == set(loads) == {"process boundary"} and len(dumps) == len(loads)
    assert [edge for name, _, _, edge in log if name == "file text"] == ["file"]
    timed = [b for b in run["benchmarks"] if b["extra_info"].get("kind") == "timed"]
    assert list(timed[0]["extra_info"]) == [  # the benchmarks[] entry keeps its shape
        "kind", "cache", "context", "round", "kv_bytes", "bytes_per_token", "driver", "batch", "ragged", "device",
        "device_name", "dtype", "model", "fill", "warmup", "steps", "transformers", "torch",
        "beyond_trained_context", "step_start_ns", "counted_bytes", "achieved_gbps"]
