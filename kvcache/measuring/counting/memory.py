"""Counted memory: the bytes one decode step allocates, peaks at and leaves held, from the storages themselves. A
:class:`MemoryTracker` follows the traffic counter's step op by op (new storages charged to the op that made them,
a ``weakref.finalize`` on each telling when it is freed); :func:`memory_passes` and :func:`kind_memory` turn steps at
two contexts into slopes per logical KV byte, per class and per layer kind. What it sees and does not:
docs/memory.md."""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from kvcache.analysing.options import MIN_OP_PASSES
from kvcache.analysing.records.counted import KindMemory, Memory, MemorySlopes, MemoryStep
from kvcache.measuring.counting import traffic


@dataclass
class ScopeBytes:
    """Bytes of one counted step per scope label of the traffic counter (``layer.<i>``): ``allocated`` while it ran,
    and ``held`` after the step in the storages first seen while it ran (allocated there, or from before the step and
    first touched there)."""

    allocated: dict[str, int] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)


def _storages(obj: Any, out: list[Any]) -> list[Any]:
    """The storages of the tensors in ``obj`` (nested tuples, lists and dicts), appended to ``out``."""
    if isinstance(obj, torch.Tensor):
        try:
            out.append(obj.untyped_storage())
        except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested, fake)
            pass
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            _storages(item, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            _storages(item, out)
    return out


class MemoryTracker:
    """Measures the memory of the first traffic-counted region
    (:class:`kvcache.measuring.counting.traffic.TrafficCounter`) run
    while it is entered (see the module docstring): entering it only listens for that region; inside it the counter
    hands it every op (:meth:`observe`), so nothing before the counted step pays for it. :attr:`step` is the region's
    memory (None until one ran)."""

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type
        self.live: dict[int, int] = {}  # id(storage) -> nbytes: storages the region allocated, still alive
        self.pre: dict[int, int] = {}  # id(storage) -> nbytes: storages from before the region it touched, alive
        self.origin: dict[int, str] = {}  # id(storage) -> the op that allocated it
        self.scope_of: dict[int, str] = {}  # id(storage) -> the innermost scope label running when first seen
        self.finalizers: list[weakref.finalize] = []
        self.current = 0  # bytes live now minus bytes live when the region started (of the storages known here)
        self.before = 0  # bytes of the storages from before the region that it touched (all alive when it started)
        self.counting = False
        self.step: MemoryStep | None = None
        self.scopes: ScopeBytes | None = None  # the same step's bytes per scope label
        self._cuda_start: dict[str, int] = {}

    # --- the allocator's events, as storages come and go ---
    # A storage is known by ``id`` only while it lives: CPython hands a freed storage's id to the next one made, so
    # whatever is noted of it (its scope, its op) goes with it, or a later storage would inherit it.
    def _forget(self, key: int) -> None:
        self.scope_of.pop(key, None)
        self.origin.pop(key, None)

    def _freed(self, key: int, nbytes: int) -> None:
        if self.live.pop(key, None) is not None:
            self.current -= nbytes
            self._forget(key)

    def _freed_before(self, key: int, nbytes: int) -> None:
        if self.pre.pop(key, None) is not None:
            self.current -= nbytes
            self._forget(key)

    def observe(self, func: Any, args: tuple, kwargs: dict, out: Any, scopes: list[str] = ()) -> None:
        """One op of the counted region, after it ran: its outputs' new storages, its inputs' older ones. ``scopes``:
        the counter's scope labels running (innermost last); each new storage is charged to the innermost."""
        if not self.counting:
            return
        scope = scopes[-1] if scopes else None
        inputs = set()
        for storage in _storages(kwargs, _storages(args, [])):
            key = id(storage)
            inputs.add(key)
            if key not in self.live and key not in self.pre:  # made before the region: alive when it started
                nbytes = storage.nbytes()
                self.pre[key] = nbytes
                self.before += nbytes
                if scope is not None:
                    self.scope_of[key] = scope
                self.finalizers.append(weakref.finalize(storage, self._freed_before, key, nbytes))
        for storage in _storages(out, []):
            key = id(storage)
            if key in inputs or key in self.pre:
                continue
            nbytes = storage.nbytes()
            if key in self.live:  # an output resized in place (``resize_``): charge the growth
                grown = nbytes - self.live[key]
                if grown:
                    self.live[key] = nbytes
                    self.current += grown
                    if grown > 0:
                        self._charge(traffic.op_name(func), grown, key, scope)
                continue
            if nbytes == 0:
                continue
            self.live[key] = nbytes
            self.current += nbytes
            self.finalizers.append(weakref.finalize(storage, self._freed, key, nbytes))
            if scope is not None:
                self.scope_of[key] = scope
            self._charge(traffic.op_name(func), nbytes, key, scope)

    def _charge(self, op: str, nbytes: int, key: int, scope: str | None = None) -> None:
        step = self.step
        step.allocated += nbytes
        step.by_op[op] = step.by_op.get(op, 0) + nbytes
        if scope is not None:
            allocated = self.scopes.allocated
            allocated[scope] = allocated.get(scope, 0) + nbytes
        self.origin[key] = op
        if self.current > step.peak:
            step.peak = self.current
            at_peak: dict[str, int] = {}
            for k, name in self.origin.items():
                at_peak[name] = at_peak.get(name, 0) + self.live.get(k, 0)
            step.peak_by_op = at_peak

    # --- the counted region (the traffic counter's) ---
    def region_start(self) -> None:
        if self.step is not None or self.counting:
            return
        gc.freeze()  # what exists now is left out of the collection at the end: it then scans the step's objects only
        self.step = MemoryStep.of(before=0, allocated=0, peak=0, held=0, by_op={}, peak_by_op={})
        self.scopes = ScopeBytes()
        self.counting = True
        if self.device_type == "cuda" and torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._cuda_start = {"level": torch.cuda.memory_allocated(),
                                "allocated": torch.cuda.memory_stats().get("allocated_bytes.all.allocated", 0)}

    def region_end(self) -> None:
        if not self.counting:
            return
        self.counting = False
        step = self.step
        if self._cuda_start:
            torch.cuda.synchronize()
            level = self._cuda_start["level"]
            peak = torch.cuda.max_memory_allocated() - level
            stats = torch.cuda.memory_stats()
            allocated = stats.get("allocated_bytes.all.allocated", 0) - self._cuda_start["allocated"]
        gc.collect()  # the step's own garbage cycles, if any, release what they hold
        gc.unfreeze()
        step.before = self.before
        step.held = sum(self.live.values()) + sum(self.pre.values())
        step.held_new = sum(self.live.values())  # of which in storages the step made (a cache moved or reallocated)
        for key, nbytes in [*self.live.items(), *self.pre.items()]:
            if key in self.scope_of:
                label = self.scope_of[key]
                self.scopes.held[label] = self.scopes.held.get(label, 0) + nbytes
        step.by_op = dict(sorted(step.by_op.items(), key=lambda kv: -kv[1]))
        step.peak_by_op = {op: n for op, n in sorted(step.peak_by_op.items(), key=lambda kv: -kv[1]) if n}
        if self._cuda_start:
            step.allocator = {"before": level, "allocated": allocated, "peak": max(peak, 0),
                              "held": torch.cuda.memory_allocated()}
        self._detach()

    def _detach(self) -> None:
        for finalizer in self.finalizers:
            finalizer.detach()
        self.finalizers.clear()
        self.live.clear()
        self.pre.clear()
        self.origin.clear()
        self.scope_of.clear()

    def __enter__(self) -> MemoryTracker:
        traffic.REGION_LISTENERS.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self in traffic.REGION_LISTENERS:
            traffic.REGION_LISTENERS.remove(self)
        if self.counting:  # the region never ended (an exception inside it)
            self.counting = False
            gc.unfreeze()
        self._detach()


def memory_passes(steps: dict[int, MemoryStep], kv_bytes: dict[int, float], *, declared_factor: float | None = None,
                  attention_factor: float = 0.0, factor_bytes: dict[int, float] | None = None,
                  min_op_passes: float = MIN_OP_PASSES) -> Memory:
    """``kv.memory.<cache>`` from steps measured at two or more contexts: each figure's slope between the smallest
    and largest context per logical KV byte (``kv_bytes``: {context: bytes held}), like counted passes.

    ``allocated_passes`` (bytes the step allocates), ``peak_passes`` (its high-water mark above what was live before
    it), ``held_passes`` (bytes live after it; ``held_new_passes``: of them, in storages the step made: a cache that
    moved to a new allocation, as a StaticCache's buffer under beam search's reorder), ``peak_factor`` (bytes live at
    the step's peak, ``before + peak``: the cache sizes it needs, what :attr:`CacheSpec.memory_factor` declares);
    ``allocated_by_op`` / ``peak_by_op`` per op
    (slopes below ``min_op_passes`` left out); ``steps`` {context: the step's bytes}; ``declared_factor`` and, when the
    measured peak needs more than it plus ``attention_factor`` (the cache sizes the attention implementation's own K/V
    copies hold: :func:`kvcache.measuring.attention.copies_factor`, recorded when not 0), ``factor_problem`` (one
    line). ``declared_factor`` is in cache sizes of the bytes the point allocates: on a left-padded batch
    ``factor_bytes`` ({context: allocated KV bytes}, the padded rectangle) is what the peak is measured against for
    the check, like with like (per live byte a ragged batch's padding would count as a need the class does not
    have)."""
    contexts = sorted(steps)
    if len(contexts) < 2:
        raise ValueError("memory passes need steps measured at two contexts")
    lo, hi = steps[contexts[0]], steps[contexts[-1]]
    delta = kv_bytes[contexts[-1]] - kv_bytes[contexts[0]]

    def slope(a: float, b: float) -> float:
        return (b - a) / delta

    def per_op(a: dict[str, int], b: dict[str, int]) -> dict[str, float]:
        found = {op: round(slope(a.get(op, 0), b.get(op, 0)), 4) for op in {*a, *b}}
        kept = ((op, v) for op, v in found.items() if abs(v) >= min_op_passes)
        return dict(sorted(kept, key=lambda kv: (-abs(kv[1]), kv[0])))  # ties by name: the same order every run

    out: dict[str, Any] = {
        "allocated_passes": slope(lo.allocated, hi.allocated),
        "peak_passes": slope(lo.peak, hi.peak),
        "held_passes": slope(lo.held, hi.held),
        **({"held_new_passes": slope(lo.held_new, hi.held_new)}
           if lo.held_new is not None and hi.held_new is not None else {}),
        "peak_factor": slope(lo.before + lo.peak, hi.before + hi.peak),
        "allocated_by_op": per_op(lo.by_op, hi.by_op),
        "peak_by_op": per_op(lo.peak_by_op, hi.peak_by_op),
        "contexts": contexts,
        "kv_bytes": {str(c): kv_bytes[c] for c in contexts},
        "steps": {str(c): steps[c] for c in contexts},
        "source": "storages",
    }
    allocator_factor = 0.0  # cache sizes live at the peak by the allocator's statistics (CUDA)
    if lo.allocator is not None and hi.allocator is not None:
        a, b = lo.allocator, hi.allocator
        out["allocator"] = MemorySlopes.of(
            allocated_passes=slope(a["allocated"], b["allocated"]), peak_passes=slope(a["peak"], b["peak"]),
            held_passes=slope(a["held"], b["held"]),
            peak_factor=slope(a["before"] + a["peak"], b["before"] + b["peak"]))
        allocator_factor = out["allocator"].peak_factor
    if declared_factor is not None:
        out["declared_factor"] = declared_factor
        copies = ""
        if attention_factor:
            out["attention_factor"] = attention_factor
            copies = f" (+ {attention_factor:.2f} for the attention's own K/V copies)"
        needed, per = max(out["peak_factor"], allocator_factor), ""
        if factor_bytes is not None:
            basis = factor_bytes[contexts[-1]] - factor_bytes[contexts[0]]
            needed = (hi.before + hi.peak) - (lo.before + lo.peak)
            if lo.allocator is not None and hi.allocator is not None:
                a, b = lo.allocator, hi.allocator
                needed = max(needed, (b["before"] + b["peak"]) - (a["before"] + a["peak"]))
            needed, per = needed / basis, " per allocated KV byte"
        if needed > declared_factor + attention_factor + MIN_OP_PASSES:
            out["factor_problem"] = (f"needs {needed:.2f} cache sizes at its peak{per}, declares memory_factor "
                                     f"{declared_factor:g}{copies}: a point judged to fit may not")
    return Memory.of(**out)


def kind_memory(scopes: dict[int, ScopeBytes], kind_layers: dict[str, list[int]],
                held: dict[str, dict[int, float]]) -> dict[str, KindMemory]:
    """``kv.memory.<cache>.kinds``: per layer kind, ``allocated_passes`` and ``held_passes``, the slopes between the
    smallest and largest context of the bytes allocated while that kind's layers ran and of the bytes held after the
    step in the storages first seen there, per logical KV byte that kind holds (``held``: {kind: {context: bytes}});
    None where the kind's KV bytes do not grow (a linear-attention state), with ``allocated_growth_bytes`` and
    ``held_growth_bytes`` beside. Bytes and tokens throughout."""
    contexts = sorted(scopes)
    lo, hi = contexts[0], contexts[-1]
    out: dict[str, KindMemory] = {}
    for kind, layers in kind_layers.items():
        labels = [f"layer.{i}" for i in layers]

        def total(by_scope: dict[str, int], labels: list[str] = labels) -> int:
            return sum(by_scope.get(label, 0) for label in labels)

        allocated = total(scopes[hi].allocated) - total(scopes[lo].allocated)
        kept = total(scopes[hi].held) - total(scopes[lo].held)
        kv_delta = held[kind][hi] - held[kind][lo]
        out[kind] = KindMemory.of(layers=len(layers), allocated_passes=allocated / kv_delta if kv_delta else None,
                                  held_passes=kept / kv_delta if kv_delta else None,
                                  allocated_growth_bytes=allocated, held_growth_bytes=kept)
    return out

