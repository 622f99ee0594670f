"""Counted traffic: the bytes each tensor operation of one decode step reads and writes.

Every ATen operation the step runs is intercepted at torch's dispatch level
(:class:`torch.utils._python_dispatch.TorchDispatchMode`; no source is patched) and charged by these
rules, which count *logical* traffic:

1. A view (view, expand, slice, transpose, reshape of a viewable tensor, detach, ...: an output that
   shares storage with an input, written by nothing) moves nothing.
2. A write into part of a tensor (``copy_`` into a slice, ``index_copy_``, ``index_put_``,
   ``slice_scatter_``-style in-place ops listed in ``PARTIAL_WRITES``) reads its sources and writes
   only the elements it stores, not the whole destination, and does not read the destination.
3. A broadcast input (stride 0 along a dimension) is read once: an input costs the bytes of the
   distinct memory it spans, ``itemsize × Π size[d] over dims with stride[d] != 0``.
4. A lookup (``embedding``, ``index_select``, advanced indexing ``index``) reads its indices and the rows it
   selects, not the whole table: a decode step's embedding reads one row of the vocabulary matrix, and a paged
   cache's gather of the live rows reads those rows, not the whole block pool.
5. Any other op reads each distinct tensor input once and writes each output (an in-place op writes
   the tensor it mutates); allocation without initialisation (``empty``) writes nothing.

Scopes: a counter given modules (``scopes={module: label}``) also charges each op to the label of every
module whose ``forward`` is running when the op is dispatched (``"forward"`` for the model's own call,
``"layer.3"`` for a decoder layer), so that one count answers both "the whole step" and "inside the
model's forward" or "inside layer 3".

Logical traffic is what the operations ask for, not what the hardware does: a fused kernel that
re-reads data internally (attention tiles, cache misses) is counted once, and data served from caches
is counted as if it came from memory. Counted passes are therefore a floor that the timed passes sit
on top of; both are bytes moved (read + write), not bytes stored.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

NO_TRAFFIC = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_local_scalar_dense",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_nonzero", "record_stream",
    "set_", "resize_", "_has_compatible_shallow_copy_type", "lift_fresh",
}

# In-place ops that store into a part of their first argument: (name, index of the source argument or
# None when the written elements come from a scalar).
PARTIAL_WRITES = {"copy_", "index_copy_", "index_put_", "_index_put_impl_", "masked_scatter_", "scatter_",
                  "index_fill_", "masked_fill_", "fill_", "zero_", "slice_scatter_"}

DISPLAY = {
    "_scaled_dot_product_flash_attention_for_cpu": "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention": "scaled_dot_product_attention",
    "_scaled_dot_product_efficient_attention": "scaled_dot_product_attention",
    "_scaled_dot_product_cudnn_attention": "scaled_dot_product_attention",
    "_scaled_dot_product_attention_math": "scaled_dot_product_attention",
    "_scaled_dot_product_fused_attention_overrideable": "scaled_dot_product_attention",
    "_scaled_dot_product_attention_math_for_mps": "scaled_dot_product_attention",
    "_fused_sdp_choice": "scaled_dot_product_attention",
}


def op_name(func: Any) -> str:
    """``aten.cat.default`` -> ``cat``; the fused SDPA kernels of every device -> ``scaled_dot_product_attention``."""
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    return DISPLAY.get(name, name)


def span_bytes(t: torch.Tensor) -> int:
    """Bytes of distinct memory a (possibly strided or broadcast) tensor covers: stride-0 dims count once."""
    if t.numel() == 0:
        return 0
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def _storage_key(t: torch.Tensor) -> tuple:
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        ptr = id(t)
    return (ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.untyped_storage().nbytes() > 0
    except (RuntimeError, NotImplementedError):
        return False


def _tensors(obj: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(obj)
    return [x for x in flat if isinstance(x, torch.Tensor)]


def _distinct_read(tensors: list[torch.Tensor]) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = _storage_key(t)
        if key not in seen:
            seen.add(key)
            total += span_bytes(t)
    return total


def _mutated_args(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Tensors the op writes in place (schema arguments annotated as written, e.g. ``Tensor(a!)``)."""
    out = []
    schema = func._schema
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            out.extend(_tensors(value))
    return out


def _index_put_elements(dst: torch.Tensor, indices: list) -> int:
    """Elements ``dst.index_put_(indices, values)`` stores: a dimension indexed by None (a ``:`` in
    ``dst[:, :, idx] = v``) counts whole, a boolean mask selects its true elements over the dimensions it
    covers, integer indices broadcast together, and the dimensions after the indexed ones count whole."""
    elements, dim, index_shapes = 1, 0, []
    for index in indices:
        if index is None:
            elements *= dst.shape[dim]
            dim += 1
        elif index.dtype in (torch.bool, torch.uint8):
            index_shapes.append((int(index.count_nonzero()),))
            dim += index.dim()
        else:
            index_shapes.append(tuple(index.shape))
            dim += 1
    if index_shapes:
        for size in torch.broadcast_shapes(*index_shapes):
            elements *= size
    for size in dst.shape[dim:]:
        elements *= size
    return elements


def _partial_write(name: str, args: tuple, kwargs: dict) -> tuple[int, int]:
    """(read, written) bytes of an in-place write into part of ``args[0]`` (rule 2)."""
    dst = args[0]
    es = dst.element_size()
    if name == "copy_":
        return _distinct_read([args[1]]), dst.numel() * es
    if name == "index_copy_":
        src, index = args[3], args[2]
        return span_bytes(src) + span_bytes(index), src.numel() * es
    if name in ("index_put_", "_index_put_impl_"):
        indices = [i for i in args[1] if i is not None]
        values = args[2]
        return span_bytes(values) + sum(span_bytes(i) for i in indices), _index_put_elements(dst, args[1]) * es
    if name in ("fill_", "zero_"):
        return sum(span_bytes(t) for t in _tensors(args[1:])), dst.numel() * es
    # masked_fill_, index_fill_, scatter_, masked_scatter_, slice_scatter_: sources + the written part
    sources = _tensors(args[1:]) + _tensors(kwargs)
    read = _distinct_read(sources)
    biggest = max((t.numel() for t in sources), default=dst.numel())
    return read, min(biggest, dst.numel()) * es


# Lookups: the position of the indices argument (rule 4).
LOOKUPS = {"embedding": 1, "index_select": 2, "index": 1}  # op -> position of its indices (a list for ``index``)


@dataclass
class OpTraffic:
    """Bytes one op name read and wrote over a counted region, how many calls, and how many of those calls
    moved data (read or wrote a byte: not views, not allocations)."""

    calls: int = 0
    read: int = 0
    written: int = 0
    data_calls: int = 0

    @property
    def total(self) -> int:
        return self.read + self.written


@dataclass
class TrafficCount:
    """Per-op traffic of one counted region (bytes; read + written)."""

    ops: dict[str, OpTraffic] = field(default_factory=lambda: defaultdict(OpTraffic))
    scopes: dict[str, TrafficCount] = field(default_factory=dict)

    @property
    def read(self) -> int:
        return sum(o.read for o in self.ops.values())

    @property
    def written(self) -> int:
        return sum(o.written for o in self.ops.values())

    @property
    def total(self) -> int:
        return self.read + self.written

    @property
    def calls(self) -> int:
        """ATen ops dispatched."""
        return sum(o.calls for o in self.ops.values())

    @property
    def data_calls(self) -> int:
        """ATen ops dispatched that moved data (not views or allocations)."""
        return sum(o.data_calls for o in self.ops.values())

    def add(self, name: str, read: int, written: int) -> None:
        entry = self.ops[name]
        entry.calls += 1
        entry.data_calls += 1 if read or written else 0
        entry.read += read
        entry.written += written

    def scope(self, label: str) -> TrafficCount:
        """The ops charged while the module labelled ``label`` ran (an empty count when it never ran)."""
        return self.scopes.get(label) or TrafficCount()


#: Objects told when a counted region starts and ends (``region_start()`` / ``region_end()``, called as a
#: :class:`TrafficCounter` is entered and left) and handed every op in it (``observe(func, args, kwargs, out)``):
#: :class:`kvcache.measuring.memory.MemoryTracker` measures the memory of exactly the step whose bytes are counted.
REGION_LISTENERS: list[Any] = []


class TrafficCounter(TorchDispatchMode):
    """Counts the bytes every dispatched ATen op reads and writes, by the rules in this module's docstring;
    with ``scopes``, also per label of the modules running (see the module docstring)."""

    def __init__(self, scopes: dict[Any, str] | None = None) -> None:
        super().__init__()
        self.count = TrafficCount()
        self.scopes = dict(scopes or {})
        self.active: list[str] = []
        self.hooks: list[Any] = []
        self.observers: list[Any] = []

    def __enter__(self) -> TrafficCounter:
        for module, label in self.scopes.items():
            self.hooks.append(module.register_forward_pre_hook(lambda *_, label=label: self.active.append(label)))
            self.hooks.append(module.register_forward_hook(lambda *_, label=label: self._leave(label),
                                                           always_call=True))
        self.observers = list(REGION_LISTENERS)
        for listener in self.observers:
            listener.region_start()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks.clear()
        result = super().__exit__(*exc)
        for listener in self.observers:
            listener.region_end()
        self.observers = []
        return result

    def _leave(self, label: str) -> None:
        if label in self.active:
            del self.active[len(self.active) - 1 - self.active[::-1].index(label)]

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = op_name(func)
        try:
            read, written = self.charge(func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - never let counting break the model; charge plainly
            read, written = _distinct_read(_tensors((args, kwargs))), 0
        self.count.add(name, read, written)
        for observer in self.observers:
            observer.observe(func, args, kwargs, out)
        for label in dict.fromkeys(self.active):
            self.count.scopes.setdefault(label, TrafficCount()).add(name, read, written)
        return out

    @staticmethod
    def charge(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
        """(bytes read, bytes written) of one op call."""
        name = func.overloadpacket.__name__
        if name in NO_TRAFFIC:
            return 0, 0
        if name in LOOKUPS:
            selected = sum(t.numel() * t.element_size() for t in _tensors(out))
            indices = sum(span_bytes(t) for t in _tensors(args[LOOKUPS[name]]))
            return selected + indices, selected
        inputs = _tensors((args, kwargs))
        outputs = _tensors(out)
        mutated = _mutated_args(func, args, kwargs)
        if mutated:
            if name in PARTIAL_WRITES:
                return _partial_write(name, args, kwargs)
            written = sum(t.numel() * t.element_size() for t in mutated)
            return _distinct_read(inputs), written
        if outputs and all(any(_shares_storage(o, i) for i in inputs) for o in outputs):
            return 0, 0  # a view
        if not inputs:  # factory ops (zeros, arange, full, randn...) write what they make
            return 0, sum(t.numel() * t.element_size() for t in outputs)
        return _distinct_read(inputs), sum(t.numel() * t.element_size() for t in outputs)


def count(fn: Any, *args: Any, scopes: dict[Any, str] | None = None, **kwargs: Any) -> tuple[Any, TrafficCount]:
    """Run ``fn(*args, **kwargs)`` under a :class:`TrafficCounter` (with ``scopes``); return its result and
    the count."""
    counter = TrafficCounter(scopes)
    with counter:
        result = fn(*args, **kwargs)
    return result, counter.count


FORWARD = "forward"  # the scope label of the model's own forward call (ops_per_step's boundary)


def counted_passes(counts: dict[int, TrafficCount], bytes_per_token: int, *, min_op_passes: float = 0.005,
                   kv_bytes: dict[int, float] | None = None, layers: int | None = None,
                   weight_bytes: int | None = None) -> dict:
    """Counted passes and counted overhead from steps counted at two or more contexts.

    passes = Δ(bytes read + written by the step) / Δ(KV-cache bytes), between the smallest and largest
    context; per op the same slope ("cat 2.00, scaled_dot_product_attention 1.00"). Ops whose slope is
    below ``min_op_passes`` (per-step constants such as weights) are left out of ``by_op``. Δ(KV-cache bytes) is
    the change of the logical KV bytes the cache holds (``kv_bytes``: {context: bytes}) when given, else
    Δcontext × ``bytes_per_token``.

    Overhead, from the same counts: ``fixed_bytes`` is the line's intercept (bytes the step moves that do
    not grow with context: step bytes at the smallest context minus passes × its KV bytes),
    ``weight_passes`` = fixed bytes / ``weight_bytes``; ``ops_per_step`` / ``data_ops_per_step`` are the
    ATen ops dispatched between the model's forward call and its return (scope :data:`FORWARD`) at the
    largest context, all of them / the ones that moved data. ``layers`` lets the gate allow a rise per layer.
    """
    contexts = sorted(counts)
    if len(contexts) < 2:
        raise ValueError("counted passes need steps counted at two contexts")
    lo, hi = counts[contexts[0]], counts[contexts[-1]]
    held = kv_bytes or {c: c * bytes_per_token for c in contexts}
    kv_lo, kv_hi = held[contexts[0]], held[contexts[-1]]
    passes = (hi.total - lo.total) / (kv_hi - kv_lo)
    fixed = round(lo.total - passes * kv_lo)
    forward = hi.scopes.get(FORWARD)
    return {
        "passes": passes,
        "by_op": op_passes(lo, hi, kv_hi - kv_lo, min_op_passes),
        "contexts": contexts,
        "bytes_per_token": bytes_per_token,
        "step_bytes": {str(c): {"read": counts[c].read, "written": counts[c].written} for c in contexts},
        "calls": {name: op.calls for name, op in sorted(hi.ops.items())},
        "ops_per_step": forward.calls if forward else None,
        "data_ops_per_step": forward.data_calls if forward else None,
        "fixed_bytes": fixed,
        "weight_bytes": weight_bytes,
        "weight_passes": fixed / weight_bytes if weight_bytes else None,
        "layers": layers,
    }


def op_passes(lo: TrafficCount, hi: TrafficCount, kv_delta: float, min_op_passes: float = 0.005) -> dict[str, float]:
    """Per op, Δ(bytes) / ``kv_delta`` between two counts, largest first; slopes below ``min_op_passes`` left out."""
    by_op = {}
    for name in set(lo.ops) | set(hi.ops):
        delta = hi.ops[name].total - lo.ops[name].total if name in hi.ops and name in lo.ops else (
            hi.ops[name].total if name in hi.ops else -lo.ops[name].total)
        passes = delta / kv_delta
        if abs(passes) >= min_op_passes:
            by_op[name] = round(passes, 4)
    return dict(sorted(by_op.items(), key=lambda kv: -abs(kv[1])))


def layer_scopes(model: Any) -> dict[Any, str]:
    """``{decoder layer module: "layer.<i>"}`` for a causal LM whose decoder keeps its layers in ``.layers`` (or
    Falcon-style ``.h``); empty when none is found."""
    base = getattr(model, "model", None) or getattr(model, "transformer", None) or model
    layers = getattr(base, "layers", None)
    if layers is None:
        layers = getattr(base, "h", None)
    return {layer: f"layer.{i}" for i, layer in enumerate(layers)} if layers is not None else {}


def kind_bytes(count: TrafficCount, layers: list[int]) -> TrafficCount:
    """The ops charged while any of ``layers`` ran (scopes ``layer.<i>``), as one count."""
    merged = TrafficCount()
    for i in layers:
        for name, op in count.scope(f"layer.{i}").ops.items():
            entry = merged.ops[name]
            entry.calls += op.calls
            entry.data_calls += op.data_calls
            entry.read += op.read
            entry.written += op.written
    return merged


def kind_passes(counts: dict[int, TrafficCount], kind_layers: dict[str, list[int]],
                held: dict[str, dict[int, float]], *, windows: dict[str, int | None] | None = None,
                beyond: dict[int, TrafficCount] | None = None, beyond_held: dict[str, dict[int, float]] | None = None,
                min_op_passes: float = 0.005) -> dict[str, dict]:
    """Counted passes per layer kind: Δ(bytes of that kind's layers) / Δ(KV bytes those layers hold), between the
    smallest and largest counted context; a kind whose layers hold no more bytes there (a linear-attention state)
    has no passes figure, ``grows`` False and the bytes its step changed by (``growth_bytes``). ``beyond``: steps
    counted past every sliding window, where a sliding kind must stop growing (its ``beyond.growth_bytes`` 0)."""
    contexts = sorted(counts)
    lo, hi = contexts[0], contexts[-1]
    out = {}
    for kind, layers in kind_layers.items():
        step = {c: kind_bytes(counts[c], layers) for c in contexts}
        kv_delta = held[kind][hi] - held[kind][lo]
        growth = step[hi].total - step[lo].total
        entry: dict[str, Any] = {
            "layers": len(layers),
            "window": (windows or {}).get(kind),
            "passes": growth / kv_delta if kv_delta else None,
            "by_op": op_passes(step[lo], step[hi], kv_delta, min_op_passes) if kv_delta else {},
            "grows": bool(kv_delta),
            "growth_bytes": growth,
            "stops_growing_at": 0 if kind == "linear" else (windows or {}).get(kind),
            "step_bytes": {str(c): step[c].total for c in contexts},
            "kv_bytes": {str(c): held[kind][c] for c in contexts},
        }
        if beyond and beyond_held:
            far = sorted(beyond)
            far_step = {c: kind_bytes(beyond[c], layers).total for c in far}
            entry["beyond"] = {"contexts": far, "step_bytes": {str(c): far_step[c] for c in far},
                               "kv_bytes": {str(c): beyond_held[kind][c] for c in far},
                               "growth_bytes": far_step[far[-1]] - far_step[far[0]]}
        out[kind] = entry
    return out


def describe_by_op(by_op: dict[str, float]) -> str:
    """``{"cat": 2.0, "scaled_dot_product_attention": 1.0}`` -> ``"cat 2.00, scaled_dot_product_attention 1.00"``."""
    return ", ".join(f"{name} {value:.2f}" for name, value in by_op.items()) or "-"
