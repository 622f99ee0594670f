"""Counted traffic: the bytes each tensor operation of one decode step reads and writes, and the counted passes they
make. :class:`TrafficCounter` intercepts every ATen op at torch's dispatch level and charges it by
:mod:`kvcache.measuring.counting.op_bytes`' rules, per op name and per module scope (``forward``, ``layer.3``);
:func:`counted_passes` and :func:`kind_passes` are slopes between contexts: Δ(bytes moved) / Δ(KV-cache bytes held).
The counter and torch.profiler never nest (:class:`NestingError`; docs/how-it-measures.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from kvcache.analysing.options import MIN_OP_PASSES
from kvcache.analysing.records.counted import KindTraffic, Traffic, TrafficBeyond
from kvcache.measuring.counting.op_bytes import charge, inputs_read

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
#: :class:`kvcache.measuring.counting.memory.MemoryTracker` measures the memory of exactly the step whose bytes are
#: counted.
REGION_LISTENERS: list[Any] = []


class NestingError(RuntimeError):
    """The traffic counter and torch.profiler were nested (either inside the other); one line."""


def profiler_running() -> bool:
    """Whether a torch profiler (``torch.profiler.profile`` or the autograd profiler) records on this thread."""
    return bool(torch._C._autograd._profiler_enabled())


def active_counters() -> list[TrafficCounter]:
    """The traffic counters active on this thread (torch's dispatch mode stack, innermost last)."""
    return [mode for mode in _get_current_dispatch_mode_stack() if isinstance(mode, TrafficCounter)]


def check_not_counting(what: str) -> None:
    """Raise :class:`NestingError` if a traffic counter is active: ``what`` (a profiler) must not start inside it."""
    if active_counters():
        raise NestingError(f"{what} started while the traffic counter (a TorchDispatchMode) is active: torch.profiler "
                           "records every op twice under a dispatch mode (pytorch #195746); profile outside the count")


def check_not_profiling() -> None:
    """Raise :class:`NestingError` if a torch profiler is recording: the counter must not start inside it."""
    if profiler_running():
        raise NestingError("the traffic counter started while torch.profiler is recording: a profiler records every "
                           "op twice under a dispatch mode (pytorch #195746); count outside the profile")


class TrafficCounter(TorchDispatchMode):
    """Counts the bytes every dispatched ATen op reads and writes, by the rules of
    :mod:`kvcache.measuring.counting.op_bytes`; with ``scopes``, also per label of the modules running (see the module
    docstring)."""

    def __init__(self, scopes: dict[Any, str] | None = None) -> None:
        super().__init__()
        self.count = TrafficCount()
        self.scopes = dict(scopes or {})
        self.active: list[str] = []
        self.hooks: list[Any] = []
        self.observers: list[Any] = []

    def __enter__(self) -> TrafficCounter:
        check_not_profiling()
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
        if profiler_running():  # a profiler started inside the count, not through check_not_counting
            raise NestingError(f"torch.profiler is recording inside the traffic counter (at {op_name(func)}): it "
                               "records every op twice under a dispatch mode (pytorch #195746); profile outside the "
                               "count")
        name = op_name(func)
        try:
            read, written = charge(func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - never let counting break the model; charge plainly
            read, written = inputs_read(args, kwargs), 0
        self.count.add(name, read, written)
        for observer in self.observers:
            observer.observe(func, args, kwargs, out, self.active)
        for label in dict.fromkeys(self.active):
            self.count.scopes.setdefault(label, TrafficCount()).add(name, read, written)
        return out


@contextmanager
def phase(label: str) -> Iterator[None]:
    """Charge the ops run inside to the scope ``label`` too, in every traffic counter active on this thread (a
    decoding phase that is no module: a beam reorder, a speculative crop; :mod:`kvcache.measuring.decoding`)."""
    counters = active_counters()
    for counter in counters:
        counter.active.append(label)
    try:
        yield
    finally:
        for counter in counters:
            counter._leave(label)


def charge_methods(cache: Any, phases: dict[str, str]) -> None:
    """Wrap ``cache``'s methods named in ``phases`` (on the instance) so that the ops they run are charged to their
    phase by every active traffic counter (:func:`phase`): what its layers do
    inside the call included."""
    def wrap(obj: Any, method: str, label: str) -> None:
        own = getattr(obj, method, None)
        if own is None or getattr(own, "_kv_phase", None):
            return

        def charged(*args: Any, **kwargs: Any) -> Any:
            with phase(label):
                return own(*args, **kwargs)
        charged._kv_phase = label  # type: ignore[attr-defined]
        try:
            setattr(obj, method, charged)
        except (AttributeError, TypeError):
            pass

    for method, label in phases.items():
        wrap(cache, method, label)


def count(fn: Any, *args: Any, scopes: dict[Any, str] | None = None, **kwargs: Any) -> tuple[Any, TrafficCount]:
    """Run ``fn(*args, **kwargs)`` under a :class:`TrafficCounter` (with ``scopes``); return its result and
    the count."""
    counter = TrafficCounter(scopes)
    with counter:
        result = fn(*args, **kwargs)
    return result, counter.count


FORWARD = "forward"  # the scope label of the model's own forward call (ops_per_step's boundary)


def counted_passes(counts: dict[int, TrafficCount], bytes_per_token: int, *, min_op_passes: float = MIN_OP_PASSES,
                   kv_bytes: dict[int, float] | None = None, layers: int | None = None,
                   weight_bytes: int | None = None) -> Traffic:
    """Counted passes and counted overhead from steps counted at two or more contexts (the
    :class:`~kvcache.analysing.records.counted.Traffic` record; the caller adds what it counts beside them).

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
    return Traffic.of(
        passes=passes,
        by_op=op_passes(lo, hi, kv_hi - kv_lo, min_op_passes),
        contexts=contexts,
        bytes_per_token=bytes_per_token,
        step_bytes={str(c): {"read": counts[c].read, "written": counts[c].written} for c in contexts},
        calls={name: op.calls for name, op in sorted(hi.ops.items())},
        ops_per_step=forward.calls if forward else None,
        data_ops_per_step=forward.data_calls if forward else None,
        fixed_bytes=fixed,
        weight_bytes=weight_bytes,
        weight_passes=fixed / weight_bytes if weight_bytes else None,
        layers=layers,
    )


def op_passes(lo: TrafficCount, hi: TrafficCount, kv_delta: float,
              min_op_passes: float = MIN_OP_PASSES) -> dict[str, float]:
    """Per op, Δ(bytes) / ``kv_delta`` between two counts, largest first (ties by name, so a breakdown reads the same
    in every run); slopes below ``min_op_passes`` left out."""
    by_op = {}
    for name in set(lo.ops) | set(hi.ops):
        delta = hi.ops[name].total - lo.ops[name].total if name in hi.ops and name in lo.ops else (
            hi.ops[name].total if name in hi.ops else -lo.ops[name].total)
        passes = delta / kv_delta
        if abs(passes) >= min_op_passes:
            by_op[name] = round(passes, 4)
    return dict(sorted(by_op.items(), key=lambda kv: (-abs(kv[1]), kv[0])))


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
                held: dict[str, dict[int, float]], *, windows: dict[str, int | None],
                beyond: dict[int, TrafficCount] | None = None, beyond_held: dict[str, dict[int, float]] | None = None,
                min_op_passes: float = MIN_OP_PASSES) -> dict[str, KindTraffic]:
    """Counted passes per layer kind: Δ(bytes of that kind's layers) / Δ(KV bytes those layers hold), between the
    smallest and largest counted context; a kind whose layers hold no more bytes there (a linear-attention state)
    has no passes figure, ``grows`` False and the bytes its step changed by (``growth_bytes``). ``beyond``: steps
    counted past every sliding window, where a sliding kind must stop growing (its ``beyond.growth_bytes`` 0).
    ``windows``: {kind: its sliding window in tokens} (a kind without one may be absent). Bytes and tokens
    throughout; contexts in tokens."""
    contexts = sorted(counts)
    lo, hi = contexts[0], contexts[-1]
    out = {}
    for kind, layers in kind_layers.items():
        step = {c: kind_bytes(counts[c], layers) for c in contexts}
        kv_delta = held[kind][hi] - held[kind][lo]
        growth = step[hi].total - step[lo].total
        entry = KindTraffic.of(
            layers=len(layers),
            window=windows.get(kind),
            passes=growth / kv_delta if kv_delta else None,
            by_op=op_passes(step[lo], step[hi], kv_delta, min_op_passes) if kv_delta else {},
            grows=bool(kv_delta),
            growth_bytes=growth,
            stops_growing_at=0 if kind == "linear" else windows.get(kind),
            step_bytes={str(c): step[c].total for c in contexts},
            kv_bytes={str(c): held[kind][c] for c in contexts},
        )
        if beyond and beyond_held:
            far = sorted(beyond)
            far_step = {c: kind_bytes(beyond[c], layers).total for c in far}
            entry.update(beyond=TrafficBeyond.of(contexts=far, step_bytes={str(c): far_step[c] for c in far},
                                                 kv_bytes={str(c): beyond_held[kind][c] for c in far},
                                                 growth_bytes=far_step[far[-1]] - far_step[far[0]]))
        out[kind] = entry
    return out
