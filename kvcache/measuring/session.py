"""The measuring side of one pytest session (or one xdist worker): the device, the model (built once), and
the records its items produce (:mod:`kvcache.analysing.records.measured`: the process's context, copy measurements,
timed points, classes counted, profiled ledger points, skips), which the plugin sends with each item's report
(:mod:`kvcache.plugin.transport`) and :mod:`kvcache.analysing.analysis` turns into the ``kv`` section.

:class:`KVSession` orchestrates: it opens points and times them; a class's counted traffic is
:mod:`kvcache.measuring.counting.class_count`'s, compiled decode's lifecycle
:mod:`kvcache.measuring.compiled.lifecycle`'s, and
the order of re-measuring :mod:`kvcache.measuring.noise`'s."""

from __future__ import annotations

import gc
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import transformers

from kvcache.analysing.bandwidth import achieved_gbps
from kvcache.analysing.estimates import median
from kvcache.analysing.records import Skip, identity
from kvcache.analysing.records.context import Environment, ModelGeometry
from kvcache.analysing.records.counted import Memory, Probe, Traffic
from kvcache.analysing.records.jsonrecord import Record
from kvcache.analysing.records.measured import Context
from kvcache.analysing.records.timed import CopyMeasurement, LedgerPoint, Point
from kvcache.analysing.settings import Settings
from kvcache.measuring import caches, decode, decoding, hooks, ledger, stages
from kvcache.measuring.bandwidth import measure_copy
from kvcache.measuring.batch import BatchShape
from kvcache.measuring.compiled.lifecycle import CompiledDecode
from kvcache.measuring.configs import load_config
from kvcache.measuring.counting.class_count import Counting
from kvcache.measuring.devices import Device
from kvcache.measuring.generate import GeneratePoint, leading_steps
from kvcache.measuring.geometry import ModelSpec, spec_from_config
from kvcache.measuring.models import build_model
from kvcache.measuring.noise import RoundMedians


@dataclass(frozen=True)
class PointId:
    """Which timed benchmark to run: a cache class at a context (tokens) in a round (what it measures is a
    :class:`~kvcache.analysing.records.timed.Point`)."""

    cache: str
    context: int
    round: int = 0

    def test_id(self, rounds: int) -> str:
        return f"{self.cache}-{self.context}" + (f"-r{self.round}" if rounds > 1 else "")


class Skipped(pytest.skip.Exception):
    """A point or class that cannot run here, with the reason: pytest reports it as a skip. (The record of a skip
    in the ``kv`` section is :class:`kvcache.analysing.records.Skip`.)"""


# Reported like pytest.skip()'s own exception ("Skipped: reason"), as pytest does for its Skipped.
Skipped.__module__, Skipped.__qualname__ = "builtins", "Skipped"


@dataclass
class KVSession:
    settings: Settings
    device: Device
    _model: Any = None
    _spec: ModelSpec | None = None
    probes: dict[str, Probe] = field(default_factory=dict)  # class -> kv.probe.<cache>
    memories: dict[str, Memory] = field(default_factory=dict)  # class -> kv.memory.<cache>
    skipped: list[Skip] = field(default_factory=list)
    pending: list[Record] = field(default_factory=list)
    context_sent: bool = False
    counted_bytes: dict[tuple[str, int], float | None] = field(default_factory=dict)  # (class, context) -> bytes
    first_point: PointId | None = None
    warmed: bool = False
    medians: RoundMedians = field(default_factory=RoundMedians)
    remeasure_order: list[tuple[str, int]] | None = None
    remeasure_started: float | None = None

    def __post_init__(self) -> None:
        if self.settings.threads is not None:  # before anything is measured: the copy bandwidth too
            torch.set_num_threads(self.settings.threads)
        self.batch = BatchShape(self.settings.batch, self.settings.ragged)
        self.generating = self.settings.driver == "generate"
        self.counting = Counting(self)
        self.compiled = CompiledDecode(self)  # --kv-compile

    def batch_of(self, strategy: Any) -> BatchShape:
        """The batch a point of ``strategy`` holds: ``--kv-batch`` sequences × its rows (beam search: N beams)."""
        return BatchShape(self.settings.batch * strategy.rows(), self.settings.ragged)

    @contextmanager
    def decoding(self, cache: str) -> Iterator[Any]:
        """For the duration, :attr:`batch` (and so :meth:`held`, the denominator of every pass) is the batch the
        key's strategy holds (all beams); yields the strategy (:mod:`kvcache.measuring.decoding`)."""
        strategy = decoding.strategy_for(cache)
        own = self.batch
        self.batch = self.batch_of(strategy)
        try:
            yield strategy
        finally:
            self.batch = own

    def held(self, context: int, tokens: float, kind: str | None = None) -> float:
        """Logical KV bytes the batch's sequences hold once the longest holds ``tokens`` (its fill: ``context``);
        of one layer kind when given (see :mod:`kvcache.measuring.batch`)."""
        if kind is None:
            return self.batch.live_bytes(self.spec(), context, tokens - context)
        return self.batch.live_bytes_of(self.spec(), kind, context, tokens - context)

    # --- the model ---
    def model(self) -> tuple[Any, ModelSpec]:
        if self._model is None:
            self._model, self._spec = build_model(self.settings.model, self.device.torch_device,
                                                  self.settings.dtype, seed=self.settings.seed)
        return self._model, self._spec

    def spec(self) -> ModelSpec:
        """The model's geometry (from its config: no weights are built for this)."""
        if self._spec is None:
            self._spec = spec_from_config(self.settings.model, load_config(self.settings.model)[0],
                                          self.settings.dtype)
        return self._spec

    def environment(self) -> dict[str, Any]:
        """``kv.environment``: the machine and libraries, Python, platform, torch threads, and ``variables``: the
        environment variables known to change what runs (:data:`kvcache.analysing.records.identity.VARIABLES`, e.g.
        ``TRANSFORMERS_SDPA_FORCE_GQA``) that are set, {NAME: value}; absent when none is."""
        env = {**self.machine(), "python": platform.python_version(), "platform": platform.platform(),
               "threads": torch.get_num_threads()}
        variables = identity.variables_of(os.environ)
        if variables:
            env["variables"] = variables
        return env

    def machine(self) -> dict[str, Any]:
        """What identifies the machine and libraries, nothing that changes between two runs on it (pytest-benchmark's
        ``machine_info`` already has the Python and OS facts)."""
        return {**self.device.describe(), "transformers": str(transformers.__version__),
                "torch": str(torch.__version__)}

    # --- records ---
    def emit(self, record: Record) -> None:
        """Queue a record for the current item's report (the plugin drains :attr:`pending`); the first one
        of a process is preceded by the model and environment (:class:`~kvcache.analysing.records.measured.Context`)."""
        if not self.context_sent:
            self.context_sent = True
            self.pending.append(Context.of(model=ModelGeometry.from_json(self.spec().to_dict(), "kv.model"),
                                            environment=Environment.from_json(self.environment(), "kv.environment")))
        self.pending.append(record)

    def take_records(self) -> list[Record]:
        out, self.pending = self.pending, []
        return out

    # --- points ---
    def measure_copy(self, label: str) -> CopyMeasurement:
        """The device's copy bandwidth now (``label``: when in the session), one ``kv.copy.measurements[]`` entry."""
        result = measure_copy(self.device, nbytes=self.settings.copy_bytes, repeats=self.settings.copy_repeats,
                              label=label)
        self.emit(result)
        return result

    def skip(self, cache: str, context: int | None, reason: str) -> Skipped:
        """The skip of a class (``context`` None) or of one point, recorded once for the report (the reason as given;
        pytest's skip line shows it by the terminal escape, a class's own reason being any string)."""
        from kvcache.analysing.tables import terminal_text

        entry = Skip(cache=cache, context=context, reason=reason)
        if entry not in self.skipped:
            self.skipped.append(entry)
            self.emit(entry)
        return Skipped(terminal_text(reason))

    def open(self, cache: str, context: int, *, warmup: int, steps: int, compiled_forward: bool = False,
             staged: bool = False) -> decode.DecodePoint:
        """A filled, warmed-up point, or :class:`Skipped` with the reason (recorded for the report);
        ``compiled_forward``: on the model with its forward compiled (``--kv-compile``); ``staged``: the point of a
        timed measurement, whose preparation ends (:func:`stages.prepared`) between its fill and its warm-up."""
        spec = caches.get(cache)
        strategy = decoding.strategy_for(cache)
        reason = caches.cache_unavailable_reason(spec, self.device.type) or (
            self.compiled.unavailable_reason() if compiled_forward else None)
        if reason:
            raise self.skip(cache, None, reason)
        reason = caches.kind_reason(spec, self.settings.model, self.spec().kind_layers())
        if reason:
            raise self.skip(cache, None, reason)
        if spec.point is not None and (self.generating or compiled_forward):
            what = "--kv-driver generate" if self.generating else f"--kv-compile {self.settings.compile}"
            raise self.skip(cache, None, f"{what}: {cache} steps the model its own way (its own point), which "
                                         f"{'generate() does not run' if self.generating else 'is not compiled'}")
        reason = self.hooks_reason(spec, compiled_forward) or strategy.unavailable(spec, self)
        if reason:
            raise self.skip(cache, None, reason)
        model, mspec = self.model()
        if compiled_forward:
            model = self.compiled.model()
        try:
            return decode.open_point(model, mspec, spec, self.device, context, warmup=warmup,
                                     steps=steps + strategy.extra_slots(), fill=self.settings.fill,
                                     seed=self.settings.seed, batch=self.batch_of(strategy),
                                     point_type=strategy.point(GeneratePoint if self.generating else
                                                               decode.DecodePoint),
                                     on_filled=stages.prepared if staged else None)
        except decode.PointSkip as exc:
            raise self.skip(cache, context, str(exc)) from None

    def hooks_reason(self, spec: caches.CacheSpec, compiled_forward: bool = False) -> str | None:
        """Why a class that hooks the model (``fill_context``/``decode_context``: :mod:`kvcache.measuring.hooks`)
        cannot run under this session's driver or compile mode, or None."""
        if not hooks.hooks_model(spec):
            return None
        if self.generating:
            return (f"--kv-driver generate: {spec.name} hooks the model (fill_context/decode_context); generate() "
                    "re-feeds the tokens its hooks evicted from the cache, so it would count the uncompressed cache")
        if compiled_forward or self.settings.compile != "off":
            return f"--kv-compile {self.settings.compile}: {spec.name} hooks the model, which is not compiled"
        return None

    def point_info(self, point: PointId, kind: str) -> dict[str, Any]:
        """``extra_info`` of a timed benchmark (before it runs): its entry in the run file's ``benchmarks[]``,
        written by pytest-benchmark."""
        s, spec = self.settings, self.spec()
        mean_tokens = point.context + s.warmup + (s.steps + 1) / 2  # tokens attention reads, averaged
        batch = {"kv_bytes_allocated": self.batch.allocated_bytes(spec, point.context, mean_tokens - point.context)
                 } if s.batch > 1 and caches.get(point.cache).pads else {}
        return {
            "kind": kind, "cache": point.cache, "context": point.context, "round": point.round,
            "kv_bytes": self.held(point.context, mean_tokens), "bytes_per_token": spec.bytes_per_token, **batch,
            "driver": s.driver, "batch": s.batch, "ragged": s.ragged,
            "device": self.device.type, "device_name": self.device.name, "dtype": s.dtype,
            "model": s.model, "fill": hooks.fill_of(caches.get(point.cache), s.fill), "warmup": s.warmup,
            "steps": s.steps,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "beyond_trained_context": point.context + s.warmup + s.steps > spec.max_position_embeddings,
        }

    def point_params(self, point: PointId) -> dict[str, Any]:
        """``params`` of a timed benchmark in pytest-benchmark's JSON, in place of the parametrization's (a
        ``PointId``, which it writes as ``UNSERIALIZABLE[...]``, and none for the drift check): plain values, the same
        keys for every timed benchmark (decode, drift, re-measured), so that ``pytest-benchmark compare
        --group-by=param:cache`` (or ``context``, ``round``, ``attention``) groups any run file. ``cache`` is the
        record's key (``dynamic@eager`` under another attention), ``attention`` what the class runs under."""
        return {"cache": point.cache, "context": point.context, "round": point.round,
                "attention": caches.get(point.cache).attention}

    def warm_model(self, steps: int = 20) -> None:
        """Once a session, before the first timed point: decode steps on a small dynamic cache, so one-time
        costs (allocator growth, kernel selection, page faults) do not land in the first point measured."""
        if not self.warmed:
            self.warmed = True
            dp = self.open("dynamic", 256, warmup=steps, steps=0)
            dp.release()

    # --- timed ---
    def run_timed(self, point: PointId, benchmark: Any, kind: str = "timed") -> None:
        """Fill untimed, warm up, then time ``steps`` single steps (each bracketed by a device sync) through
        pytest-benchmark; then count the bytes of one more step for the achieved bandwidth. Per KV byte the key's
        strategy holds (:meth:`decoding`)."""
        with self.decoding(point.cache):
            self._run_timed(point, benchmark, kind)

    def _run_timed(self, point: PointId, benchmark: Any, kind: str) -> None:
        s = self.settings
        self.warm_model()
        compiling = s.compile != "off"
        if compiling:  # compiled and warmed up: all of it preparation
            dp, compile_info = self.compiled.open(point.cache, point.context)
            self.device.sync()
            stages.prepared()
            before = self.compiled.counters()
        elif self.generating:  # warmed up inside the timed generate call
            dp = self.open(point.cache, point.context, warmup=0, steps=leading_steps(s.warmup) + s.steps, staged=True)
        else:
            dp = self.open(point.cache, point.context, warmup=s.warmup, steps=s.steps, staged=True)
        try:
            benchmark.group = f"decode {point.cache}" if kind == "timed" else "drift"
            benchmark.extra_info.update(self.point_info(point, kind))
            benchmark.params = self.point_params(point)  # read when it runs (pytest-benchmark 5.3's Metadata)
            if self.generating:  # pytest-benchmark times the whole call; the steps are the suite's own record
                benchmark.pedantic(dp.timed_generate, args=(s.warmup, s.steps), rounds=1, iterations=1)
            else:
                benchmark.pedantic(dp.timed_step, setup=dp.before_step, rounds=s.steps, iterations=1)
            stages.reached(stages.MEASURED)
            info = benchmark.extra_info
            info["step_start_ns"] = list(dp.step_start_ns)
            compiled = self.compiled.timed(compile_info, before, len(dp.step_seconds)) if compiling else None
            if compiled is not None:
                info["compiled"] = compiled.to_json()  # the benchmarks[] entry holds JSON (the file's edge)
            if len(dp.step_seconds) < s.steps:  # --benchmark-disable: the step ran once, untimed
                return
            if kind == "timed":
                self.medians.add(point.cache, point.context, dp.step_seconds)
                if self.first_point is None:
                    self.first_point = point
            optional = {name: value for name, value in (("compiled", compiled),  # tokens: before a count's generate
                                                         ("kv_bytes_allocated", info.get("kv_bytes_allocated")),
                                                         ("tokens_per_step", dp.timed_tokens_per_step()))
                        if value is not None}
            if (held := dp.timed_mean_tokens()) is not None:  # several tokens a step: the tokens it really held
                info["kv_bytes"] = self.held(point.context, held)
            counted_bytes, achieved = self._count_point(dp, point)
            info.update({"counted_bytes": counted_bytes, "achieved_gbps": achieved})
            self.emit(Point.of(cache=point.cache, context=point.context, kv_bytes=info["kv_bytes"],
                               round=point.round, samples_s=list(dp.step_seconds), counted_bytes=counted_bytes,
                               achieved_gbps=achieved, beyond_trained_context=info["beyond_trained_context"],
                               name=getattr(benchmark, "name", ""), kind=kind, **optional))
        finally:
            dp.release()
            del dp
            gc.collect()

    def _count_point(self, dp: decode.DecodePoint, point: PointId) -> tuple[float | None, float | None]:
        """``counted_bytes`` (bytes of one step at this point: the eager count, or with ``--kv-compile`` the fused
        count's line) and ``achieved_gbps`` (those bytes over the median step, GB/s) of a timed point."""
        key = (point.cache, point.context)
        if self.settings.compile != "off":  # never a dispatch mode around the compiled model: the fused count's line
            self.counted_bytes[key] = self.compiled.fused_bytes(point.cache, dp.position)
        elif key not in self.counted_bytes:
            self.counted_bytes[key] = dp.count_step().total
        counted_bytes = self.counted_bytes[key]
        median_s = median(dp.step_seconds) if dp.step_seconds else None
        # Its share of the copy bandwidth is the analysis's (kv.points, against the session median), not here.
        return counted_bytes, achieved_gbps(counted_bytes, median_s)

    def run_ledger(self, point: PointId) -> LedgerPoint:
        """Profile ``--kv-ledger-steps`` steps of one (cache, context) after a fill and warm-up (never inside a
        timed round), as many plain steps between them (not with ``--kv-driver generate``, whose steps one call takes);
        emit a ``ledger`` record: seconds per step, per op, per plain step (see :mod:`kvcache.measuring.ledger`)."""
        with self.decoding(point.cache):
            return self._run_ledger(point)

    def _run_ledger(self, point: PointId) -> LedgerPoint:
        s = self.settings
        problem = ledger.unavailable(cuda=self.device.type == "cuda")
        if problem:
            raise self.skip(point.cache, None, f"ledger: {problem}")
        self.warm_model()
        taken = s.ledger_steps if self.generating else 2 * s.ledger_steps  # profile_steps: as many plain steps
        dp = self.open(point.cache, point.context, warmup=s.warmup, steps=taken, staged=True)
        try:
            if self.generating:  # the steps of one generate call, between its marks
                profiled = ledger.profile_marked(lambda on_mark, dp=dp: dp.generate(s.ledger_steps, on_mark),
                                                 self.device.sync, s.ledger_steps, cuda=self.device.type == "cuda")
            else:
                profiled = ledger.profile_steps(dp.step, self.device.sync, s.ledger_steps,
                                                cuda=self.device.type == "cuda")
        finally:
            dp.release()
            del dp
            gc.collect()
        offsets = range(s.ledger_steps) if self.generating else ledger.profiled_offsets(s.ledger_steps)
        mean_tokens = point.context + s.warmup + 1 + sum(offsets) / len(offsets)  # tokens held after each step
        record = LedgerPoint.of(cache=point.cache, context=point.context,
                                kv_bytes=self.held(point.context, mean_tokens), **profiled)
        self.emit(record)
        return record

    def remeasure(self, k: int, benchmark: Any) -> None:
        """Measure the k-th noisiest point (:meth:`RoundMedians.noisiest`, chosen once) once more, as one more
        round, within ``--kv-remeasure-seconds`` of the first re-measurement."""
        if self.remeasure_order is None:
            self.remeasure_order, self.remeasure_started = self.medians.noisiest(), time.monotonic()
        elapsed = time.monotonic() - (self.remeasure_started or 0.0)
        if elapsed > self.settings.remeasure_seconds:
            raise Skipped(f"re-measure budget of {self.settings.remeasure_seconds:g} s spent ({elapsed:.0f} s)")
        if k >= len(self.remeasure_order):
            raise Skipped(f"only {len(self.remeasure_order)} points were measured")
        cache, context = self.remeasure_order[k]
        self.run_timed(PointId(cache, context, self.settings.rounds + k), benchmark)
        benchmark.extra_info["remeasured"] = True

    # --- counted ---
    def count(self, cache: str) -> Traffic:
        """Counted passes of ``cache``, its attention probe and counted memory
        (:mod:`kvcache.measuring.counting.class_count`);
        with ``--kv-compile`` its compiled step counted too (full-attention models); emits the ``traffic`` record and
        returns ``kv.traffic.<cache>``."""
        with self.decoding(cache):
            counted = self.counting.count(cache)
        fill = hooks.fill_of(caches.get(cache), self.settings.fill)
        if fill != self.settings.fill:  # prefilled under --kv-fill synthetic: the record says so
            counted.traffic.update(fill=fill)
        self.probes[cache] = counted.probe
        if counted.memory is not None:
            self.memories[cache] = counted.memory
        if self.settings.compile != "off" and not self.spec().mixed:
            counted.traffic.update(compiled=self.compiled.count(cache))
        self.emit(counted)
        return counted.traffic
