"""What a measuring process reports, as records (the measuring wing builds them; :mod:`kvcache.analysing.analysis`
reads them): :class:`Context`, copy measurements, timed points, :class:`ClassCount`, skips, ledger points,
:class:`Failed`. They become JSON once, at the process boundary (:func:`to_wire`, :func:`from_wire`: what travels in a
pytest report from an xdist worker or a ``kvcache ab`` side). Stdlib only."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kvcache.analysing.records import Skip
from kvcache.analysing.records.context import Environment, ModelGeometry
from kvcache.analysing.records.counted import Memory, Probe, Traffic
from kvcache.analysing.records.jsonrecord import Reader, Record, RecordError, absent_field, as_object, extra_field
from kvcache.analysing.records.timed import CopyMeasurement, LedgerPoint, Point


@dataclass
class Context(Record):
    """A measuring process's ``model`` (``kv.model``: geometry, sizes in bytes) and ``environment``
    (``kv.environment``), reported before its first measurement."""

    model: ModelGeometry = field(default_factory=ModelGeometry)
    environment: Environment = field(default_factory=Environment)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"model": ModelGeometry.from_json, "environment": Environment.from_json}


@dataclass
class ClassCount(Record):
    """One class counted: its ``traffic`` (``kv.traffic.<cache>``), attention ``probe`` and counted ``memory``
    (None: not measured)."""

    cache: str
    traffic: Traffic
    probe: Probe | None = None
    memory: Memory | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"traffic": Traffic.from_json, "probe": Probe.from_json, "memory": Memory.from_json}


@dataclass
class Failed(Record):
    """A suite item that failed: its ``role`` (``point``, ``counted``, ``copy``...), its class (None for none), its
    node id and the first line of its error (``reason``, at most 300 characters)."""

    cache: str | None = None
    role: str | None = None
    nodeid: str | None = None
    reason: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


#: The record of each ``type`` on the wire.
TYPES: dict[str, type[Record]] = {"context": Context, "copy": CopyMeasurement, "point": Point, "traffic": ClassCount,
                                  "skip": Skip, "ledger": LedgerPoint, "failed": Failed}
NAMES = {kind: name for name, kind in TYPES.items()}


def to_wire(record: Record) -> str:
    """``record`` as it travels between processes: the JSON text of its object, with its ``type``."""
    return json.dumps({"type": NAMES[type(record)], **record.to_json()}, default=str)


def from_wire(text: str) -> Record:
    """The record of one text :func:`to_wire` wrote; RecordError (one line) for one of no known type."""
    data = as_object(json.loads(text), "measurement record")
    kind = TYPES.get(data.get("type"))
    if kind is None:
        raise RecordError(f"measurement record: unknown type {data.get('type')!r}")
    return kind.from_json({k: v for k, v in data.items() if k != "type"}, f"{data['type']} record")
