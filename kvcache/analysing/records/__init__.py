"""A run file as records: :class:`Run` (one ``--benchmark-json`` file) holds :class:`KV`, its ``kv`` section, read
once when the file is loaded (:func:`load_run`, :func:`load_runs`), files of older schemas upgraded on the way in
(:func:`upgrade_kv`). The section's layout, every part with its unit, is in docs/records.md; ``kv.schema.json``
beside this module is its JSON Schema (draft 2020-12). The record machinery is
:mod:`kvcache.analysing.records.jsonrecord`,
the records of the measured parts :mod:`kvcache.analysing.records.counted` and
:mod:`kvcache.analysing.records.timed`; all are importable from here.

Analysing wing: never imports torch, so runs can be compared and reported on a machine that has no torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kvcache.analysing.records import identity
from kvcache.analysing.records.context import Environment, LayerKinds, ModelGeometry, RunSettings
from kvcache.analysing.records.counted import (
    AmortisedTraffic,
    BackendCount,
    CompiledTraffic,
    Counted,
    DraftTraffic,
    FusedCount,
    GpuPrediction,
    KindMemory,
    KindTraffic,
    Memory,
    MemoryBeyond,
    MemorySlopes,
    MemoryStep,
    PhaseTraffic,
    PrefillTraffic,
    Probe,
    ServedBatch,
    Traffic,
    TrafficBeyond,
)
from kvcache.analysing.records.identity import Identity
from kvcache.analysing.records.jsonrecord import (
    Reader,
    Record,
    RecordError,
    absent_field,
    as_object,
    extra_field,
    jsonable,
    list_of,
    object_of,
    too_large_number,
)
from kvcache.analysing.records.timed import (
    CacheCrossovers,
    Copy,
    CopyMeasurement,
    Crossovers,
    Drift,
    Fit,
    FitFailure,
    LedgerPoint,
    LedgerRow,
    Point,
    PointCompile,
    Speed,
    UnmeasuredDrift,
    drift_of,
    fit_of,
)

__all__ = [
    "KV", "READABLE_SCHEMAS", "SCHEMA", "SCHEMA_FILE", "CacheCrossovers", "CompiledTraffic", "Copy", "CopyMeasurement",
    "Counted", "Environment", "FusedCount", "Identity", "LayerKinds", "MemoryStep", "ModelGeometry", "PointCompile",
    "RunSettings", "BackendCount", "GpuPrediction", "KindMemory", "KindTraffic", "MemoryBeyond", "MemorySlopes",
    "ServedBatch", "TrafficBeyond", "PhaseTraffic", "PrefillTraffic", "AmortisedTraffic", "DraftTraffic",
    "Crossovers", "Drift", "Fit", "FitFailure", "LedgerPoint", "LedgerRow", "Memory", "Part", "Point",
    "Probe", "Record", "RecordError", "Run", "Session", "Skip", "Speed", "Traffic", "UnmeasuredDrift", "Verdict",
    "json_schema", "jsonable", "load_run", "load_runs", "point_from_benchmark", "points_from_benchmarks",
    "run_of_doc", "upgrade_kv",
]

#: Schema 3: a ledger verdict's parts are keyed by op, a new op or a renamed one said by the fields ``new`` and
#: ``was`` (schema 2 said it in the key: ``"op (new)"``, ``"op (was old)"``).
SCHEMA = 3
READABLE_SCHEMAS = (1, 2, 3)
SCHEMA_FILE = "kv.schema.json"


@dataclass
class Part(Record):
    """One figure of a verdict (``kv.verdict.<cache>.<measure>.parts.<name>``): overhead's ``ops_per_step`` and
    ``weight_passes``, memory's ``allocated_passes``, ``peak_passes``, ``held_passes``, the ledger's ops. Its
    status, ``value`` against ``allowed`` (the measure's unit), and for a ledger op its ``interval``, ``reason``
    (when inconclusive), ``new`` (an op the baseline lacks, judged against 0) or ``was`` (the baseline op it
    replaced: same counted passes under another name)."""

    status: str
    value: float | None = None
    allowed: float | None = None
    interval: list[float | None] | None = None
    reason: str | None = None
    new: bool = False
    was: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = field(default=frozenset({"interval", "reason", "new", "was"}), repr=False,
                                   compare=False)  # left out when not set


@dataclass
class Verdict(Record):
    """``kv.verdict.<cache>.<measure>``: the judge's status (see :data:`kvcache.analysing.judge.judges.STATUSES`) of the
    measured ``value`` against the ``allowed`` one (passes; ``intercept``: ms; ``overhead``: ops per step; ``memory``:
    held passes); ``interval`` (timed, intercept) its interval, ``grew`` (counted; memory: the ops that allocate more)
    {op: rise in passes}, ``parts`` (overhead, memory, ledger) each figure's :class:`Part`."""

    status: str
    reason: str = ""
    value: float | None = None
    allowed: float | None = None
    interval: list[float | None] | None = None
    grew: dict[str, float] | None = None
    parts: dict[str, Part] | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = field(default=frozenset({"interval", "grew", "parts"}), repr=False,
                                   compare=False)  # left out when not set

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"parts": object_of(Part.from_json)}


@dataclass
class Session(Record):
    """``kv.session``: whether the session ran to its end (``exit``: pytest's exit status by name; None when
    unknown), the classes with a failed point and why each failed (``reasons``: {cache: one line}, when known)."""

    interrupted: bool | None = None
    exit: str = ""
    failed: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class Skip(Record):
    """One entry of ``kv.skipped``: a class (``context`` None) or one point of it that did not run, and why."""

    cache: str
    reason: str
    context: int | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class KV(Record):
    """The ``kv`` section of a run (docs/records.md), schema :data:`SCHEMA`.

    ``from_json`` reads a section of any readable schema (older ones through :func:`upgrade_kv`); ``to_json``
    writes this schema, non-finite floats as null. Sections a later schema adds stay in ``extra``."""

    schema: int = SCHEMA
    settings: RunSettings = field(default_factory=RunSettings)
    environment: Environment = field(default_factory=Environment)
    model: ModelGeometry = field(default_factory=ModelGeometry)
    copy_gbps: float | None = None
    copy: Copy | None = None
    fit: dict[str, Fit | FitFailure] = field(default_factory=dict)
    drift: Drift | UnmeasuredDrift | None = None
    traffic: dict[str, Traffic] = field(default_factory=dict)
    probe: dict[str, Probe] = field(default_factory=dict)
    memory: dict[str, Memory] = field(default_factory=dict)
    verdict: dict[str, dict[str, Verdict]] = field(default_factory=dict)
    skipped: list[Skip] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    session: Session | None = None
    identity: Identity = field(default_factory=Identity)
    ledger: dict[str, dict[str, LedgerRow]] = field(default_factory=dict)
    ledger_points: list[LedgerPoint] = field(default_factory=list)
    ledger_errors: dict[str, str] = field(default_factory=dict)
    speed: Speed | None = None
    crossovers: Crossovers | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def from_json(cls, data: Any, where: str = "kv") -> KV:
        """The records of a ``kv`` section; RecordError (one line naming the part) for an unreadable schema or
        a part that is not what its record needs."""
        data = as_object(data, where)
        if data.get("schema") not in READABLE_SCHEMAS:
            raise RecordError(f"{where}: schema {data.get('schema')!r} is not one of the supported "
                              f"{', '.join(map(str, READABLE_SCHEMAS))}")
        return super().from_json(upgrade_kv(data), where)

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"fit": object_of(fit_of), "traffic": object_of(Traffic.from_json), "probe": object_of(Probe.from_json),
                "memory": object_of(Memory.from_json), "verdict": object_of(object_of(Verdict.from_json)),
                "ledger": object_of(object_of(LedgerRow.from_json)), "points": list_of(Point.from_json),
                "skipped": list_of(Skip.from_json), "ledger_points": list_of(LedgerPoint.from_json),
                "copy": Copy.from_json, "session": Session.from_json, "drift": drift_of, "speed": Speed.from_json,
                "crossovers": Crossovers.from_json, "settings": RunSettings.from_json,
                "environment": Environment.from_json, "model": ModelGeometry.from_json, "identity": Identity.from_json}

    def to_json(self) -> dict[str, Any]:
        return jsonable(super().to_json())

    def caches(self) -> list[str]:
        """Cache classes of the section's fits, counted traffic, verdicts, probes and memory, in first-seen order."""
        return list(dict.fromkeys([*self.fit, *self.traffic, *self.verdict, *self.probe, *self.memory]))


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a run file with a ``kv`` section of this schema (package data)."""
    return json.loads(resources.files("kvcache.analysing.records").joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


@dataclass
class Run:
    """One benchmark JSON file: its timed points, its ``kv`` section as records (``record``, read once from the
    file) and where it came from."""

    path: str
    record: KV
    points: list[Point] = field(default_factory=list)
    machine_info: dict[str, Any] = field(default_factory=dict)
    datetime: str = ""

    @property
    def environment(self) -> Environment:
        return self.record.environment

    @property
    def transformers(self) -> str:
        return str(self.environment.transformers or "?")

    @property
    def device(self) -> str:
        env = self.environment
        return str(env.device_name or env.device_type or "?")

    @property
    def label(self) -> str:
        return f"transformers {self.transformers} on {self.device}"

    def caches(self) -> list[str]:
        """Cache classes that appear anywhere in the run, in first-seen order."""
        return list(dict.fromkeys([*(p.cache for p in self.points), *self.record.caches()]))


def point_from_benchmark(bench: dict[str, Any]) -> Point | None:
    """A Point from one entry of pytest-benchmark's ``benchmarks`` list, or None if it is not a timed point."""
    return Point.from_benchmark(bench)


def points_from_benchmarks(benchmarks: list[dict[str, Any]]) -> list[Point]:
    """Timed points of a ``benchmarks`` list, in run order (drift re-measurements excluded)."""
    return [point for point in map(point_from_benchmark, benchmarks) if point is not None]


def upgrade_kv(kv: dict[str, Any]) -> dict[str, Any]:
    """A ``kv`` section of an older schema in the shape of this one. Schema 1 -> 2: verdicts per measure (``value``
    for ``measured``), the run's identity, an unknown session state (schema 1 did not record it). Schema 2 -> 3: a
    ledger verdict's parts keyed by op, ``"op (new)"`` -> ``op`` with ``new: true``, ``"op (was old)"`` -> ``op``
    with ``was: "old"``."""
    if kv.get("schema") == SCHEMA:
        return kv
    if kv.get("schema") == 1:
        kv = _schema_2_of_1(kv)
    verdicts = kv.get("verdict")
    if isinstance(verdicts, dict):
        kv = {**kv, "verdict": {cache: _ledger_parts_keyed_by_op(measures) for cache, measures in verdicts.items()}}
    return {**kv, "schema": SCHEMA}


LABELLED = re.compile(r"(?P<op>.+) \((?:(?P<new>new)|was (?P<was>.+))\)")


def _ledger_parts_keyed_by_op(measures: Any) -> Any:
    ledger = measures.get("ledger") if isinstance(measures, dict) else None
    if not isinstance(ledger, dict) or not isinstance(ledger.get("parts"), dict):
        return measures
    parts = {}
    for label, part in ledger["parts"].items():
        found = LABELLED.fullmatch(label)
        if found is None or not isinstance(part, dict):
            parts[label] = part
        else:
            parts[found["op"]] = {**part, "new": True} if found["new"] else {**part, "was": found["was"]}
    return {**measures, "ledger": {**ledger, "parts": parts}}


def _schema_2_of_1(kv: dict[str, Any]) -> dict[str, Any]:
    verdicts: dict[str, dict[str, Any]] = {}
    combined_verdicts = kv.get("verdict")
    for cache, combined in (combined_verdicts.items() if isinstance(combined_verdicts, dict) else ()):
        verdicts[cache] = {}
        for measure in ("counted", "timed"):
            old = combined.get(measure) if isinstance(combined, dict) else None
            if not isinstance(old, dict):
                old = {}
            verdicts[cache][measure] = {"status": old.get("status", "not-measured"), "value": old.get("measured"),
                                        "allowed": old.get("allowed"), "reason": old.get("reason", ""),
                                        **({"interval": old["interval"]} if old.get("interval") else {})}
    if "identity" not in kv:
        env, settings = kv.get("environment"), kv.get("settings")
        env = Environment.from_json(env if isinstance(env, dict) else {}, "kv.environment")
        settings = RunSettings.from_json(settings if isinstance(settings, dict) else {}, "kv.settings")
        kv = {**kv, "identity": identity.of(env, settings).to_json()}
    return {**kv, "schema": 2, "verdict": verdicts,
            "session": kv.get("session", {"interrupted": None, "exit": "unknown (schema 1)", "failed": []})}


def load_run(path: str | Path) -> Run:
    """Read a ``--benchmark-json`` file; raise RecordError with a one-line message naming the file."""
    return run_of_doc(_read_json(Path(path)), Path(path))


def _read_json(p: Path) -> Any:
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecordError(f"{p}: cannot read ({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{p}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError:  # an integer beyond Python's limit of digits (4300)
        raise RecordError(f"{p}: not a run file kvcache reads (an integer of more than 4300 digits)") from None
    problem = too_large_number(doc)
    if problem:
        raise RecordError(f"{p}: {problem}")
    return doc


def run_of_doc(doc: Any, p: Path) -> Run:
    """A run from the parsed contents of a ``--benchmark-json`` file at ``p`` (see :func:`load_run`)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise RecordError(f"{p}: not a pytest-benchmark JSON file (no 'benchmarks' list)")
    kv = doc.get("kv")
    if not isinstance(kv, dict):
        raise RecordError(f"{p}: no 'kv' section; was it written by `pytest benchmarks --benchmark-json`?")
    record = KV.from_json(kv, f"{p}: kv")  # RecordError names the file and the part
    try:
        if any(point.samples_s is not None for point in record.points):
            points = list(record.points)
            for point in points:
                if point.samples_s is None:
                    raise RecordError(f"point {point.cache} at {point.context}: no samples_ms")
        else:
            points = points_from_benchmarks(doc["benchmarks"])
    except (RecordError, KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"{p}: malformed benchmark entry ({exc})") from None
    machine_info = doc.get("machine_info")
    return Run(path=str(p), points=points, record=record,
               machine_info=machine_info if isinstance(machine_info, dict) else {},
               datetime=str(doc.get("datetime", "")))


def load_runs(path: str | Path) -> list[Run]:
    """The runs of a file: one for a ``--benchmark-json`` file; two, side A then side B, for the output of
    ``kvcache ab --json`` (side A's run under ``side_a``, its path shown as ``PATH[A]``, side B's ``PATH[B]``)."""
    doc = _read_json(Path(path))
    run = run_of_doc(doc, Path(path))
    side_a = doc.get("side_a")
    if not isinstance(side_a, dict):
        return [run]
    first = run_of_doc(side_a, Path(f"{path}[A]"))
    run.path = f"{path}[B]"
    return [first, run]
