"""Plain records: what a benchmark run measured, read from and written to pytest-benchmark's JSON.

This module (and everything in the analysing wing: fit, gate, compare, report) never imports torch,
so runs can be compared and reported on a machine that has no torch.

The JSON is pytest-benchmark's (``machine_info``, ``commit_info``, ``benchmarks``, ...) with one
extra top-level key, ``kv``, written by this project's plugin. Timed points are the benchmarks whose
``extra_info.kind == "timed"``; their ``stats.data`` holds one wall-clock time in seconds per timed
decode step. The ``kv`` section (all bandwidths in GB/s = 1e9 bytes/s, counting bytes read plus bytes
written; all times in ms unless a key says ``_s``/``_ns``)::

    kv.schema            2 (files of schema 1 still load: :func:`upgrade_kv`)
    kv.settings          the ``--kv-*`` settings of the run (:class:`kvcache.settings.Settings`)
    kv.environment       {device_name, device_type, transformers, torch, python, platform, threads, variables?:
                          {NAME: value} of identity.VARIABLES that were set}
    kv.identity          {device_name, device_type, model, dtype, threads, torch}: what makes runs comparable
    kv.model             {name, layers, heads, kv_heads, head_dim, dtype, bytes_per_token, weight_bytes,
                          max_position_embeddings}
    kv.copy_gbps         median copy bandwidth of the session (read + write of a 1 GiB copy)
    kv.copy              {start_gbps, end_gbps, measurements: [{label, gbps, nbytes, samples_gbps}]}
    kv.fit.<cache>       {intercept_ms, effective_gbps, passes, r2, n_points, passes_ci, intercept_ci,
                          confidence, weight_read_ms, crossover_tokens, contexts}, or {error, n_points}
                          when the points give no passes figure (error: why, one line)
    kv.crossovers        {cache_holds_weights_tokens, <cache>: {timed_tokens, counted_tokens, held_tokens?}}:
                          contexts (tokens) at which the cache holds as many bytes as the weights (weight_bytes /
                          bytes_per_token), at which a step's cache traffic (timed or counted passes) equals one
                          read of the weights (weight_bytes / (passes × bytes_per_token)), and (held_tokens) at
                          which the bytes the class holds, measured (kv.memory.<cache>.held_passes × KV bytes),
                          equal the weights; null where there is no figure
    kv.drift             {cache, context, first_ms, last_ms, fraction, max_fraction, ok} or {reason}
    kv.traffic.<cache>   {passes, by_op: {op: passes}, contexts, step_bytes: {context: {read, written}},
                          bytes_per_token, calls, ops_per_step, data_ops_per_step, fixed_bytes, weight_bytes,
                          weight_passes, layers, kv_bytes: {context: logical KV bytes held}, stored_bytes,
                          stored_passes, beyond, kinds: {full|sliding|linear: {passes, grows, ...}}, compiled?};
                          compiled (--kv-compile): {mode, runs_as, fullgraph,
                          unfused: {passes, by_op, ...}, fused: {passes, by_kernel, origins, step_bytes,
                          inductor_passes}, kernels_per_step, graphs_per_step, compile_s} or {mode, error}: a
                          compiled step counted unfused (the post-grad graph's ATen ops, the suite's rules) and
                          fused (what its kernels load and store, per kernel: compiled.kernel_buffers)
    kv.probe.<cache>     {query, key, value, mask, attention, expansions, enable_gqa, calls}
    kv.memory.<cache>    {allocated_passes, peak_passes, held_passes, peak_factor, allocated_by_op: {op: passes},
                          peak_by_op, contexts, kv_bytes, steps: {context: {before, allocated, peak, held, by_op,
                          peak_by_op, allocator?}}, source, declared_factor, factor_problem?, allocator?,
                          per_allocated?, beyond?}: counted memory of the counted step (kvcache.measuring.memory),
                          each figure the slope of the step's bytes against the KV bytes held between the counted
                          contexts: bytes the step allocates, its high-water mark above what was live before it,
                          bytes live after it; peak_factor: bytes live at its peak per KV byte, the cache sizes it
                          needs, set against the class's declared memory_factor (factor_problem when it needs
                          more); allocator (CUDA): the same from torch.cuda's statistics; per_allocated
                          (--kv-batch, a padded class): per allocated KV byte; beyond (sliding windows): bytes
                          held after steps past every window
    kv.verdict.<cache>.<measure>   {status, value, allowed, reason, interval?, grew?, parts?}; measures:
                          counted, timed (passes), overhead (ops per step; parts: ops_per_step, weight_passes),
                          intercept (ms), memory (held passes; parts: allocated_passes, peak_passes,
                          held_passes)
    kv.points            [{cache, context, round, median_ms, samples_ms, kv_bytes, counted_bytes,
                           achieved_gbps, achieved_fraction, beyond_trained_context, name, compiled?}]
                          (compiled, with --kv-compile: {mode, compile_s, graphs_compiled, recompiles, graph_breaks,
                           graph_calls_per_step, problem})
                          (achieved_gbps: counted bytes of the step / median step; achieved_fraction: its
                          share of kv.copy_gbps, the session median)
    kv.ledger.<cache>.<op>   {timed, timed_ci, ms}: the per-op timed ledger (kvcache.analysing.ledger), rows
                          ``(other ops)``, ``(unattributed)``, ``(profiled step)`` besides the ops
    kv.ledger_points     [{cache, context, kv_bytes, step_s, ops_s: {op: [s]}}]: the profiled steps
    kv.ledger_errors     {cache: why it has no ledger}
    kv.speed             {weights_ms, ops, steps}: median ms per profiled step of the ops reading the weights, the
                          run's decode speed that the gate compares with its timed baseline's
    kv.session           {interrupted, exit, failed: [cache]}: whether the session ran to its end
    kv.skipped           [{cache, context, reason}]   (context is null for a whole class)

Each part has a record type (:class:`Fit`, :class:`FitFailure`, :class:`Traffic`, :class:`Probe`,
:class:`Drift`, :class:`UnmeasuredDrift`, :class:`Verdict`, :class:`PointRecord`, :class:`Copy`,
:class:`Session`, :class:`Skip`) and :class:`KV` holds them; ``KV.from_json`` / ``KV.to_json`` are the one
path between the section and the records (a file of schema 1 is upgraded on the way in). Keys a record does
not know are kept in its ``extra`` and written back, so later sections survive a round trip. ``settings``,
``environment``, ``identity`` and ``model`` stay plain dicts: their keys belong to the ``--kv-*`` options,
the device, :mod:`kvcache.analysing.identity` and the model's geometry, each defined once there.
``kv.schema.json`` beside this module is the JSON Schema (draft 2020-12) of a run file with this section.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from kvcache.analysing.stats import median

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
SCHEMA_FILE = "kv.schema.json"


class RecordError(ValueError):
    """A run file that cannot be read as a kvcache-passes run; the message is one line naming the file."""


@dataclass(frozen=True)
class Point:
    """One timed benchmark: ``steps`` decode steps of ``cache`` at ``context`` tokens in one round.

    ``samples_s`` are per-step wall-clock seconds; ``kv_bytes`` is the logical KV-cache size (bytes of
    K and V held for the tokens in the cache, averaged over the timed steps) that the step must read.
    """

    cache: str
    context: int
    round: int
    kv_bytes: float
    samples_s: tuple[float, ...]
    beyond_trained_context: bool = False
    counted_bytes: float | None = None
    name: str = ""
    compiled: dict[str, Any] | None = None  # --kv-compile: the point's compilation (PointRecord.compiled)
    kv_bytes_allocated: float | None = None  # --kv-batch: KV bytes of the left-padded batch (kv_bytes: live ones)

    @property
    def median_s(self) -> float:
        return median(self.samples_s)


R = TypeVar("R", bound="Record")
# Fields every record has besides its JSON keys.
_BOOKKEEPING = ("extra", "absent")


class Record:
    """One JSON object of the ``kv`` section as a dataclass: its known keys are fields, read by :meth:`from_json`
    and written by :meth:`to_json`. Keys it does not know stay in ``extra``; a known key the object lacked is
    named in ``absent`` and left out when written back (unless set since), so a round trip loses nothing.
    Values are kept as JSON has them (lists, not tuples); checking their types is the JSON Schema's job."""

    extra: dict[str, Any]
    absent: frozenset[str]

    @classmethod
    def from_json(cls: type[R], data: Any, where: str = "") -> R:
        """The record of one JSON object; RecordError (one line, naming ``where``) when it is not an object or
        lacks a key the record cannot do without."""
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected an object, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls) if f.name not in _BOOKKEEPING}
        values: dict[str, Any] = {}
        absent = set()
        for name, spec in known.items():
            if name in data:
                values[name] = data[name]
            elif spec.default is MISSING and spec.default_factory is MISSING:
                raise RecordError(f"{where}: no {name!r}")
            else:
                absent.add(name)
        values = cls._read(values, where)
        return cls(**values, extra={k: v for k, v in data.items() if k not in known}, absent=frozenset(absent))

    @classmethod
    def _read(cls, values: dict[str, Any], where: str) -> dict[str, Any]:
        """The known keys' values as the fields hold them (records of nested objects); plain by default."""
        return values

    def to_json(self) -> dict[str, Any]:
        """The JSON object: known keys in field order (absent ones left out), then ``extra``."""
        out = {}
        for spec in fields(self):
            if spec.name in _BOOKKEEPING:
                continue
            value = getattr(self, spec.name)
            default = spec.default if spec.default_factory is MISSING else spec.default_factory()
            if spec.name in self.absent and value == default:
                continue
            out[spec.name] = _json_of(value)
        return {**out, **_json_of(self.extra)}

    def unknown_keys(self, where: str = "") -> list[str]:
        """Paths (``kv.fit.dynamic.new_figure``) of the keys this record and the records in it do not know."""
        where = where or type(self).__name__.lower()
        out = [f"{where}.{key}" for key in self.extra]
        for spec in fields(self):
            if spec.name not in _BOOKKEEPING:
                out += _unknown_keys(getattr(self, spec.name), f"{where}.{spec.name}")
        return out


def _unknown_keys(value: Any, where: str) -> list[str]:
    if isinstance(value, Record):
        return value.unknown_keys(where)
    if isinstance(value, dict):
        return [path for key, item in value.items() for path in _unknown_keys(item, f"{where}.{key}")]
    if isinstance(value, list):
        return [path for i, item in enumerate(value) for path in _unknown_keys(item, f"{where}[{i}]")]
    return []


def _json_of(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, dict):
        return {k: _json_of(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_of(v) for v in value]
    return value


def _bookkeeping() -> Any:
    return field(default_factory=dict)


def _absent() -> Any:
    return field(default=frozenset(), repr=False, compare=False)


@dataclass
class Fit(Record):
    """``kv.fit.<cache>`` with a passes figure (written by :class:`kvcache.analysing.fit.PassesFit`): passes =
    slope (s per KV byte) × copy bandwidth; ``*_ms`` in ms, ``*_gbps`` in GB/s (read + write), ``*_ci``
    [low, high] bootstrap intervals at ``confidence``, ``crossover_tokens`` in tokens."""

    passes: float | None
    intercept_ms: float | None = None
    effective_gbps: float | None = None
    passes_ci: list[float | None] | None = None
    r2: float | None = None
    n_points: int | None = None
    cache: str | None = None
    slope_ms_per_gb: float | None = None
    contexts: list[int] | None = None
    copy_gbps: float | None = None
    intercept_ci: list[float | None] | None = None
    effective_gbps_ci: list[float | None] | None = None
    confidence: float | None = None
    resamples: int | None = None
    weight_read_ms: float | None = None
    crossover_tokens: float | None = None
    ci_relative_width: float | None = None
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class FitFailure(Record):
    """``kv.fit.<cache>`` when the points give no passes figure: ``error`` says why (one line)."""

    error: str
    n_points: int | None = None
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class Traffic(Record):
    """``kv.traffic.<cache>``: counted passes (bytes read + written by one step's ops per logical KV byte), per
    op, between ``contexts``; ``step_bytes`` {context: {read, written}} in bytes, ``calls`` {op: calls}.

    Counted overhead of one step: ``ops_per_step`` (ATen ops from the model's forward call to its return) and
    ``data_ops_per_step`` (those that moved data); ``fixed_bytes`` (bytes that do not grow with context, the
    counted intercept), ``weight_passes`` = fixed bytes / ``weight_bytes``; ``layers`` of the model."""

    passes: float | None
    by_op: dict[str, float] = field(default_factory=dict)
    contexts: list[int] | None = None
    bytes_per_token: int | None = None
    step_bytes: dict[str, dict[str, int]] | None = None
    calls: dict[str, int] | None = None
    ops_per_step: int | None = None
    data_ops_per_step: int | None = None
    fixed_bytes: int | None = None
    weight_bytes: int | None = None
    weight_passes: float | None = None
    layers: int | None = None
    # Logical KV bytes held per counted context (the denominator), bytes actually stored and passes per stored byte,
    # steps past every sliding window, and passes per layer kind ({kind: {layers, window, passes, by_op, grows,
    # growth_bytes, stops_growing_at, step_bytes, kv_bytes, beyond}}): see kv.schema.json.
    kv_bytes: dict[str, float] | None = None
    stored_bytes: dict[str, int] | None = None
    stored_passes: float | None = None
    beyond: dict[str, Any] | None = None
    kinds: dict[str, dict[str, Any]] | None = None
    compiled: dict[str, Any] | None = None
    # --kv-batch N: KV bytes of the left-padded batch per counted context, passes per allocated byte, the batch.
    allocated_bytes: dict[str, float] | None = None
    allocated_passes: float | None = None
    batch: dict[str, Any] | None = None
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class LedgerRow(Record):
    """``kv.ledger.<cache>.<op>``: timed passes of one op (or of ``(other ops)``, ``(unattributed)``,
    ``(profiled step)``): the slope of its seconds per profiled step against KV bytes × the copy bandwidth (any
    sign), its interval, and ``ms``, its median milliseconds per step at the largest profiled context."""

    timed: float | None
    timed_ci: list[float | None] | None = None
    ms: float | None = None
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class LedgerPoint(Record):
    """``kv.ledger_points[]``: one profiled (cache, context): ``kv_bytes`` (bytes), seconds of each profiled
    step (``step_s``) and of each op in it (``ops_s``: {op: [seconds per step]})."""

    cache: str
    context: int
    kv_bytes: float
    step_s: list[float] = field(default_factory=list)
    ops_s: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class Probe(Record):
    """``kv.probe.<cache>``: what attention received in one step: shapes of its first call (None: no mask),
    how grouped-query attention ran, K/V expansions counted (K and V of each layer), calls per mode."""

    attention: str
    query: list[int] | None = None
    key: list[int] | None = None
    value: list[int] | None = None
    mask: list[int] | None = None
    enable_gqa: bool | None = None
    expansions: int | None = None
    calls: int | None = None
    modes: dict[str, int] | None = None
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class Drift(Record):
    """``kv.drift`` measured: median step (ms) of the first timed point and of its re-measurement at the end;
    ``fraction`` = last / first - 1 (None when not finite), ``ok`` when within ``max_fraction``."""

    ok: bool
    cache: str | None = None
    context: int | None = None
    first_ms: float | None = None
    last_ms: float | None = None
    fraction: float | None = None
    max_fraction: float | None = None
    effect: str | None = None
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class UnmeasuredDrift(Record):
    """``kv.drift`` when it could not be measured: ``reason`` says why."""

    reason: str
    max_fraction: float | None = None
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class Verdict(Record):
    """``kv.verdict.<cache>.<measure>``: the judge's status (see :data:`kvcache.analysing.gate.STATUSES`) of the
    measured ``value`` against the ``allowed`` one (passes; ``intercept``: ms; ``overhead``: ops per step; ``memory``:
    held passes); ``interval`` (timed, intercept) its interval, ``grew`` (counted; memory: the ops that allocate more)
    {op: rise in passes}, ``parts`` (overhead, memory) {figure: {status, value, allowed}}."""

    status: str
    reason: str = ""
    value: float | None = None
    allowed: float | None = None
    interval: list[float] | None = None
    grew: dict[str, float] | None = None
    parts: dict[str, dict[str, Any]] | None = None
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class PointRecord(Record):
    """One entry of ``kv.points``: a timed (cache, context, round) point, its median and every step in ms,
    ``kv_bytes`` and ``counted_bytes`` (bytes one step moves) in bytes, ``achieved_gbps`` = counted bytes /
    median step in GB/s and its ``achieved_fraction`` of the copy bandwidth."""

    cache: str
    context: int
    kv_bytes: float
    round: int = 0
    median_ms: float | None = None
    samples_ms: list[float] | None = None
    counted_bytes: float | None = None
    achieved_gbps: float | None = None
    achieved_fraction: float | None = None
    beyond_trained_context: bool = False
    name: str = ""
    compiled: dict[str, Any] | None = None
    kv_bytes_allocated: float | None = None
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()

    def to_point(self) -> Point:
        """The timed point (steps in seconds) the fit and the report work with; needs ``samples_ms``."""
        if self.samples_ms is None:
            raise RecordError(f"point {self.cache} at {self.context}: no samples_ms")
        return Point(cache=str(self.cache), context=int(self.context), round=int(self.round),
                     kv_bytes=float(self.kv_bytes), samples_s=tuple(float(x) / 1e3 for x in self.samples_ms),
                     beyond_trained_context=bool(self.beyond_trained_context), counted_bytes=self.counted_bytes,
                     name=str(self.name), compiled=self.compiled, kv_bytes_allocated=self.kv_bytes_allocated)


@dataclass
class CopyMeasurement(Record):
    """One copy-bandwidth measurement (``label``: when in the session): the median ``gbps`` of its copies of a
    ``nbytes`` tensor, each sample counting bytes read + written, in GB/s."""

    gbps: float | None
    label: str = ""
    nbytes: int | None = None
    samples_gbps: list[float] = field(default_factory=list)
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class Copy(Record):
    """``kv.copy``: the copy bandwidth (GB/s, read + write) at the start and end of the session, every measurement."""

    start_gbps: float | None = None
    end_gbps: float | None = None
    measurements: list[CopyMeasurement] = field(default_factory=list)
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()

    @classmethod
    def _read(cls, values: dict[str, Any], where: str) -> dict[str, Any]:
        if "measurements" in values:
            values["measurements"] = [CopyMeasurement.from_json(m, f"{where}.measurements[{i}]")
                                      for i, m in enumerate(_list(values["measurements"], f"{where}.measurements"))]
        return values


@dataclass
class Session(Record):
    """``kv.session``: whether the session ran to its end (``exit``: pytest's exit status by name; None when
    unknown) and the classes with a failed point."""

    interrupted: bool | None = None
    exit: str = ""
    failed: list[str] = field(default_factory=list)
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class Skip(Record):
    """One entry of ``kv.skipped``: a class (``context`` None) or one point of it that did not run, and why."""

    cache: str
    reason: str
    context: int | None = None
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()


@dataclass
class KV(Record):
    """The ``kv`` section of a run (see the module docstring), schema :data:`SCHEMA`.

    ``from_json`` reads a section of any readable schema (schema 1 through :func:`upgrade_kv`); ``to_json``
    writes this schema, non-finite floats as null. Sections a later schema adds stay in ``extra``."""

    schema: int = SCHEMA
    settings: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    copy_gbps: float | None = None
    copy: Copy | None = None
    fit: dict[str, Fit | FitFailure] = field(default_factory=dict)
    drift: Drift | UnmeasuredDrift | None = None
    traffic: dict[str, Traffic] = field(default_factory=dict)
    probe: dict[str, Probe] = field(default_factory=dict)
    memory: dict[str, dict[str, Any]] = field(default_factory=dict)  # kv.memory.<cache>: plain figures (see above)
    verdict: dict[str, dict[str, Verdict]] = field(default_factory=dict)
    skipped: list[Skip] = field(default_factory=list)
    points: list[PointRecord] = field(default_factory=list)
    session: Session | None = None
    identity: dict[str, Any] = field(default_factory=dict)
    ledger: dict[str, dict[str, LedgerRow]] = field(default_factory=dict)
    ledger_points: list[LedgerPoint] = field(default_factory=list)
    ledger_errors: dict[str, str] = field(default_factory=dict)
    speed: dict[str, Any] | None = None
    extra: dict[str, Any] = _bookkeeping()
    absent: frozenset[str] = _absent()

    @classmethod
    def from_json(cls, data: Any, where: str = "kv") -> KV:
        """The records of a ``kv`` section; RecordError (one line naming the part) for an unreadable schema or
        a part that is not what its record needs."""
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected an object, got {type(data).__name__}")
        if data.get("schema") not in READABLE_SCHEMAS:
            raise RecordError(f"{where}: schema {data.get('schema')!r} is not one of the supported "
                              f"{', '.join(map(str, READABLE_SCHEMAS))}")
        return super().from_json(upgrade_kv(data), where)

    @classmethod
    def _read(cls, values: dict[str, Any], where: str) -> dict[str, Any]:
        def each(name: str, read: Callable[[Any, str], Any]) -> None:
            if values.get(name) is not None:
                entries = _dict(values[name], f"{where}.{name}")
                values[name] = {k: read(v, f"{where}.{name}.{k}") for k, v in entries.items()}

        def fit(entry: Any, at: str) -> Fit | FitFailure:
            return FitFailure.from_json(entry, at) if isinstance(entry, dict) and "error" in entry else \
                Fit.from_json(entry, at)

        def verdicts(entry: Any, at: str) -> dict[str, Verdict]:
            return {m: Verdict.from_json(v, f"{at}.{m}") for m, v in _dict(entry, at).items()}

        def ledger(entry: Any, at: str) -> dict[str, LedgerRow]:
            return {op: LedgerRow.from_json(v, f"{at}.{op}") for op, v in _dict(entry, at).items()}

        each("fit", fit)
        each("traffic", Traffic.from_json)
        each("probe", Probe.from_json)
        each("verdict", verdicts)
        each("ledger", ledger)
        for name, read in (("points", PointRecord.from_json), ("skipped", Skip.from_json),
                           ("ledger_points", LedgerPoint.from_json)):
            if values.get(name) is not None:
                items = _list(values[name], f"{where}.{name}")
                values[name] = [read(v, f"{where}.{name}[{i}]") for i, v in enumerate(items)]
        for name, read in (("copy", Copy.from_json), ("session", Session.from_json)):
            if values.get(name) is not None:
                values[name] = read(values[name], f"{where}.{name}")
        drift = values.get("drift")
        if drift is not None:
            values["drift"] = (UnmeasuredDrift if isinstance(drift, dict) and "reason" in drift else Drift).from_json(
                drift, f"{where}.drift")
        return values

    def to_json(self) -> dict[str, Any]:
        return jsonable(super().to_json())


def _dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise RecordError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a run file with a ``kv`` section of this schema (package data)."""
    return json.loads(resources.files("kvcache.analysing").joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


@dataclass
class Run:
    """One benchmark JSON file: its timed points, its ``kv`` section and where it came from."""

    path: str
    points: list[Point] = field(default_factory=list)
    kv: dict[str, Any] = field(default_factory=dict)
    machine_info: dict[str, Any] = field(default_factory=dict)
    datetime: str = ""

    @property
    def record(self) -> KV:
        """The ``kv`` section as records (read afresh from :attr:`kv` on every call)."""
        return KV.from_json(self.kv, f"{self.path}: kv")

    @property
    def environment(self) -> dict[str, Any]:
        return self.kv.get("environment", {})

    @property
    def transformers(self) -> str:
        return str(self.environment.get("transformers", "?"))

    @property
    def device(self) -> str:
        env = self.environment
        return str(env.get("device_name") or env.get("device_type") or "?")

    @property
    def label(self) -> str:
        return f"transformers {self.transformers} on {self.device}"

    def caches(self) -> list[str]:
        """Cache classes that appear anywhere in the run, in first-seen order."""
        seen: dict[str, None] = {}
        for p in self.points:
            seen.setdefault(p.cache)
        for key in ("fit", "traffic", "verdict", "probe"):
            for name in self.kv.get(key, {}) or {}:
                seen.setdefault(name)
        return list(seen)


def point_from_benchmark(bench: dict[str, Any]) -> Point | None:
    """A Point from one entry of pytest-benchmark's ``benchmarks`` list, or None if it is not a timed point."""
    info = bench.get("extra_info") or {}
    if info.get("kind") != "timed":
        return None
    stats = bench.get("stats") or {}
    data = stats.get("data") or []
    if not data:
        return None
    return Point(
        cache=str(info["cache"]),
        context=int(info["context"]),
        round=int(info.get("round", 0)),
        kv_bytes=float(info["kv_bytes"]),
        samples_s=tuple(float(x) for x in data),
        beyond_trained_context=bool(info.get("beyond_trained_context", False)),
        counted_bytes=info.get("counted_bytes"),
        name=str(bench.get("name", "")),
    )


def points_from_benchmarks(benchmarks: list[dict[str, Any]]) -> list[Point]:
    """Timed points of a ``benchmarks`` list, in run order (drift re-measurements excluded)."""
    points = []
    for bench in benchmarks:
        point = point_from_benchmark(bench)
        if point is not None:
            points.append(point)
    return points


def upgrade_kv(kv: dict[str, Any]) -> dict[str, Any]:
    """A ``kv`` section of schema 1 in the shape of schema 2: verdicts per measure (``value`` for
    ``measured``), the run's identity, and an unknown session state (schema 1 did not record it)."""
    if kv.get("schema") == SCHEMA:
        return kv
    verdicts = {}
    for cache, combined in (kv.get("verdict") or {}).items():
        verdicts[cache] = {}
        for measure in ("counted", "timed"):
            old = (combined or {}).get(measure) or {}
            verdicts[cache][measure] = {"status": old.get("status", "not-measured"), "value": old.get("measured"),
                                        "allowed": old.get("allowed"), "reason": old.get("reason", ""),
                                        **({"interval": old["interval"]} if old.get("interval") else {})}
    from kvcache.analysing import identity

    return {**kv, "schema": SCHEMA, "verdict": verdicts, "identity": kv.get("identity", identity.of_run(kv)),
            "session": kv.get("session", {"interrupted": None, "exit": "unknown (schema 1)", "failed": []})}


def load_run(path: str | Path) -> Run:
    """Read a ``--benchmark-json`` file; raise RecordError with a one-line message naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecordError(f"{p}: cannot read ({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{p}: not JSON ({exc.msg} at line {exc.lineno})") from None
    return run_of_doc(doc, p)


def run_of_doc(doc: Any, p: Path) -> Run:
    """A run from the parsed contents of a ``--benchmark-json`` file at ``p`` (see :func:`load_run`)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise RecordError(f"{p}: not a pytest-benchmark JSON file (no 'benchmarks' list)")
    kv = doc.get("kv")
    if not isinstance(kv, dict):
        raise RecordError(f"{p}: no 'kv' section; was it written by `pytest benchmarks --benchmark-json`?")
    record = KV.from_json(kv, f"{p}: kv")  # RecordError names the file and the part
    kv = upgrade_kv(kv)
    try:
        if any(point.samples_ms is not None for point in record.points):
            points = [point.to_point() for point in record.points]
        else:
            points = points_from_benchmarks(doc["benchmarks"])
    except (RecordError, KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"{p}: malformed benchmark entry ({exc})") from None
    return Run(
        path=str(p),
        points=points,
        kv=kv,
        machine_info=doc.get("machine_info") or {},
        datetime=str(doc.get("datetime", "")),
    )


def load_runs(path: str | Path) -> list[Run]:
    """The runs of a file: one for a ``--benchmark-json`` file; two, side A then side B, for the output of
    ``kvcache ab --json`` (side A's run under ``side_a``, its path shown as ``PATH[A]``, side B's ``PATH[B]``)."""
    run = load_run(path)
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [run]
    side_a = doc.get("side_a") if isinstance(doc, dict) else None
    if not isinstance(side_a, dict):
        return [run]
    first = run_of_doc(side_a, Path(f"{path}[A]"))
    run.path = f"{path}[B]"
    return [first, run]


def jsonable(value: Any) -> Any:
    """Replace non-finite floats by None (JSON has no NaN/inf) recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
