"""The counted traffic of a compiled step (``kv.traffic.<cache>.compiled``), two ways, each from its own compile with
static shapes at each counted context: *unfused* (inductor's post-grad FX graph run as plain ATen ops under the
traffic counter) and *fused* (the bytes each generated kernel reads and writes, :mod:`.kernel_bytes`). Counting
compiles bypass inductor's FX-graph and AOT-autograd caches (a hit would skip the capture). docs/compiled.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kvcache.analysing.options import MIN_OP_PASSES
from kvcache.analysing.records.counted import CompiledTraffic, FusedCount
from kvcache.measuring.compiled.forward import (
    CompiledModel,
    CompileProblem,
    compile_problem,
    compiling_steps,
    effective_mode,
    mark_static,
)
from kvcache.measuring.counting import traffic
from kvcache.measuring.counting.class_count import (
    COUNT_WARMUP,  # eager steps before the counted compiled one
)


@dataclass
class CountedStep:
    """One compiled step counted: its unfused traffic, its kernels' bytes (``fused_bytes``, or ``error``), graphs and
    kernels it ran, and the seconds its compile took."""

    unfused: traffic.TrafficCount
    fused_bytes: int | None
    kernels: dict[str, int]  # kernel name -> bytes (the step's kernels of that name together)
    kernel_count: int
    graphs: int
    compile_s: float
    origins: dict[str, set[str]] = field(default_factory=dict)  # kernel name -> ATen ops fused into it
    inductor_bytes: int | None = None  # inductor's own count_bytes of the same kernels
    error: str | None = None  # why there is no fused count


def count_step(model: Any, open_point: Any, mode: str) -> CountedStep:
    """One compiled step counted both ways. ``open_point(model)`` returns a filled DecodePoint on ``model``; it
    is warmed up eagerly (lazy initialisation), then one step runs through a fresh compile with static shapes
    (``dynamic=False``: the graph is compiled for exactly this step's sizes, in this step), counted."""
    compiled = CompiledModel(model, mode, capture=True, dynamic=False)
    dp = open_point(model)
    try:
        dp.warm_up(COUNT_WARMUP)
        mark_static(dp.cache, dp.spec.layers)
        dp.model = compiled
        backend = compiled.backend
        counter = traffic.TrafficCounter()
        backend.counting, backend.ran = counter, []
        try:
            with compiling_steps() as step:
                dp.step()
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.FailOnRecompileLimitHit) as exc:
            raise CompileProblem(compile_problem(exc)) from None
        finally:
            backend.counting = None
        graphs = [backend.graphs[i] for i in backend.ran]
        if not graphs:
            raise CompileProblem("the counted step ran no compiled graph (dynamo skipped the frame)")
        error = next((g.error for g in graphs if g.error), None)
        kernels: dict[str, int] = {}
        origins: dict[str, set[str]] = {}
        for g in graphs:
            for k in g.kernels:
                kernels[k.name] = kernels.get(k.name, 0) + k.bytes
                origins.setdefault(k.name, set()).update(k.origins)
        return CountedStep(unfused=counter.count, fused_bytes=None if error else sum(g.fused_bytes for g in graphs),
                           kernels=kernels, kernel_count=sum(len(g.kernels) for g in graphs), graphs=len(graphs),
                           compile_s=step["seconds"], origins=origins,
                           inductor_bytes=None if error else sum(g.inductor_bytes for g in graphs), error=error)
    finally:
        dp.release()


@dataclass(frozen=True)
class FusedLine:
    """Fused bytes of one compiled step against the tokens in its cache: the line through the two smallest counted
    contexts (exact for these graphs: their bytes grow linearly with the cache)."""

    contexts: tuple[int, int]
    step_bytes: tuple[int, int]

    def at(self, tokens: float) -> float:
        """Bytes of one compiled step with ``tokens`` in the cache."""
        (c0, c1), (b0, b1) = self.contexts, self.step_bytes
        return b0 + (b1 - b0) * (tokens - c0) / (c1 - c0)


@dataclass
class CompiledCount:
    """A class's compiled step counted: ``record`` is ``kv.traffic.<cache>.compiled``; ``fused`` the line its fused
    bytes lie on (None without a fused count)."""

    record: CompiledTraffic
    fused: FusedLine | None = None


def count_compiled(model: Any, open_point: Any, contexts: tuple[int, ...], mode: str, bytes_per_token: int,
                   device_type: str, kv_bytes: dict[int, float] | None = None) -> CompiledCount:
    """``kv.traffic.<cache>.compiled`` (:attr:`CompiledCount.record`): unfused and fused counted passes of a compiled
    step between two contexts, kernels and graphs per step; and the line its fused bytes lie on.
    ``open_point(model, context)`` -> a filled DecodePoint; ``kv_bytes`` {context: logical KV bytes held at the
    counted step} (a batch's sequences together), else context x ``bytes_per_token``.

    ``fused``: ``passes`` (bytes the step's kernels read and write per KV byte:
    :func:`kvcache.measuring.compiled.kernel_bytes.kernel_buffers`), ``by_kernel`` {kernel name: passes} (kernels of one
    name together; those under ``MIN_OP_PASSES`` left out), ``origins`` {kernel name: the ATen ops inductor fused
    into it}, ``step_bytes`` {context: bytes of the step}, ``inductor_passes`` (inductor's own ``count_bytes`` of the
    same kernels, ordering-only dependencies included: for reference, never judged)."""
    steps = {c: count_step(model, lambda m, c=c: open_point(m, c), mode) for c in contexts}
    lo, hi = min(contexts), max(contexts)
    held = kv_bytes or {c: c * bytes_per_token for c in contexts}
    kv_delta = held[hi] - held[lo]
    unfused = traffic.counted_passes({c: s.unfused for c, s in steps.items()}, bytes_per_token, kv_bytes=held)
    record = CompiledTraffic.of(
        mode=mode, runs_as=effective_mode(mode, device_type), fullgraph=True, unfused=unfused,
        kernels_per_step=steps[hi].kernel_count, graphs_per_step=steps[hi].graphs,
        compile_s=round(sum(s.compile_s for s in steps.values()), 3))
    if steps[lo].fused_bytes is None or steps[hi].fused_bytes is None:
        record.update(fused=FusedCount.of(passes=None,
                                          error=steps[lo].error or steps[hi].error or "no fused byte count"))
        return CompiledCount(record)
    by_kernel = {}
    for name in set(steps[lo].kernels) | set(steps[hi].kernels):
        passes = (steps[hi].kernels.get(name, 0) - steps[lo].kernels.get(name, 0)) / kv_delta
        if abs(passes) >= MIN_OP_PASSES:
            by_kernel[name] = round(passes, 4)
    by_kernel = dict(sorted(by_kernel.items(), key=lambda kv: (-abs(kv[1]), kv[0])))
    origins = {name: sorted(steps[lo].origins.get(name, set()) | steps[hi].origins.get(name, set()))
               for name in by_kernel}
    inductor = {}
    if steps[lo].inductor_bytes is not None and steps[hi].inductor_bytes is not None:
        inductor["inductor_passes"] = (steps[hi].inductor_bytes - steps[lo].inductor_bytes) / kv_delta
    record.update(fused=FusedCount.of(passes=(steps[hi].fused_bytes - steps[lo].fused_bytes) / kv_delta,
                                      by_kernel=by_kernel, origins=origins,
                                      step_bytes={str(c): s.fused_bytes for c, s in steps.items()}, **inductor))
    two = sorted(contexts)[:2]
    line = FusedLine((two[0], two[1]), (steps[two[0]].fused_bytes, steps[two[1]].fused_bytes))
    return CompiledCount(record, line)
