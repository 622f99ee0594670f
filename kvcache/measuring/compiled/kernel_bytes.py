"""Fused bytes per kernel: what each kernel inductor generated (and each extern call) reads and writes, per scheduler
node, from the loads and stores it really does (:func:`kernel_buffers`), not inductor's own ``count_bytes()`` (kept
beside it as ``inductor_bytes``: it also charges ordering-only dependencies). Counted where inductor counts its own
(:func:`kernel_counts`); a release where it cannot count reports why, never zero bytes (docs/compiled.md)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from kvcache.measuring.counting import traffic


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


@contextlib.contextmanager
def kernel_counts() -> Iterator[dict[str, Any]]:
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
            target = origin.meta.get("original_aten") or origin.target
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


