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
- *fused*: the bytes each kernel inductor generated (and each extern call) reads and writes, per scheduler
  node, from the loads and stores it really does (:func:`kernel_buffers`), summed over the graphs one step runs.
  Inductor's own ``GraphLowering.count_bytes()`` is not used as the figure: it also charges a node for its
  ordering-only dependencies (``WeakDep``: "B mutates what A read, so B runs after A"; the ``StarDep`` a mutation
  adds on the buffer it mutates), and it charges every dependency of a fused node the whole buffer. On a compiled
  StaticCache step the kernel that adds 1 to the int64 position counters (``cpp_fused_add_copy_…``) was charged
  the whole K and V buffers of its layer that way: one phantom pass (8.01 for 7.01 on the default model). Inductor's
  figure is kept beside it (``inductor_passes``). The per-node count runs where inductor computes its own (its
  ``count_bytes``, called by ``compile_fx`` when the ``inductor_metrics`` log artifact is enabled: the counting
  compiles enable it and wrap it). Checked on torch 2.13 (CPU, C++ backend) against the generated code
  (``tests/measuring/test_fused_kernels.py``); on a release where it cannot count the fused figure is reported
  missing with the reason, never zero.

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
        with _capturing(record), _kernel_counts() as counts:
            compiled = self.inductor(gm, example_inputs)
        record.kernels, record.error = counts.get("kernels", []), counts.get("error")
        if record.error is None and "kernels" not in counts:
            record.error = "inductor computed no byte count for this graph (GraphLowering.count_bytes did not run)"
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
class KernelBytes:
    """One scheduler node of a counting compile: a generated kernel or an extern call. ``buffers``: bytes it reads
    and writes per buffer (:func:`kernel_buffers`); ``origins``: the ATen ops inductor fused into it;
    ``inductor_bytes``: what inductor's own ``get_read_write_buffers_sizes()`` charges it (bytes)."""

    name: str
    buffers: dict[str, int]
    origins: tuple[str, ...] = ()
    inductor_bytes: int = 0

    @property
    def bytes(self) -> int:
        return sum(self.buffers.values())


@dataclass
class GraphRecord:
    """One graph compiled for counting: its post-grad graph and its kernels' bytes (or why they are missing)."""

    index: int
    post_grad: torch.fx.GraphModule | None = None
    kernels: list[KernelBytes] = field(default_factory=list)
    error: str | None = None

    @property
    def fused_bytes(self) -> int | None:
        """Bytes the graph's kernels read and write (None without a count)."""
        return None if self.error else sum(k.bytes for k in self.kernels)

    @property
    def inductor_bytes(self) -> int | None:
        """Inductor's own count of the same kernels (ordering-only dependencies included), bytes."""
        return None if self.error else sum(k.inductor_bytes for k in self.kernels)

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
def _kernel_counts() -> Iterator[dict[str, Any]]:
    """The bytes of every scheduler node of the graphs compiled inside (:class:`KernelBytes`, key ``kernels``), or
    ``error``: why they could not be counted. Counted inside inductor's own ``GraphLowering.count_bytes`` (wrapped
    for the duration), which ``compile_fx`` calls after code generation, with the graph's scheduler and size hints
    still live, when the ``inductor_metrics`` log artifact is on (switched on here, its messages going nowhere)."""
    from torch._inductor import compile_fx, graph

    log = getattr(compile_fx, "inductor_metrics_log", None)
    lowering = graph.GraphLowering
    out: dict[str, Any] = {}
    if log is None or not hasattr(lowering, "count_bytes"):
        out["error"] = "this torch release has no inductor byte count (GraphLowering.count_bytes) to count in"
        yield out
        return
    original = lowering.count_bytes

    def count_bytes(self: Any) -> Any:
        result = original(self)
        try:
            out.setdefault("kernels", []).extend(count_kernels(self.scheduler.nodes))
        except (AttributeError, TypeError, ValueError, KeyError, NotImplementedError, ImportError) as exc:
            out["error"] = f"could not count the kernels' bytes on torch {torch.__version__}: " \
                           f"{type(exc).__name__}: {exc}"[:300]
        return result

    level = log.level
    log.setLevel(logging.INFO)
    lowering.count_bytes = count_bytes
    try:
        yield out
    finally:
        lowering.count_bytes = original
        log.setLevel(level)


# --- fused bytes per kernel ------------------------------------------------------------------------------

def count_kernels(nodes: Any) -> list[KernelBytes]:
    """Every scheduler node of a graph (inductor's ``scheduler.nodes``, after code generation) with its bytes,
    origins and inductor's own figure. Needs the graph's lowering context (``V.graph``)."""
    return [KernelBytes(kernel_name(node), kernel_buffers(node), kernel_origins(node),
                        int(node.get_read_write_buffers_sizes())) for node in nodes]


def kernel_buffers(node: Any) -> dict[str, int]:
    """Bytes one scheduler node reads and writes, per buffer (keyed by storage: :func:`_by_storage`): what its
    kernel loads and stores, never what inductor orders it by.

    - Generated code (``SchedulerNode``, and ``FusedSchedulerNode`` of them): its ``MemoryDep`` reads and writes,
      each over the elements its index spans (``dep.get_numel()``), at most the node's iteration space (an indirect
      store of one token into a whole buffer is one token), summed per buffer and capped at the buffer's size. A
      fused node counts each subnode's accesses with that subnode's iteration space, leaves out the buffers that
      live only inside it, and counts a dependency two subnodes share once. A ``StarDep`` there is the ordering
      a mutation adds on the buffer it mutates (the store itself is the ``MemoryDep``): left out (so would be a
      ``bucketize``'s boundaries, the one load inductor records as a ``StarDep``; decode steps have none).
    - Extern calls (and templates): their inputs and outputs, whole, as inductor counts them.
    - Never a ``WeakDep`` (ordering only: "runs after the nodes that read what it mutates").
    - A node of a kind not listed: inductor's own accesses less the buffers it has only ordering dependencies on.
    """
    from torch._inductor import dependencies, ir, scheduler

    if isinstance(node, scheduler.NopKernelSchedulerNode):
        return {}
    group = list(node.get_nodes()) if hasattr(node, "get_nodes") else [node]
    generated = all(isinstance(sn, scheduler.SchedulerNode) and not sn.is_template() for sn in group)
    if not generated:
        if isinstance(node, scheduler.ExternKernelSchedulerNode) and isinstance(node.node, ir.MultiOutput):
            return {}  # its bytes are its parent call's outputs (as inductor counts them)
        ordering_only = _ordering_only_names(node, group)
        accesses = node.get_read_write_buffer_accesses(include_reads=True, include_writes=True)
        return _by_storage(node, {name: int(b) for name, b in accesses.items() if name not in ordering_only})
    kept = set(node.read_writes.reads) | set(node.read_writes.writes)
    inside = _fused_away(node, group)
    elements: dict[Any, int] = {}  # MemoryDep -> elements it touches
    for sn in group:
        ranges = sn.get_ranges()
        space = _hint(_product(ranges[0]) * _product(ranges[1]))
        for dep in (*sn.read_writes.reads, *sn.read_writes.writes):
            if not isinstance(dep, dependencies.MemoryDep) or dep not in kept or dep.name in inside:
                continue
            elements[dep] = max(elements.get(dep, 0), min(_hint(dep.get_numel()), space))
    per_buffer: dict[str, int] = {}
    for dep, n in elements.items():
        per_buffer[dep.name] = per_buffer.get(dep.name, 0) + n
    out = {}
    for name, n in per_buffer.items():
        size = _buffer_size(name)
        if size is not None:
            numel, itemsize = size
            out[name] = min(n, numel) * itemsize
    return _by_storage(node, out)


def _by_storage(node: Any, buffers: dict[str, int]) -> dict[str, int]:
    """Bytes per buffer keyed by the buffer a mutation writes into (``buf3`` that stores into ``arg2_1``: ``arg2_1``,
    the name the generated code's call passes), summed where two names are one storage."""
    real = getattr(getattr(node, "scheduler", None), "mutation_real_name", None) or {}
    out: dict[str, int] = {}
    for name, n in buffers.items():
        out[real.get(name, name)] = out.get(real.get(name, name), 0) + n
    return out


def _ordering_only_names(node: Any, group: list[Any]) -> set[str]:
    """Buffers a node depends on only for ordering: ``WeakDep`` anywhere, ``StarDep`` in generated code."""
    from torch._inductor import dependencies, scheduler

    real, ordering = set(), set()
    for sn in group:
        code = isinstance(sn, scheduler.SchedulerNode) and not sn.is_template()
        for dep in (*sn.read_writes.reads, *sn.read_writes.writes):
            weak = isinstance(dep, dependencies.WeakDep) or (code and isinstance(dep, dependencies.StarDep))
            (ordering if weak else real).add(dep.name)
    return ordering - real


def _fused_away(node: Any, group: list[Any]) -> set[str]:
    """Buffers written inside a fused node and read only inside it: never materialised (inductor's rule)."""
    if len(group) < 2:
        return set()
    members = {id(sn) for sn in group}
    written = {dep.name for sn in group for dep in sn.read_writes.writes}
    out = set()
    for name in written:
        buf = node.scheduler.name_to_buf.get(name)
        if buf is not None and all(id(user.node) in members for user in buf.users):
            out.add(name)
    return out


def _buffer_size(name: str) -> tuple[int, int] | None:
    """(elements, bytes per element) of a buffer or graph input of the graph being lowered; None when not one."""
    from torch._inductor.utils import get_dtype_size
    from torch._inductor.virtualized import V

    buf = V.graph.name_to_buffer.get(name)
    if buf is None:
        buf = V.graph.graph_inputs.get(name)
    if buf is None or not hasattr(buf, "get_size"):
        return None
    try:
        return _hint(_product(buf.get_size())), get_dtype_size(buf.get_dtype())
    except NotImplementedError:  # a layout without a size (NoneLayout, MultiOutputLayout)
        return None


def _product(sizes: Any) -> Any:
    from torch._inductor.utils import sympy_product

    return sympy_product(sizes)


def _hint(expr: Any) -> int:
    """A size as an integer (the example sizes of the graph being lowered)."""
    from torch._inductor.virtualized import V

    sizevars = V.graph.sizevars
    hint = getattr(sizevars, "optimization_hint", None) or sizevars.size_hint
    return int(hint(expr, fallback=0))


def kernel_origins(node: Any) -> tuple[str, ...]:
    """The ATen ops inductor fused into a scheduler node: its FX origins, each by the op it came from before
    decomposition (``meta["original_aten"]``, what inductor names its kernels by) or its own target."""
    ops = set()
    for sn in (node.get_nodes() if hasattr(node, "get_nodes") else [node]):
        for origin in getattr(getattr(sn, "node", None), "origins", None) or ():
            if getattr(origin, "op", None) != "call_function":
                continue
            target = (getattr(origin, "meta", None) or {}).get("original_aten") or origin.target
            if hasattr(target, "overloadpacket"):
                ops.add(traffic.op_name(target))
    return tuple(sorted(ops))


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


def count_compiled(model: Any, open_point: Any, contexts: tuple[int, ...], mode: str, bytes_per_token: int,
                   device_type: str, kv_bytes: dict[int, float] | None = None) -> dict[str, Any]:
    """``kv.traffic.<cache>.compiled``: unfused and fused counted passes of a compiled step between two
    contexts, kernels and graphs per step. ``open_point(model, context)`` -> a filled DecodePoint; ``kv_bytes``
    {context: logical KV bytes held at the counted step} (a batch's sequences together), else context x
    ``bytes_per_token``.

    ``fused``: ``passes`` (bytes the step's kernels read and write, :func:`kernel_buffers`, per KV byte),
    ``by_kernel`` {kernel name: passes} (kernels of one name together; those under 0.005 left out),
    ``origins`` {kernel name: the ATen ops inductor fused into it}, ``step_bytes`` {context: bytes of the step},
    ``inductor_passes`` (inductor's own ``count_bytes`` of the same kernels, ordering-only dependencies included:
    for reference, never judged)."""
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
        out["fused"] = {"passes": None, "error": steps[lo].error or steps[hi].error or "no fused byte count"}
        return out
    by_kernel = {}
    for name in set(steps[lo].kernels) | set(steps[hi].kernels):
        passes = (steps[hi].kernels.get(name, 0) - steps[lo].kernels.get(name, 0)) / kv_delta
        if abs(passes) >= 0.005:
            by_kernel[name] = round(passes, 4)
    by_kernel = dict(sorted(by_kernel.items(), key=lambda kv: (-abs(kv[1]), kv[0])))
    origins = {name: sorted(steps[lo].origins.get(name, set()) | steps[hi].origins.get(name, set()))
               for name in by_kernel}
    out["fused"] = {
        "passes": (steps[hi].fused_bytes - steps[lo].fused_bytes) / kv_delta,
        "by_kernel": by_kernel,
        "origins": origins,
        "step_bytes": {str(c): s.fused_bytes for c, s in steps.items()},
    }
    if steps[lo].inductor_bytes is not None and steps[hi].inductor_bytes is not None:
        out["fused"]["inductor_passes"] = (steps[hi].inductor_bytes - steps[lo].inductor_bytes) / kv_delta
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
