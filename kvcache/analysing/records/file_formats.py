"""The records of the files the commands keep besides a run file (docs/records.md, "Files"): the baseline
(:class:`BaselineFile`), a history store's line (:class:`HistoryEntry`), the sentinel's state
(:class:`SentinelState`) and a probe cache's file (:class:`ProbeEntry`); the A/B file's sections are
:mod:`kvcache.analysing.records.ab_document`'. Each is read by its ``from_json`` (after
:mod:`kvcache.analysing.records.jsonfile` has
checked the version) and written by ``to_json``: the reader is the only place that looks into the raw document.
Stdlib only."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcache.analysing.judge.entries import BaselineEntry
from kvcache.analysing.records import KV, jsonfile
from kvcache.analysing.records.jsonrecord import Reader, Record, RecordError, absent_field, extra_field, object_of

BASELINE_SCHEMA = 2
READABLE_BASELINE_SCHEMAS = (1, 2)
STORE_SCHEMA = 1
READABLE_STORE_SCHEMAS = (None, 1)  # None: a line written before entries carried their schema
STATE_FORMAT = 1
FULL_SHA = re.compile(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}")


@dataclass
class BaselineFile(Record):
    """The baseline file: ``{schema, devices: {identity key: {cache: entry}}}``
    (:mod:`kvcache.analysing.judge.baseline`,
    whose :func:`~kvcache.analysing.judge.baseline.load` checks every figure and upgrades schema 1 before this record
    reads it)."""

    schema: int = BASELINE_SCHEMA
    devices: dict[str, dict[str, BaselineEntry]] = field(default_factory=dict)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"devices": object_of(object_of(BaselineEntry.from_json))}


@dataclass
class HistoryEntry(Record):
    """One line of a history store (``kvcache history add``): the run's figures per class (``caches``: {cache:
    {measure: value}}), keyed by its ``commit`` or ``release`` and its ``identity``
    (:class:`kvcache.analysing.records.identity.Identity`'s JSON), with the run's ``setup`` line, Transformers release,
    ``datetime`` and file name (``run``)."""

    caches: dict[str, dict[str, Any]]
    schema: int | None = STORE_SCHEMA
    commit: str | None = None
    release: str | None = None
    identity: dict[str, Any] | None = None
    setup: str | None = None
    transformers: str | None = None
    datetime: str | None = None
    run: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def read(cls, doc: Any, where: str) -> HistoryEntry:
        """One store line; RecordError (``WHERE is not a history entry (why)``) when it is not one."""
        jsonfile.check_version(doc, where, key="schema", accepted=READABLE_STORE_SCHEMAS, what="history entry",
                               error=RecordError)
        if not isinstance(doc.get("caches"), dict) or not (doc.get("commit") or doc.get("release")):
            raise RecordError(f"{where} is not a history entry (no commit or release, or no caches)")
        return cls.from_json(doc, where)


@dataclass
class SentinelState(Record):
    """``kvcache sentinel``'s state: the last ``commit`` checked (a full sha), its ``figures`` ({key: value}, each a
    finite number) and the changes reported and not recovered (``open``: each the ``--json`` document's change, an
    object with at least its ``figure`` and the finite figure ``before`` it, kept as it is), bound to the
    repository's ``origin``, the ``branch``, the suite ``options`` and the ``probe_identity`` they were measured
    with."""

    commit: str
    figures: dict[str, float]
    options: list[str]
    probe_identity: str
    kvcache_sentinel_state: int = STATE_FORMAT
    origin: str | None = None
    branch: str = "main"
    subject: str = ""
    date: str = ""
    open: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The state as it was always written: the format first, then every key (none left out)."""
        out = {"kvcache_sentinel_state": self.kvcache_sentinel_state, "origin": self.origin, "branch": self.branch,
               "options": self.options, "probe_identity": self.probe_identity, "commit": self.commit,
               "subject": self.subject, "date": self.date, "figures": self.figures,
               "open": self.open}
        return {**out, **self.extra}

    @classmethod
    def load(cls, path: str | Path, where: str) -> SentinelState:
        """The state in ``path``; RecordError (one line: ``WHERE is not a kvcache sentinel state (its ...)``) when it
        cannot be read, is not a state, or is a damaged one: a missing or malformed key, an ``open`` change without
        its figure or its ``before``, a figure that is not a finite number (NaN would never be found to move), a
        ``commit`` that is not a full sha (a branch name would stay where the branch is, never seeing a new
        commit)."""
        doc = jsonfile.load_json(path, key="kvcache_sentinel_state", accepted=(STATE_FORMAT,),
                                 what="kvcache sentinel state", where=where, error=RecordError)
        problem = state_problem(doc)
        if problem:
            raise RecordError(f"{where} is not a kvcache sentinel state (its {problem})")
        return cls.from_json(doc, where)


def state_problem(doc: dict[str, Any]) -> str | None:
    """What is damaged in a sentinel state's document (``commit 'main' is not a full commit sha``), or None."""
    for key, kind, what in (("commit", str, "a string"), ("figures", dict, "an object"), ("options", list, "a list"),
                            ("probe_identity", str, "a string"), ("origin", (str, type(None)), "a string or null"),
                            ("branch", str, "a string"), ("subject", str, "a string"), ("date", str, "a string"),
                            ("open", list, "a list")):
        if key not in doc:
            if key in ("commit", "figures", "options", "probe_identity"):
                return f"{key} is missing"
            continue
        if not isinstance(doc[key], kind):
            return f"{key} is {doc[key]!r}, expected {what}"
    if not FULL_SHA.fullmatch(doc["commit"]):
        return f"commit {doc['commit']!r} is not a full commit sha (40 hex digits)"
    for name, value in doc["figures"].items():
        if not is_finite(value):
            return f"figures[{name!r}] is {value!r}, not a finite number"
    if not all(isinstance(o, str) for o in doc["options"]):
        return "options are not all strings"
    for i, change in enumerate(doc.get("open", [])):
        problem = change_problem(change)
        if problem:
            return f"open[{i}] {problem}"
    return None


def change_problem(change: Any) -> str | None:
    """What is wrong with an open change of a sentinel state, or None."""
    if not isinstance(change, dict):
        return f"is {type(change).__name__}, expected an object"
    if not isinstance(change.get("figure"), str):
        return f"has no figure (figure {change.get('figure')!r})"
    if not is_finite(change.get("before")):
        return f"before is {change.get('before')!r}, not a finite number"
    if change.get("after") is not None and not is_finite(change["after"]):
        return f"after is {change['after']!r}, not a finite number or null"
    for key, kind in (("commit", (str, type(None))), ("candidates", list), ("parent", str), ("label", str),
                      ("kind", str), ("subject", str), ("date", str), ("unit", str), ("ops", dict)):
        if key in change and not isinstance(change[key], kind):
            return f"{key} is {change[key]!r}, malformed"
    if not all(isinstance(c, str) for c in change.get("candidates", [])):
        return "candidates are not all strings"
    if not (change.get("commit") or change.get("candidates") or change.get("parent")):
        return "names no commit, no candidates and no parent"
    return None


def is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class ProbeEntry(Record):
    """One probe in a probe cache (``<cache dir>/<identity hash>/<item key>.json``, :mod:`kvcache.bisect.probing`):
    the ``identity`` hash it was measured under, the ``item`` (commit or release), its run's ``kv`` section (None:
    skipped, ``reason`` says why), the Transformers release it imported, its ``untrusted`` version gates and
    ``seconds``. No version key: a file that lacks one of these keys is not a probe (measured again)."""

    identity: str
    item: str | None
    kv: KV | None
    reason: str | None
    transformers: str | None
    untrusted: list[str]
    seconds: float
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"kv": KV.from_json}

    @classmethod
    def load(cls, path: str | Path) -> ProbeEntry:
        """The probe in ``path``; RecordError or OSError when it cannot be read or is not one."""
        entry = cls.from_json(jsonfile.load_json(path, key="kvcache_probe", accepted=(None,), what="probe",
                                                 error=RecordError), str(path))
        if not isinstance(entry.untrusted, list) or not is_finite(entry.seconds):
            raise RecordError(f"{path}: not a probe (untrusted {entry.untrusted!r}, seconds {entry.seconds!r})")
        return entry


@dataclass
class BisectStep(Record):
    """One change a bisect found (``kvcache bisect --json``'s ``changes[]``, and its first at the top level; what
    ``kvcache sentinel`` reports of a figure): the ``first_bad`` commit or release (None when ``candidates``, the
    items that could not be measured and the first bad one, are all that can be said), its ``subject`` and
    ``date``, the good ``parent``, the figure ``before`` and ``after`` it and their ``change``, the ``ops`` that
    moved and the figure's ``unit``."""

    first_bad: str | None = None
    subject: str = ""
    date: str = ""
    parent: str = ""
    before: float | None = None
    after: float | None = None
    change: float | None = None
    ops: dict[str, Any] = field(default_factory=dict)
    candidates: list[str] = field(default_factory=list)
    unit: str = ""
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

