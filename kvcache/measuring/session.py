"""The measuring side of one pytest session (or one xdist worker): the device, the model (built once), and
the records its items produce: plain dicts (``copy``, ``point``, ``traffic``, ``skip``, ``context``) that
the plugin attaches to each item's report and :mod:`kvcache.analysing.analysis` turns into the ``kv`` section."""

from __future__ import annotations

import gc
import json
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import transformers

from kvcache.analysing import identity
from kvcache.analysing.analysis import achieved_gbps
from kvcache.analysing.stats import median
from kvcache.measuring import caches, compat, compiled, decode, ledger, memory, traffic
from kvcache.measuring.bandwidth import measure_copy
from kvcache.measuring.batch import BatchShape
from kvcache.measuring.devices import Device
from kvcache.measuring.generate import GeneratePoint, leading_steps
from kvcache.measuring.models import ModelSpec, build_model, load_config, spec_from_config
from kvcache.measuring.probe import probe
from kvcache.settings import Settings

COUNT_WARMUP = 2  # decode steps before a counted one: enough for lazy initialisation; bytes do not change after


def plain(record: dict[str, Any]) -> dict[str, Any]:
    """A record as plain JSON data (str for torch's version objects, lists for tuples), as it must travel
    between xdist processes and land in the JSON."""
    return json.loads(json.dumps(record, default=str))


@dataclass(frozen=True)
class PointId:
    """One timed benchmark: a cache class at a context in a round."""

    cache: str
    context: int
    round: int = 0

    def test_id(self, rounds: int) -> str:
        return f"{self.cache}-{self.context}" + (f"-r{self.round}" if rounds > 1 else "")


class Skip(pytest.skip.Exception):
    """A point or class that cannot run here, with the reason: pytest reports it as a skip."""


# Reported like pytest.skip()'s own exception ("Skipped: reason"), as pytest does for its Skipped.
Skip.__module__, Skip.__qualname__ = "builtins", "Skipped"


@dataclass
class KVSession:
    settings: Settings
    device: Device
    _model: Any = None
    _spec: ModelSpec | None = None
    copies: list[dict[str, Any]] = field(default_factory=list)
    traffic: dict[str, dict[str, Any]] = field(default_factory=dict)
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)
    context_sent: bool = False
    counted_bytes: dict[tuple[str, int], int] = field(default_factory=dict)
    first_point: PointId | None = None
    used: bool = False
    warmed: bool = False
    point_medians: dict[tuple[str, int], list[tuple[float, float]]] = field(default_factory=dict)
    remeasure_order: list[tuple[str, int]] | None = None
    remeasure_started: float | None = None
    _compiled: Any = None  # --kv-compile: the model with its forward compiled (compiled.CompiledModel)
    settled: dict[str, dict[str, Any]] = field(default_factory=dict)  # class -> its settling compile
    memories: dict[str, dict[str, Any]] = field(default_factory=dict)  # class -> kv.memory.<cache>
    memory_steps: dict[int, Any] = field(default_factory=dict)  # context -> the last counted steps' memory.MemoryStep

    def __post_init__(self) -> None:
        if self.settings.threads is not None:  # before anything is measured: the copy bandwidth too
            torch.set_num_threads(self.settings.threads)
        self.batch = BatchShape(self.settings.batch, self.settings.ragged)
        self.generating = self.settings.driver == "generate"

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
        environment variables known to change what runs (:data:`kvcache.analysing.identity.VARIABLES`, e.g.
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
    def emit(self, record: dict[str, Any]) -> None:
        """Queue a record for the current item's report (the plugin drains :attr:`pending`); the first one
        of a process is preceded by the model and environment."""
        if not self.context_sent:
            self.context_sent = True
            self.pending.append(plain({"type": "context", "model": self.spec().to_dict(),
                                       "environment": self.environment()}))
        self.pending.append(plain(record))

    def take_records(self) -> list[dict[str, Any]]:
        out, self.pending = self.pending, []
        return out

    # --- measurements ---
    def measure_copy(self, label: str) -> dict[str, Any]:
        self.used = True
        result = measure_copy(self.device, nbytes=self.settings.copy_bytes, repeats=self.settings.copy_repeats,
                              label=label).to_dict()
        self.copies.append(result)
        self.emit({"type": "copy", **result})
        return result

    def skip(self, cache: str, context: int | None, reason: str) -> Skip:
        entry = {"cache": cache, "context": context, "reason": reason}
        if entry not in self.skipped:
            self.skipped.append(entry)
            self.emit({"type": "skip", **entry})
        return Skip(reason)

    def open(self, cache: str, context: int, *, warmup: int, steps: int,
             compiled_forward: bool = False) -> decode.DecodePoint:
        """A filled, warmed-up point, or :class:`Skip` with the reason (recorded for the report);
        ``compiled_forward``: on the model with its forward compiled (``--kv-compile``)."""
        self.used = True
        spec = caches.get(cache)
        reason = caches.unavailable_reason(spec, self.device.type) or (
            compiled.unavailable_reason(self.settings.compile, self.device.type) if compiled_forward else None)
        if reason:
            raise self.skip(cache, None, reason)
        reason = caches.kind_reason(spec, self.settings.model, self.spec().kind_layers())
        if reason:
            raise self.skip(cache, None, reason)
        if spec.point is not None and (self.generating or compiled_forward):
            what = "--kv-driver generate" if self.generating else f"--kv-compile {self.settings.compile}"
            raise self.skip(cache, None, f"{what}: {cache} steps the model its own way (its own point), which "
                                         f"{'generate() does not run' if self.generating else 'is not compiled'}")
        model, mspec = self.model()
        if compiled_forward:
            model = self.compiled_model()
        try:
            return decode.open_point(model, mspec, spec, self.device, context, warmup=warmup, steps=steps,
                                     fill=self.settings.fill, seed=self.settings.seed, batch=self.batch,
                                     point_type=GeneratePoint if self.generating else None)
        except decode.PointSkip as exc:
            raise self.skip(cache, context, str(exc)) from None

    def point_info(self, point: PointId, kind: str) -> dict[str, Any]:
        """``extra_info`` of a timed benchmark (before it runs)."""
        s, spec = self.settings, self.spec()
        mean_tokens = point.context + s.warmup + (s.steps + 1) / 2  # tokens attention reads, averaged
        batch = {"kv_bytes_allocated": self.batch.allocated_bytes(spec, point.context, mean_tokens - point.context)
                 } if s.batch > 1 and caches.get(point.cache).pads else {}
        return {
            "kind": kind, "cache": point.cache, "context": point.context, "round": point.round,
            "kv_bytes": self.held(point.context, mean_tokens), "bytes_per_token": spec.bytes_per_token, **batch,
            "driver": s.driver, "batch": s.batch, "ragged": s.ragged,
            "device": self.device.type, "device_name": self.device.name, "dtype": s.dtype,
            "model": s.model, "fill": s.fill, "warmup": s.warmup, "steps": s.steps,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "beyond_trained_context": point.context + s.warmup + s.steps > spec.max_position_embeddings,
        }

    # --- compiled decode (--kv-compile; see kvcache.measuring.compiled) ---
    def compile_setup(self) -> None:
        """Room for every graph this session compiles on the forward's one code object (per class: two settling
        graphs and two counting ones, with margin), failing loudly beyond it."""
        compiled.configure(8 + 8 * len(self.settings.caches))

    def compiled_model(self) -> Any:
        if self._compiled is None:
            self.compile_setup()
            self._compiled = compiled.CompiledModel(self.model()[0], self.settings.compile)
        return self._compiled

    def compiled_warm_up(self, cache: str, dp: decode.DecodePoint, steps: int) -> dict[str, Any]:
        """Static addresses marked, then ``steps`` untimed compiled steps; a class that does not compile is
        skipped with dynamo's reason. Returns the seconds and dynamo's counter movement."""
        compiled.mark_static(dp.cache, dp.spec.layers)
        try:
            with compiled.compiling_steps() as warm:
                dp.warm_up(steps)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.FailOnRecompileLimitHit,
                torch._dynamo.exc.BackendCompilerFailed) as exc:
            dp.release()
            raise self.skip(cache, None, f"--kv-compile {self.settings.compile}: {cache} "
                                         f"{compiled.compile_problem(exc)}") from None
        return warm

    def settle(self, cache: str) -> dict[str, Any]:
        """Once per class, before its first timed point: untimed compiled steps at two small contexts, so that the
        class's graph is the dynamic one before any point is timed (see kvcache.measuring.compiled)."""
        if cache not in self.settled:
            seconds, graphs = 0.0, 0
            for context in compiled.SETTLE_CONTEXTS:
                dp = self.open(cache, context, warmup=0, steps=compiled.SETTLE_STEPS, compiled_forward=True)
                warm = self.compiled_warm_up(cache, dp, compiled.SETTLE_STEPS)
                dp.release()
                seconds, graphs = seconds + warm["seconds"], graphs + warm["moved"]["graphs"]
            self.settled[cache] = {"seconds": seconds, "graphs": graphs, "charged": False}
        return self.settled[cache]

    def open_compiled(self, point: PointId) -> tuple[decode.DecodePoint, dict[str, Any]]:
        """A filled, compiled and warmed-up point, and its compilation so far (``compile_s``: seconds of its
        untimed preparation spent in steps that compiled, the class's settling included at its first point)."""
        s = self.settings
        settled = self.settle(point.cache)
        dp = self.open(point.cache, point.context, warmup=0, steps=s.warmup + s.steps, compiled_forward=True)
        warm = self.compiled_warm_up(point.cache, dp, s.warmup)
        seconds = warm["seconds"] if warm["moved"]["graphs"] else 0.0
        graphs = warm["moved"]["graphs"]
        if not settled["charged"]:
            settled["charged"] = True
            seconds, graphs = seconds + settled["seconds"], graphs + settled["graphs"]
        return dp, {"mode": s.compile, "compile_s": round(seconds, 3), "graphs_compiled": graphs}

    def count_compiled(self, cache: str) -> dict[str, Any]:
        """``kv.traffic.<cache>.compiled``: a compiled step counted unfused and fused at the counted contexts (its
        own compiles, static shapes), or ``{mode, error}`` when the class does not compile here."""
        s = self.settings
        reason = compiled.unavailable_reason(s.compile, self.device.type)
        if reason:
            return {"mode": s.compile, "error": reason}
        spec = caches.get(cache)
        if spec.point is not None:
            return {"mode": s.compile, "error": f"{cache} steps the model its own way (its own point): not compiled"}
        self.compile_setup()
        model, mspec = self.model()

        def open_point(m: Any, context: int) -> decode.DecodePoint:
            max_tokens = decode.tokens_needed(context, compiled.COUNT_WARMUP, 1)
            decode.check_memory(mspec, spec, self.device, max_tokens, self.batch.size)
            return decode.DecodePoint(m, mspec, spec, self.device, context, max_tokens, fill=s.fill,
                                      seed=s.seed, batch=self.batch).build()
        try:
            held = {c: self.held(c, c + compiled.COUNT_WARMUP + 1) for c in s.counted_contexts}
            return compiled.count_compiled(model, open_point, s.counted_contexts, s.compile, mspec.bytes_per_token,
                                           self.device.type, kv_bytes=held)
        except (compiled.CompileProblem, torch._dynamo.exc.BackendCompilerFailed, decode.PointSkip) as exc:
            return {"mode": s.compile, "error": f"{cache}: {exc}"[:400]}

    def warm_model(self, steps: int = 20) -> None:
        """Once a session, before the first timed point: decode steps on a small dynamic cache, so one-time
        costs (allocator growth, kernel selection, page faults) do not land in the first point measured."""
        if not self.warmed:
            self.warmed = True
            dp = self.open("dynamic", 256, warmup=steps, steps=0)
            dp.release()

    def run_timed(self, point: PointId, benchmark: Any, kind: str = "timed") -> None:
        """Fill untimed, warm up, then time ``steps`` single steps (each bracketed by a device sync) through
        pytest-benchmark; then count the bytes of one more step for the achieved bandwidth."""
        s = self.settings
        self.warm_model()
        compiling = s.compile != "off"
        if compiling:
            dp, compile_info = self.open_compiled(point)
            before, calls = compiled.dynamo_state(), self.compiled_model().backend.calls
        elif self.generating:  # warmed up inside the timed generate call
            dp = self.open(point.cache, point.context, warmup=0, steps=leading_steps(s.warmup) + s.steps)
        else:
            dp = self.open(point.cache, point.context, warmup=s.warmup, steps=s.steps)
        try:
            benchmark.group = f"decode {point.cache}" if kind == "timed" else "drift"
            benchmark.extra_info.update(self.point_info(point, kind))
            if self.generating:  # pytest-benchmark times the whole call; the steps are the suite's own record
                benchmark.pedantic(dp.timed_generate, args=(s.warmup, s.steps), rounds=1, iterations=1)
            else:
                benchmark.pedantic(dp.timed_step, setup=dp.before_step, rounds=s.steps, iterations=1)
            benchmark.extra_info["step_start_ns"] = list(dp.step_start_ns)
            if compiling:
                benchmark.extra_info["compiled"] = self.timed_compilation(
                    compile_info, compiled.moved(before, compiled.dynamo_state()),
                    self.compiled_model().backend.calls - calls, len(dp.step_seconds))
            if len(dp.step_seconds) < s.steps:  # --benchmark-disable: the step ran once, untimed
                return
            samples = sorted(dp.step_seconds)
            if kind == "timed":
                iqr = samples[3 * len(samples) // 4] - samples[len(samples) // 4]
                self.point_medians.setdefault((point.cache, point.context), []).append((median(samples), iqr))
                if self.first_point is None:
                    self.first_point = point
            self._count_point(dp, point, benchmark)
            self.emit({"type": "point", **benchmark.extra_info, "samples_s": list(dp.step_seconds),
                       "name": getattr(benchmark, "name", "")})
        finally:
            dp.release()
            del dp
            gc.collect()

    def run_ledger(self, point: PointId) -> dict[str, Any]:
        """Profile ``--kv-ledger-steps`` steps of one (cache, context) after a fill and warm-up (never inside a
        timed round); emit a ``ledger`` record: seconds per step, per op (see :mod:`kvcache.measuring.ledger`)."""
        s = self.settings
        problem = ledger.profiler_available()
        if problem:
            raise self.skip(point.cache, None, f"ledger: {problem}")
        self.warm_model()
        dp = self.open(point.cache, point.context, warmup=s.warmup, steps=s.ledger_steps)
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
        mean_tokens = point.context + s.warmup + (s.ledger_steps + 1) / 2
        record = {"type": "ledger", "cache": point.cache, "context": point.context,
                  "kv_bytes": self.held(point.context, mean_tokens), **profiled}
        self.emit(record)
        return record

    def noisiest(self) -> list[tuple[str, int]]:
        """(cache, context) points, noisiest first: relative spread of their round medians (with one round,
        the relative interquartile range of its steps)."""
        def noise(key: tuple[str, int]) -> float:
            runs = self.point_medians[key]
            medians = [m for m, _ in runs]
            if len(runs) > 1:
                return (max(medians) - min(medians)) / median(medians)
            return runs[0][1] / runs[0][0] if runs[0][0] else 0.0
        return sorted(self.point_medians, key=noise, reverse=True)

    def remeasure(self, k: int, benchmark: Any) -> None:
        """Measure the k-th noisiest point once more, as one more round (within ``--kv-remeasure-seconds``)."""
        if self.remeasure_order is None:
            self.remeasure_order, self.remeasure_started = self.noisiest(), time.monotonic()
        elapsed = time.monotonic() - (self.remeasure_started or 0.0)
        if elapsed > self.settings.remeasure_seconds:
            raise Skip(f"re-measure budget of {self.settings.remeasure_seconds:g} s spent ({elapsed:.0f} s)")
        if k >= len(self.remeasure_order):
            raise Skip(f"only {len(self.remeasure_order)} points were measured")
        cache, context = self.remeasure_order[k]
        self.run_timed(PointId(cache, context, self.settings.rounds + k), benchmark)
        benchmark.extra_info["remeasured"] = True

    @staticmethod
    def timed_compilation(info: dict[str, Any], moved: dict[str, int], graph_calls: int, steps: int) -> dict[str, Any]:
        """A compiled point's record: dynamo's counters over the timed steps, compiled graph calls per step, and
        the problem that makes its timed figure inconclusive (a recompile there, a step that ran eagerly)."""
        per_step = graph_calls / steps if steps else 0.0
        problem = None
        if moved["graphs"]:
            problem = f"{moved['graphs']} recompile(s) during the timed steps (dynamo compiled again)"
        elif steps and per_step == 0:
            problem = "the timed steps ran eagerly (no compiled graph was called)"
        return {**info, "recompiles": moved["graphs"], "graph_breaks": moved["graph_breaks"],
                "graph_calls_per_step": per_step, "problem": problem}

    def _count_point(self, dp: decode.DecodePoint, point: PointId, benchmark: Any) -> None:
        key = (point.cache, point.context)
        if self.settings.compile != "off":  # never a dispatch mode around the compiled model: the fused count's line
            fused = compiled.fused_bytes_at((self.traffic.get(point.cache) or {}).get("compiled"), dp.position)
            self.counted_bytes[key] = fused
        elif key not in self.counted_bytes:
            self.counted_bytes[key] = dp.count_step().total
        counted_bytes = self.counted_bytes[key]
        median_s = median(dp.step_seconds) if dp.step_seconds else None
        # Its share of the copy bandwidth is the analysis's (kv.points, against the session median), not here.
        benchmark.extra_info.update({"counted_bytes": counted_bytes,
                                     "achieved_gbps": achieved_gbps(counted_bytes, median_s)})

    def count(self, cache: str) -> dict[str, Any]:
        """Counted passes of ``cache`` (steps counted at the two counted contexts) and its attention probe; for a
        model whose layers are not all full attention, passes per layer kind (:meth:`count_kinds`)."""
        s = self.settings
        model, spec = self.model()
        if spec.mixed:
            return self.count_kinds(cache)
        contexts = tuple(s.counted_contexts)
        counts, tokens, stored = self._counted_steps(cache, contexts, probe_at=max(contexts),
                                                     scopes={model: traffic.FORWARD})
        held = {c: self.held(c, tokens[c]) for c in contexts}
        self.traffic[cache] = traffic.counted_passes(counts, spec.bytes_per_token, kv_bytes=held, layers=spec.layers,
                                                     weight_bytes=spec.weight_bytes)
        self.traffic[cache].update(self._held_and_stored(cache, counts, tokens, stored=stored))
        measured = self._memory(cache, tokens)
        if s.compile != "off":
            self.traffic[cache]["compiled"] = self.count_compiled(cache)
        self.emit({"type": "traffic", "cache": cache, "traffic": self.traffic[cache], "probe": self.probes.get(cache),
                   **({"memory": measured} if measured else {})})
        return self.traffic[cache]

    def _memory(self, cache: str, tokens: dict[int, int]) -> dict[str, Any] | None:
        """``kv.memory.<cache>`` from the memory of the steps just counted (:mod:`kvcache.measuring.memory`): slopes per
        live KV byte, and with a left-padded batch per allocated KV byte too (``per_allocated``); None when not
        measured."""
        steps = self.memory_steps
        if len(steps) < 2:
            return None
        spec, cache_spec = self.spec(), caches.get(cache)
        held = {c: self.held(c, tokens[c]) for c in steps}
        out = memory.memory_passes(steps, held, declared_factor=cache_spec.memory_factor)
        if self.batch.size > 1 and cache_spec.pads:
            allocated = {c: self.batch.allocated_bytes(spec, c, tokens[c] - c) for c in steps}
            per = memory.memory_passes(steps, allocated)
            out["per_allocated"] = {k: per[k] for k in ("allocated_passes", "peak_passes", "held_passes")}
        self.memories[cache] = out
        return out

    def _counted_steps(self, cache: str, contexts: tuple[int, ...], *, probe_at: int | None = None,
                       scopes: dict[Any, str] | None = None) -> tuple[dict[int, Any], dict[int, int], dict[int, int]]:
        """One counted step of ``cache`` at each context (ops charged per decoder layer too, with ``scopes``); the
        tokens its attention sees and the bytes the cache actually stores there."""
        s = self.settings
        model, spec = self.model()
        counts, tokens, stored = {}, {}, {}
        self.memory_steps = {}
        for context in contexts:
            warm = min(s.warmup, COUNT_WARMUP)
            tracker = memory.MemoryTracker(self.device.type)  # the memory of the counted step (its region only)
            with tracker:
                if self.generating:  # warmed up inside the counted generate call
                    dp = self.open(cache, context, warmup=0, steps=leading_steps(warm) + 1)
                else:
                    dp = self.open(cache, context, warmup=warm, steps=1)
                counts[context] = dp.count_step(warm, scopes)
            if tracker.step is not None:
                self.memory_steps[context] = tracker.step
            tokens[context] = dp.position  # after the step: the tokens its attention read
            stored[context] = compat.stored_bytes(dp.cache)
            if context == probe_at:
                self.probes[cache] = probe(dp.step, spec.heads, spec.kv_heads).to_dict()
            dp.release()
        return counts, tokens, stored

    def _held_and_stored(self, cache: str, counts: dict[int, Any], tokens: dict[int, int],
                         stored: dict[int, int] | None = None) -> dict[str, Any]:
        """``kv_bytes`` {context: logical KV bytes the batch holds}; with a batch also ``allocated_bytes`` and
        ``allocated_passes`` (per byte of the left-padded rectangle: equal to passes without padding);
        ``stored_bytes`` {context: bytes stored} and ``stored_passes`` (Δ step bytes / Δ bytes stored) when given."""
        spec = self.spec()
        contexts = sorted(counts)
        out: dict[str, Any] = {"kv_bytes": {str(c): self.held(c, tokens[c]) for c in contexts}}
        if self.batch.size > 1 and caches.get(cache).pads:
            lo, hi = contexts[0], contexts[-1]
            allocated = {c: self.batch.allocated_bytes(spec, c, tokens[c] - c) for c in contexts}
            out["allocated_bytes"] = {str(c): allocated[c] for c in contexts}
            out["allocated_passes"] = (counts[hi].total - counts[lo].total) / (allocated[hi] - allocated[lo])
            out["batch"] = self.batch.to_dict()
        if stored:
            lo, hi = contexts[0], contexts[-1]
            delta = stored[hi] - stored[lo]
            out["stored_bytes"] = {str(c): stored[c] for c in contexts}
            out["stored_passes"] = (counts[hi].total - counts[lo].total) / delta if delta > 0 else None
        return out

    def count_kinds(self, cache: str) -> dict[str, Any]:
        """Counted passes of a model with sliding-window or linear-attention layers: whole step and per layer kind,
        against the logical KV bytes the cache holds (sliding layers stop at their window, linear state does not
        grow), at contexts below every window (:meth:`ModelSpec.counted_contexts`); then two steps past every window,
        where sliding layers must have stopped growing."""
        s = self.settings
        model, spec = self.model()
        contexts = spec.counted_contexts(tuple(s.counted_contexts))
        scopes = {model: traffic.FORWARD, **traffic.layer_scopes(model)}
        kind_layers = spec.kind_layers()
        counts, tokens, stored = self._counted_steps(cache, contexts, probe_at=max(contexts), scopes=scopes)
        held = {c: self.held(c, tokens[c]) for c in contexts}
        result = traffic.counted_passes(counts, spec.bytes_per_token, kv_bytes=held, layers=spec.layers,
                                        weight_bytes=spec.weight_bytes)
        result.update(self._held_and_stored(cache, counts, tokens, stored))
        measured = self._memory(cache, tokens)
        kinds_held = {kind: {c: self.held(c, tokens[c], kind) for c in contexts} for kind in kind_layers}
        windows = {kind: value["window"] for kind, value in spec.kinds_dict().items()}
        far = spec.beyond_windows(contexts)
        beyond = beyond_held = None
        if far:
            beyond, far_tokens, _ = self._counted_steps(cache, far, scopes=scopes)
            beyond_held = {kind: {c: self.held(c, far_tokens[c], kind) for c in far} for kind in kind_layers}
            result["beyond"] = {"contexts": list(far), "step_bytes": {str(c): beyond[c].total for c in far},
                                "kv_bytes": {str(c): self.held(c, far_tokens[c]) for c in far}}
            far_memory = self.memory_steps
            if measured and len(far_memory) == len(far):  # past every window: a sliding layer must hold no more
                held_far = {c: far_memory[c].held for c in far}
                measured["beyond"] = {"contexts": list(far), "held": {str(c): held_far[c] for c in far},
                                      "held_growth_bytes": held_far[far[-1]] - held_far[far[0]],
                                      "kv_bytes": result["beyond"]["kv_bytes"]}
        result["kinds"] = traffic.kind_passes(counts, kind_layers, kinds_held, windows=windows, beyond=beyond,
                                              beyond_held=beyond_held)
        self.traffic[cache] = result
        self.emit({"type": "traffic", "cache": cache, "traffic": result, "probe": self.probes.get(cache),
                   **({"memory": measured} if measured else {})})
        return result
