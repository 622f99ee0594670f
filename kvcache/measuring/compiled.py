"""Compiled decode (``--kv-compile``): the decode forward under ``torch.compile``, timed and counted.

**How it compiles.** The way Transformers users compile decode themselves: ``torch.compile(model.forward,
fullgraph=True)`` with inductor in the chosen mode, called in place of the module (:class:`CompiledModel`: the
same weights, the forward compiled). Tensors of caches that keep their buffers from step to step
(``cache.is_compileable``: StaticCache and kin) are marked as static addresses
(``torch._dynamo.mark_static_address``; Transformers' StaticLayer already does it, this covers custom classes).

- ``default`` and ``max-autotune`` run on every device; on a CPU inductor skips the CUDA graphs of
  ``max-autotune``, so what runs there is ``max-autotune-no-cudagraphs``.
- ``reduce-overhead`` *is* CUDA graphs: on a device other than CUDA its points are skipped with that reason
  (inductor would skip the graphs and run the default mode under another name).
- ``fullgraph=True`` always: a class whose step breaks the graph fails to compile, and its points are skipped
  with dynamo's reason (a compiled run that silently runs in pieces is what this mode exists to catch).

**Contexts: one dynamic graph per class.** ``dynamic=None`` (torch.compile's default, what users get): dynamo
specialises the first shapes it sees and, at the first change, recompiles with the changing sizes symbolic
(automatic dynamic shapes). A DynamicCache changes length every step, a StaticCache only between points (its
buffer is sized to the context). So that every timed point of a class runs the *same* graph, the first timed
point of a class first runs untimed steps at two small contexts (:data:`SETTLE_CONTEXTS`): the specialised
graph and the dynamic one are both compiled there, and no timed point is the odd one out on a specialised graph.
Cost: two compiles per class per session (the second is shorter: inductor's caches are warm), then none.
The alternative, one specialised graph per context (``dynamic=False``), compiles every (class, context), costs
7× the compile time on the default sweep, and recompiles a DynamicCache at every step.

**Compile time and recompiles.** Compilation happens in a point's untimed preparation; its seconds (wall time of
the steps during which dynamo compiled) are reported per point. Dynamo's counters
(``torch._dynamo.utils.counters``: graphs compiled, graph breaks) are snapshotted around the timed steps: any
compile there is a recompile inside the timed steps, and that point's timed figure is inconclusive with the
reason. Every compiled graph's runs are counted by the backend wrapper (one integer increment per graph call),
so a point also proves it ran compiled: ``graph_calls_per_step`` is 0 for a step that ran eagerly. The
recompile limit (``torch._dynamo.config.recompile_limit``, 8 per code object, shared by every class and by the
counting compiles) is raised to what the session needs, and hitting it raises instead of silently falling back
to eager (``fail_on_recompile_limit_hit``).

**Counted traffic of a compiled step, two ways** (:func:`count_compiled`), each from its own compile with
static shapes at each counted context (a dynamic graph's byte counts are taken at its example sizes only):

- *unfused*: the post-grad FX graph that inductor lowers (captured by a ``post_grad_custom_post_pass``) is run
  as plain ATen ops with the step's real inputs under :class:`kvcache.measuring.traffic.TrafficCounter`: the
  suite's own rules, per ATen op;
- *fused*: inductor's own estimate of the bytes each generated kernel (and extern call) reads and writes,
  ``GraphLowering.count_bytes()``, which ``compile_fx`` adds to ``torch._inductor.metrics.num_bytes_accessed``
  (and ``nodes_num_elem`` per scheduler node) when the ``inductor_metrics`` log artifact is enabled; summed over
  the graphs one step runs. Checked on torch 2.13 (CPU, C++ backend); ``metrics.num_bytes_accessed`` exists
  since torch 2.0 but is filled only under that log artifact in recent releases (2.6 and later). On a release
  without it the fused figure is reported missing with the reason, never zero.

The capture pass has no ``uuid``, so inductor's FX-graph and AOT-autograd caches are bypassed for counting
compiles (a cache hit would skip both the pass and the byte count); compiled kernels still come from the
on-disk code cache.

**The trap.** A ``TorchDispatchMode`` active when dynamo meets a frame makes dynamo skip it, and can leave a
"compiled" run eager. Here no dispatch mode is ever active while a compiled frame is entered: the eager counted
traffic, the probe and the per-point counts run on the eager model (never through a compiled wrapper), and the
unfused count enters its counter inside the backend's graph call, after dynamo has dispatched the frame. A
test counts everything first and then checks that the timed steps ran compiled.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kvcache.measuring import compat, traffic

MODES = ("off", "default", "reduce-overhead", "max-autotune")
SETTLE_CONTEXTS = (64, 96)  # untimed contexts a class compiles at before its first timed point
SETTLE_STEPS = 2
COUNT_WARMUP = 2  # eager steps before a counted compiled one (lazy initialisation)


class CompileProblem(Exception):
    """A class that cannot be compiled here (graph break, recompile limit, backend error); one-line message."""


def unavailable_reason(mode: str, device_type: str) -> str | None:
    """Why ``mode`` cannot run on ``device_type``, or None."""
    if mode == "reduce-overhead" and device_type != "cuda":
        return (f"--kv-compile reduce-overhead is CUDA graphs, which inductor does not use on {device_type} (it "
                "would run the default mode under another name); use --kv-compile default")
    return None


def effective_mode(mode: str, device_type: str) -> str:
    """What inductor runs for ``mode`` on ``device_type`` (CUDA graphs are CUDA only)."""
    if mode == "max-autotune" and device_type != "cuda":
        return "max-autotune-no-cudagraphs"
    return mode


def configure(graphs_needed: int) -> None:
    """Room for every graph the session compiles on the one forward code object, and a loud failure beyond."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), graphs_needed))
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * graphs_needed)
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


def mark_static(cache: Any, layers: int) -> int:
    """Mark the K/V tensors of a cache that keeps its buffers (``is_compileable``) as static addresses; how many."""
    if not getattr(cache, "is_compileable", False):
        return 0
    marked = 0
    for layer in range(layers):
        try:
            tensors = compat.layer_kv(cache, layer)
        except (AttributeError, IndexError, KeyError, TypeError):
            break
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.numel():
                torch._dynamo.mark_static_address(t)
                marked += 1
    return marked


# --- dynamo's counters ---------------------------------------------------------------------------------

def dynamo_state() -> dict[str, int]:
    """Dynamo's counters that move when it compiles: graphs compiled, graph breaks, frames converted."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "frames": int(sum(v for k, v in counters["frames"].items() if k == "ok"))}


def moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


# --- the timed model -------------------------------------------------------------------------------------

class CountingBackend:
    """Inductor in ``mode`` (``torch.compile``'s own wrapper, the same config patches), with every compiled
    graph's calls counted. ``capture`` (counting compiles only) also keeps each graph's post-grad FX graph and
    inductor's byte count, and runs the graph unfused under a traffic counter when :attr:`counting` is set."""

    def __init__(self, mode: str, *, capture: bool = False) -> None:
        self.mode = mode
        self.inductor = torch._TorchCompileInductorWrapper(None if mode == "default" else mode, None, None)
        self.capture = capture
        self.calls = 0
        self.graphs: list[GraphRecord] = []
        self.counting: traffic.TrafficCounter | None = None
        self.ran: list[int] = []  # indices of the graphs run while counting

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if not self.capture:
            compiled = self.inductor(gm, example_inputs)

            def run(*args: Any) -> Any:
                self.calls += 1
                return compiled(*args)
            return run
        record = GraphRecord(index=len(self.graphs))
        with _capturing(record), _inductor_metrics() as metrics:
            compiled = self.inductor(gm, example_inputs)
        record.fused_bytes, record.kernels = metrics.get("bytes"), metrics.get("kernels", [])
        self.graphs.append(record)

        def run_counted(*args: Any) -> Any:
            self.calls += 1
            if self.counting is None:
                return compiled(*args)
            self.ran.append(record.index)
            record.run_unfused(self.counting, args)
            return compiled(*args)
        return run_counted


@dataclass
class GraphRecord:
    """One graph compiled for counting: its post-grad graph, inductor's bytes and kernels (name, bytes)."""

    index: int
    post_grad: torch.fx.GraphModule | None = None
    fused_bytes: int | None = None
    kernels: list[tuple[str, int]] = field(default_factory=list)

    def run_unfused(self, counter: traffic.TrafficCounter, args: tuple) -> None:
        """The post-grad graph as plain ATen ops under ``counter``, on copies of the step's real inputs (the
        graph mutates the cache; the compiled graph then runs on the originals). The counter is entered inside
        the graph call: dynamo has already dispatched the frame, so it never sees the mode."""
        if self.post_grad is None:
            raise CompileProblem("inductor's post-grad graph was not captured (its custom pass did not run)")
        placeholders = [n for n in self.post_grad.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(args):
            raise CompileProblem(f"the post-grad graph takes {len(placeholders)} inputs, the compiled graph got "
                                 f"{len(args)}: cannot run it unfused")
        inputs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        with torch.inference_mode(), counter:
            self.post_grad(*inputs)


class CompiledModel:
    """The model with its forward compiled: calls go to ``torch.compile(model.forward, ...)``, everything else
    (config, parameters, submodules) to the model itself. Eager uses of the model never enter dynamo."""

    def __init__(self, model: Any, mode: str, *, capture: bool = False, dynamic: bool | None = None) -> None:
        self.eager = model
        self.backend = CountingBackend(mode, capture=capture)
        self.forward = torch.compile(model.forward, backend=self.backend, fullgraph=True, dynamic=dynamic)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.eager, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)


def compile_problem(exc: BaseException) -> str:
    """One line for a failed compile (graph break, recompile limit, backend error)."""
    kind = type(exc).__name__
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    if "graph break" in str(exc).lower() or kind == "Unsupported":
        return f"does not compile with fullgraph=True (graph break): {kind}: {first}"[:400]
    return f"compile failed: {kind}: {first}"[:400]


@contextlib.contextmanager
def compiling_steps() -> Iterator[dict[str, Any]]:
    """Wall time and dynamo's counter movement of the steps run inside (``seconds``, ``moved``)."""
    before, start = dynamo_state(), time.perf_counter()
    out: dict[str, Any] = {}
    try:
        yield out
    finally:
        out["seconds"] = time.perf_counter() - start
        out["moved"] = moved(before, dynamo_state())


# --- counting compiles ----------------------------------------------------------------------------------

class _CapturePass:
    """``post_grad_custom_post_pass``: a copy of the post-grad graph inductor goes on to lower."""

    def __init__(self, record: GraphRecord) -> None:
        self.record = record

    def __call__(self, graph: torch.fx.Graph) -> None:
        owner = graph.owning_module
        self.record.post_grad = torch.fx.GraphModule(owner, copy.deepcopy(graph))

    def uuid(self) -> None:  # no uuid: inductor's FX-graph and AOT caches are bypassed (a hit would skip the pass)
        return None


def _pass_type() -> type:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return type("KVCapturePass", (_CapturePass, CustomGraphPass), {})


@contextlib.contextmanager
def _capturing(record: GraphRecord) -> Iterator[None]:
    from torch._inductor import config

    with config.patch(post_grad_custom_post_pass=_pass_type()(record)):
        yield


@contextlib.contextmanager
def _inductor_metrics() -> Iterator[dict[str, Any]]:
    """Inductor's ``count_bytes`` of the graphs compiled inside (the ``inductor_metrics`` log artifact on,
    its messages going nowhere): ``bytes`` (None when this release records none) and ``kernels`` [(name, bytes)]."""
    from torch._inductor import compile_fx, metrics

    log = getattr(compile_fx, "inductor_metrics_log", None)
    out: dict[str, Any] = {}
    if log is None or not hasattr(metrics, "num_bytes_accessed"):
        yield out
        return
    level, before, nodes_before = log.level, metrics.num_bytes_accessed, len(metrics.nodes_num_elem)
    log.setLevel(logging.INFO)
    try:
        yield out
    finally:
        log.setLevel(level)
    nodes = metrics.nodes_num_elem[nodes_before:]
    if nodes or metrics.num_bytes_accessed != before:
        out["bytes"] = metrics.num_bytes_accessed - before
        out["kernels"] = [(kernel_name(node), 4 * int(elems)) for node, elems in nodes]


# Ops that only reshape or relabel: left out of a kernel's name when it also computes something.
SHAPE_OPS = {"view", "reshape", "expand", "permute", "unsqueeze", "squeeze", "slice", "select", "transpose", "t",
             "as_strided", "alias", "unsafe_view", "_unsafe_view", "iota", "full", "arange"}


def kernel_name(node: Any) -> str:
    """A scheduler node named stably across contexts: an extern call by its ATen op
    (``extern scaled_dot_product_attention``), a generated kernel by the ATen ops whose buffers it computes
    (``kernel clone``, ``kernel add+copy_``)."""
    inner = getattr(node, "node", None)
    overload = getattr(inner, "op_overload", None)
    if overload is not None and hasattr(overload, "overloadpacket"):
        return f"extern {traffic.op_name(overload)}"
    if inner is not None and ("Extern" in type(inner).__name__ or "Fallback" in type(inner).__name__):
        return f"extern {getattr(inner, 'python_kernel_name', None) or type(inner).__name__}"
    ops: set[str] = set()
    for snode in (node.get_nodes() if hasattr(node, "get_nodes") else [node]):
        buffer = getattr(snode, "node", None)
        origin = getattr(buffer, "origin_node", None)
        targets = [getattr(origin, "target", None)] if origin is not None else \
            [getattr(o, "target", None) for o in getattr(buffer, "origins", ()) or ()]
        ops.update(traffic.op_name(t) for t in targets if hasattr(t, "overloadpacket"))
    data_ops = sorted(ops - SHAPE_OPS) or sorted(ops)
    named = "+".join(data_ops[:4]) + ("+..." if len(data_ops) > 4 else "")
    return f"kernel {named or type(inner).__name__}"


@dataclass
class CountedStep:
    unfused: traffic.TrafficCount
    fused_bytes: int | None
    kernels: dict[str, int]
    kernel_count: int
    graphs: int
    compile_s: float


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
        fused = None if any(g.fused_bytes is None for g in graphs) else sum(g.fused_bytes for g in graphs)
        kernels: dict[str, int] = {}
        for g in graphs:
            for name, nbytes in g.kernels:
                kernels[name] = kernels.get(name, 0) + nbytes
        return CountedStep(unfused=counter.count, fused_bytes=fused, kernels=kernels,
                           kernel_count=sum(len(g.kernels) for g in graphs), graphs=len(graphs),
                           compile_s=step["seconds"])
    finally:
        dp.release()


def count_compiled(model: Any, open_point: Any, contexts: tuple[int, ...], mode: str, bytes_per_token: int,
                   device_type: str, kv_bytes: dict[int, float] | None = None) -> dict[str, Any]:
    """``kv.traffic.<cache>.compiled``: unfused and fused counted passes of a compiled step between two
    contexts, kernels and graphs per step. ``open_point(model, context)`` -> a filled DecodePoint; ``kv_bytes``
    {context: logical KV bytes held at the counted step} (a batch's sequences together), else context x
    ``bytes_per_token``."""
    steps = {c: count_step(model, lambda m, c=c: open_point(m, c), mode) for c in contexts}
    lo, hi = min(contexts), max(contexts)
    held = kv_bytes or {c: c * bytes_per_token for c in contexts}
    kv_delta = held[hi] - held[lo]
    unfused = traffic.counted_passes({c: s.unfused for c, s in steps.items()}, bytes_per_token, kv_bytes=held)
    out: dict[str, Any] = {
        "mode": mode, "runs_as": effective_mode(mode, device_type), "fullgraph": True,
        "unfused": unfused,
        "kernels_per_step": steps[hi].kernel_count, "graphs_per_step": steps[hi].graphs,
        "compile_s": round(sum(s.compile_s for s in steps.values()), 3),
    }
    if steps[lo].fused_bytes is None or steps[hi].fused_bytes is None:
        out["fused"] = {"passes": None, "error": "this torch release records no inductor byte count "
                                                 "(torch._inductor.metrics.num_bytes_accessed)"}
        return out
    by_kernel = {}
    for name in set(steps[lo].kernels) | set(steps[hi].kernels):
        passes = (steps[hi].kernels.get(name, 0) - steps[lo].kernels.get(name, 0)) / kv_delta
        if abs(passes) >= 0.005:
            by_kernel[name] = round(passes, 4)
    out["fused"] = {
        "passes": (steps[hi].fused_bytes - steps[lo].fused_bytes) / kv_delta,
        "by_kernel": dict(sorted(by_kernel.items(), key=lambda kv: -abs(kv[1]))),
        "step_bytes": {str(c): s.fused_bytes for c, s in steps.items()},
    }
    return out


def fused_bytes_at(compiled_traffic: dict[str, Any] | None, tokens: float) -> float | None:
    """Fused bytes of one compiled step with ``tokens`` in the cache, on the line through the two counted
    contexts (exact for these graphs: bytes grow linearly with the cache); None without a fused count."""
    fused = (compiled_traffic or {}).get("fused") or {}
    step = fused.get("step_bytes") or {}
    if fused.get("passes") is None or len(step) < 2:
        return None
    (c0, b0), (c1, b1) = sorted((int(c), b) for c, b in step.items())[:2]
    return b0 + (b1 - b0) * (tokens - c0) / (c1 - c0)
