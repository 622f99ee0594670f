"""What one ATen operation reads and writes: the rules counted traffic charges every dispatched op by (:func:`charge`;
:class:`kvcache.measuring.counting.traffic.TrafficCounter` applies them), in bytes of *logical* traffic: a view moves
nothing, a partial write (``PARTIAL_WRITES``) writes only what it stores, a broadcast input is read once, a lookup
reads its indices and the rows (elements) it selects, a scatter or index-add reads its indices, the source elements
it stores and (accumulating) the destination elements it updates, any other op reads each distinct input once and
writes each output; and which ops are host syncs (:func:`host_sync`). The rules and what logical traffic means:
docs/how-it-measures.md ("Counted traffic: the rules")."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

NO_TRAFFIC = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_local_scalar_dense",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_nonzero", "record_stream",
    "set_", "resize_", "_has_compatible_shallow_copy_type", "lift_fresh",
}

# In-place ops that store into a part of their first argument (rule 2).
PARTIAL_WRITES = {"copy_", "index_copy_", "index_put_", "_index_put_impl_", "masked_scatter_", "scatter_",
                  "index_fill_", "masked_fill_", "fill_", "zero_", "slice_scatter_", "scatter_add_", "scatter_reduce_",
                  "index_add_", "index_reduce_"}
# Of those, the ones that store by an index along ``dim`` (``op_(self, dim, index, src, ...)``): ``scatter*`` writes
# ``index.numel()`` elements (taking as many of ``src``), ``index_*`` writes ``source.numel()``; the accumulating ones
# (add, reduce) read the destination elements they update as well (rule 2).
SCATTERS = {"scatter_": False, "scatter_add_": True, "scatter_reduce_": True}
INDEX_ACCUMULATES = {"index_add_", "index_reduce_"}

# Lookups: the position of the indices argument (rule 4). ``gather`` (and ``take_along_dim``, which dispatches to it)
# and ``take`` read one element per index, ``index_select``/``embedding``/``index`` one row per index: each the
# elements its output holds.
LOOKUPS = {"embedding": 1, "index_select": 2, "index": 1, "gather": 2, "take": 1}  # op -> position of its indices
# Lookups that reduce what they select (``embedding_bag``: ``op(weight, indices, offsets, ...)``): one row of the
# weight per index read, with the indices, offsets and per-sample weights; their outputs written.
BAG_LOOKUPS = {"_embedding_bag", "_embedding_bag_forward_only", "embedding_bag"}


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
    if name in SCATTERS:  # scatter_(self, dim, index, src | value, ...)
        index, src = args[2], args[3] if len(args) > 3 else None
        stored = index.numel() * es
        read = span_bytes(index) + (index.numel() * src.element_size() if isinstance(src, torch.Tensor) else 0)
        return read + (stored if SCATTERS[name] else 0), stored
    if name in INDEX_ACCUMULATES:  # index_add_(self, dim, index, source, ...)
        index, source = args[2], args[3]
        stored = source.numel() * es
        return span_bytes(source) + span_bytes(index) + stored, stored
    if name in ("fill_", "zero_"):
        return sum(span_bytes(t) for t in _tensors(args[1:])), dst.numel() * es
    # masked_fill_, index_fill_, masked_scatter_, slice_scatter_: sources + the written part
    sources = _tensors(args[1:]) + _tensors(kwargs)
    read = _distinct_read(sources)
    biggest = max((t.numel() for t in sources), default=dst.numel())
    return read, min(biggest, dst.numel()) * es


def inputs_read(args: tuple, kwargs: dict) -> int:
    """Bytes of every distinct tensor among an op's arguments, each read once: what an op is charged when its own
    rule cannot be applied (counting never breaks the model)."""
    return _distinct_read(_tensors((args, kwargs)))


def charge(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """(bytes read, bytes written) of one call of the ATen op ``func`` that returned ``out``, by the rules above."""
    name = func.overloadpacket.__name__
    if name in NO_TRAFFIC:
        return 0, 0
    if name in LOOKUPS:
        selected = sum(t.numel() * t.element_size() for t in _tensors(out))
        indices = sum(span_bytes(t) for t in _tensors(args[LOOKUPS[name]]))
        return selected + indices, selected
    if name in BAG_LOOKUPS:
        weight, indices = args[0], args[1]
        row = (weight[0].numel() if weight.dim() and weight.shape[0] else 0) * weight.element_size()
        small = sum(span_bytes(t) for t in _tensors((args[1:], kwargs)))
        return indices.numel() * row + small, sum(t.numel() * t.element_size() for t in _tensors(out))
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


#: Ops that make the host wait for the device on CUDA (a host sync): reading a value back (``.item()``, ``bool(t)``,
#: ``int(t)`` dispatch ``_local_scalar_dense``, or ``item``/``is_nonzero`` themselves under inference mode; ``equal``
#: returns a Python bool) or an output whose size depends on the data (``nonzero``, ``masked_select``, ``unique``,
#: ``repeat_interleave`` without ``output_size``, ``bincount``). Counted on every device: on CPU they wait for
#: nothing, but the same step on a GPU would.
HOST_SYNCS = {"_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "masked_select", "_unique", "_unique2",
              "unique_dim", "unique_consecutive", "unique_dim_consecutive", "bincount", "repeat_interleave"}
#: Ops indexed by a boolean mask (``t[mask]``, ``t[mask] = v``): CUDA turns the mask into indices with ``nonzero``.
MASK_INDEXED = {"index": 1, "index_put_": 1, "_index_put_impl_": 1, "index_put": 1}


def host_sync(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether one call of the ATen op ``func`` makes the host wait for the device on CUDA (:data:`HOST_SYNCS`; a
    boolean-mask index, :data:`MASK_INDEXED`; a copy from a device tensor into host memory, ``.cpu()``/``.to('cpu')``,
    which on CPU dispatches nothing and so is never counted there)."""
    name = func.overloadpacket.__name__
    if name in HOST_SYNCS:
        if name == "repeat_interleave":  # only repeats given as a tensor, without output_size, size the output by data
            return func._overloadname == "Tensor" and kwargs.get("output_size") is None
        return True
    if name in MASK_INDEXED and len(args) > MASK_INDEXED[name]:
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                   for i in args[MASK_INDEXED[name]] or ())
    if name in ("_to_copy", "copy_") and args and isinstance(args[0], torch.Tensor):
        if name == "_to_copy":
            source, target, blocking = args[0], kwargs.get("device"), not kwargs.get("non_blocking", False)
        else:
            source, target = (args[1] if len(args) > 1 else None), args[0].device
            blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        return (isinstance(source, torch.Tensor) and source.device.type != "cpu" and target is not None
                and torch.device(target).type == "cpu" and blocking)
    return False
