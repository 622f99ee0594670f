"""Compiled decode (``--kv-compile``) in a measuring session: the model with its forward compiled (built once, with
room for every graph the session compiles), each class settled on its dynamic graph before its first timed point,
the seconds a point's untimed preparation spent compiling, dynamo's counters around the timed steps, and each
class's compiled step counted (:mod:`kvcache.measuring.compiled.step_count`). How and why: docs/compiled.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvcache.analysing.records.counted import CompiledTraffic
from kvcache.analysing.records.timed import PointCompile
from kvcache.measuring import caches, decode
from kvcache.measuring.compiled import forward as compiled
from kvcache.measuring.compiled.step_count import FusedLine, count_compiled
from kvcache.measuring.counting.class_count import COUNT_WARMUP


@dataclass
class Settling:
    """A class's settling compile (untimed steps at :data:`compiled.SETTLE_CONTEXTS`, so that its graph is the
    dynamic one before any point is timed): wall seconds of the steps that compiled, graphs compiled, and whether
    a timed point's compile figures include them yet (the class's first point takes them)."""

    seconds: float
    graphs: int
    charged: bool = False


@dataclass(frozen=True)
class Counters:
    """Dynamo's counters (:func:`compiled.dynamo_state`) and the compiled graphs' calls at one moment."""

    dynamo: dict[str, int]
    graph_calls: int


def timed_compilation(info: dict[str, Any], moved: dict[str, int], graph_calls: int, steps: int) -> PointCompile:
    """A compiled point's record (``kv.points[].compiled``): ``info`` (its compilation so far), dynamo's counters
    over the timed steps, compiled graph calls per step, and the problem that makes its timed figure inconclusive
    (a recompile there, a step that ran eagerly)."""
    per_step = graph_calls / steps if steps else 0.0
    problem = None
    if moved["graphs"]:
        problem = f"{moved['graphs']} recompile(s) during the timed steps (dynamo compiled again)"
    elif steps and per_step == 0:
        problem = "the timed steps ran eagerly (no compiled graph was called)"
    return PointCompile.of(**info, recompiles=moved["graphs"], graph_breaks=moved["graph_breaks"],
                           graph_calls_per_step=per_step, problem=problem)


class CompiledDecode:
    """The compiled side of a session. ``session`` (a :class:`kvcache.measuring.session.KVSession`) gives the
    settings, the eager model, the batch and its KV bytes (``held``), opens points (``open``, with
    ``compiled_forward=True`` on :meth:`model`) and makes skips (``skip``)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self._model: compiled.CompiledModel | None = None
        self.settled: dict[str, Settling] = {}  # class -> its settling compile
        self.fused: dict[str, FusedLine] = {}  # class -> the line its fused step bytes lie on (counted classes)

    def unavailable_reason(self) -> str | None:
        """Why this session's ``--kv-compile`` mode cannot run on its device, or None."""
        return compiled.unavailable_reason(self.session.settings.compile, self.session.device.type)

    def setup(self) -> None:
        """Room for every graph this session compiles on the forward's one code object (per class: two settling
        graphs and two counting ones, with margin), failing loudly beyond it."""
        compiled.configure(8 + 8 * len(self.session.settings.caches))

    def model(self) -> compiled.CompiledModel:
        """The session's model with its forward compiled (built at the first call)."""
        if self._model is None:
            self.setup()
            self._model = compiled.CompiledModel(self.session.model()[0], self.session.settings.compile)
        return self._model

    def warm_up(self, cache: str, dp: decode.DecodePoint, steps: int) -> dict[str, Any]:
        """Static addresses marked, then ``steps`` untimed compiled steps; a class that does not compile is
        skipped with dynamo's reason. Returns the seconds and dynamo's counter movement."""
        compiled.mark_static(dp.cache, dp.spec.layers)
        try:
            with compiled.compiling_steps() as warm:
                dp.warm_up(steps)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.FailOnRecompileLimitHit,
                torch._dynamo.exc.BackendCompilerFailed) as exc:
            dp.release()
            raise self.session.skip(cache, None, f"--kv-compile {self.session.settings.compile}: {cache} "
                                                 f"{compiled.compile_problem(exc)}") from None
        return warm

    def settle(self, cache: str) -> Settling:
        """Once per class, before its first timed point: untimed compiled steps at two small contexts, so that the
        class's graph is the dynamic one before any point is timed."""
        if cache not in self.settled:
            seconds, graphs = 0.0, 0
            for context in compiled.SETTLE_CONTEXTS:
                dp = self.session.open(cache, context, warmup=0, steps=compiled.SETTLE_STEPS, compiled_forward=True)
                warm = self.warm_up(cache, dp, compiled.SETTLE_STEPS)
                dp.release()
                seconds, graphs = seconds + warm["seconds"], graphs + warm["moved"]["graphs"]
            self.settled[cache] = Settling(seconds, graphs)
        return self.settled[cache]

    def open(self, cache: str, context: int) -> tuple[decode.DecodePoint, dict[str, Any]]:
        """A filled, compiled and warmed-up point, and its compilation so far: ``mode``, ``compile_s`` (seconds of
        its untimed preparation spent in steps that compiled, the class's settling included at its first point)
        and ``graphs_compiled``."""
        s = self.session.settings
        settled = self.settle(cache)
        dp = self.session.open(cache, context, warmup=0, steps=s.warmup + s.steps, compiled_forward=True)
        warm = self.warm_up(cache, dp, s.warmup)
        seconds = warm["seconds"] if warm["moved"]["graphs"] else 0.0
        graphs = warm["moved"]["graphs"]
        if not settled.charged:
            settled.charged = True
            seconds, graphs = seconds + settled.seconds, graphs + settled.graphs
        return dp, {"mode": s.compile, "compile_s": round(seconds, 3), "graphs_compiled": graphs}

    def counters(self) -> Counters:
        """Dynamo's counters and the compiled graphs' calls now (before the timed steps)."""
        return Counters(compiled.dynamo_state(), self.model().backend.calls)

    def timed(self, info: dict[str, Any], before: Counters, steps: int) -> PointCompile:
        """The record of ``steps`` timed compiled steps since ``before`` (:func:`timed_compilation`)."""
        return timed_compilation(info, compiled.moved(before.dynamo, compiled.dynamo_state()),
                                 self.model().backend.calls - before.graph_calls, steps)

    def count(self, cache: str) -> CompiledTraffic:
        """``kv.traffic.<cache>.compiled``: a compiled step counted unfused and fused at the counted contexts (its
        own compiles, static shapes), or its ``mode`` and ``error`` when the class does not compile here."""
        session = self.session
        s = session.settings
        self.fused.pop(cache, None)  # a class counted again keeps only its latest line
        reason = self.unavailable_reason()
        if reason:
            return CompiledTraffic.of(mode=s.compile, error=reason)
        spec = caches.get(cache)
        if spec.point is not None:
            return CompiledTraffic.of(mode=s.compile,
                                      error=f"{cache} steps the model its own way (its own point): not compiled")
        self.setup()
        model, mspec = session.model()

        def open_point(m: Any, context: int) -> decode.DecodePoint:
            max_tokens = decode.tokens_needed(context, COUNT_WARMUP, 1)
            decode.check_memory(mspec, spec, session.device, max_tokens, session.batch.size)
            return decode.DecodePoint(m, mspec, spec, session.device, context, max_tokens, fill=s.fill,
                                      seed=s.seed, batch=session.batch).build()
        try:
            held = {c: session.held(c, c + COUNT_WARMUP + 1) for c in s.counted_contexts}
            counted = count_compiled(model, open_point, s.counted_contexts, s.compile, mspec.bytes_per_token,
                                     session.device.type, kv_bytes=held)
        except (compiled.CompileProblem, torch._dynamo.exc.BackendCompilerFailed, decode.PointSkip) as exc:
            return CompiledTraffic.of(mode=s.compile, error=f"{cache}: {exc}"[:400])
        if counted.fused is not None:
            self.fused[cache] = counted.fused
        return counted.record

    def fused_bytes(self, cache: str, tokens: float) -> float | None:
        """Fused bytes of one compiled step of ``cache`` with ``tokens`` in the cache, on the line through its
        counted contexts; None when the class was not counted here or has no fused count."""
        line = self.fused.get(cache)
        return line.at(tokens) if line is not None else None
