"""One decode point: a fresh cache of one class, filled to ``context`` tokens untimed, then single-token
decode steps, for one sequence or a batch (``--kv-batch``, ``--kv-ragged``: :mod:`kvcache.measuring.batch`).
The timed benchmarks, the traffic counter and the attention probe all drive this; the generate driver
(:mod:`kvcache.measuring.generate`) builds on it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kvcache.measuring import attention, compat, hooks
from kvcache.measuring.batch import BatchShape
from kvcache.measuring.cachespec import CacheRequest, CacheSpec
from kvcache.measuring.counting import traffic
from kvcache.measuring.devices import Device
from kvcache.measuring.geometry import ModelSpec

MARGIN_TOKENS = 8
FILL_CHUNK = 8192


class PointSkip(Exception):
    """A point that cannot run here (memory, release, package); the message is the reason."""


@dataclass
class DecodePoint:
    """A cache of one class on a built model, ready to step.

    ``position`` is the number of slots each row of the cache fills (the context, then one more per
    :meth:`step`). A batch's rows are left-padded to the longest sequence: with ``batch.ragged`` a row's leading
    ``batch.pads(context)`` slots are masked out (``attention_mask``) and its positions count its own tokens.
    """

    model: Any
    spec: ModelSpec
    cache_spec: CacheSpec
    device: Device
    context: int
    max_tokens: int
    fill: str = "synthetic"
    seed: int = 0
    cache: Any = None
    position: int = 0
    next_ids: torch.Tensor | None = None
    batch: BatchShape = field(default_factory=BatchShape)
    position_ids: torch.Tensor | None = None  # [batch, 1] on the device, advanced there each step (row 0: the slot)
    mask: torch.Tensor | None = None  # ragged: [batch, max_tokens] padding mask; a step passes its first slots
    step_start_ns: list[int] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    decode_hold: hooks.DecodeHold | None = None  # the class's decode_context, held from the first step to release
    fill_state: hooks.FillState | None = None  # module attributes its fill_context left, put back before its steps
    strategy: Any = None  # --kv-decoding: the DecodingStrategy of a <cache>#<strategy> key (kvcache.measuring.decoding)

    def build(self) -> DecodePoint:
        """Make the cache, fill it to ``context`` tokens (untimed) and pick the first input token. A class that needs
        a real prefill (:func:`kvcache.measuring.hooks.fill_of`) is prefilled whatever ``fill`` says."""
        self.fill = hooks.fill_of(self.cache_spec, self.fill)
        dtype = next(self.model.parameters()).dtype
        if self.cache_spec.prepare is not None:
            self.cache_spec.prepare()
        attention.switch(self.model, self.cache_spec.attention)  # --kv-attn: <cache>@<attention> keys
        request = CacheRequest(self.model.config, self.max_tokens, self.device.torch_device, dtype, self.batch.size)
        self.cache = self.cache_spec.build(request)
        if self.strategy is not None:  # its phases (a reorder, a crop) charged as such by the traffic counter
            traffic.charge_methods(self.cache, self.strategy.cache_phases())
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        where = self.device.torch_device
        with torch.inference_mode():
            if self.batch.ragged:  # a row's leading pads are masked out
                pads = torch.tensor(self.batch.pads(self.context), device=where)[:, None]
                self.mask = (torch.arange(self.max_tokens, device=where)[None] >= pads).long()
            if self.fill == "synthetic":
                self._fill_synthetic(gen, dtype)
            else:
                self._fill_prefill(gen)
        self.position = self.context
        with torch.inference_mode():  # inference tensors like every later token: one compiled graph, not two
            token = torch.randint(1, self.spec.vocab, (self.batch.size, 1), generator=gen)
            self.next_ids = token.to(where)
            self.position_ids = torch.tensor([[n] for n in self.batch.lengths(self.context)], device=where)
        self.device.sync()
        return self

    def _fill_synthetic(self, gen: torch.Generator, dtype: torch.dtype) -> None:
        """Random non-zero K/V written into every layer that caches K/V (each with its own geometry: heads, key and
        value dims), in order from slot 0, in chunks: O(context). A linear-attention layer's state is left to the
        first warm-up step, which starts it (it does not grow with context)."""
        shapes = self.spec.cached_shapes()
        for start in range(0, self.context, FILL_CHUNK):
            n = min(FILL_CHUNK, self.context - start)
            for layer, shape in enumerate(shapes):
                if shape is None:
                    continue
                heads, key_dim, value_dim = shape
                rows = self.batch.size
                k = torch.randn(rows, heads, n, key_dim, generator=gen).to(self.device.torch_device, dtype)
                v = torch.randn(rows, heads, n, value_dim, generator=gen).to(self.device.torch_device, dtype)
                compat.fill_layer(self.cache, layer, k, v, start)

    def _fill_prefill(self, gen: torch.Generator) -> None:
        """A real forward over ``context`` random tokens per row (a ragged batch's pads masked out), inside the
        class's ``fill_context`` when it has one."""
        where = self.device.torch_device
        rows = self.batch.size
        ids = torch.randint(1, self.spec.vocab, (rows, self.context), generator=gen).to(where)
        kwargs = compat.decode_kwargs(self.model, self.cache, 0, where)
        pads = torch.tensor(self.batch.pads(self.context), device=where)[:, None]
        kwargs["position_ids"] = (torch.arange(self.context, device=where)[None] - pads).clamp(min=0)
        if self.mask is not None:
            kwargs["attention_mask"] = self.mask[:, :self.context]
        if "cache_position" in kwargs:
            kwargs["cache_position"] = torch.arange(self.context, device=where)
        before = hooks.FillState.before_fill(self.model) if self.cache_spec.fill_context is not None else None
        with hooks.entered(self.cache_spec, "fill_context", self.model):
            self.model(input_ids=ids, **kwargs)
        if before is not None:
            self.fill_state = hooks.FillState(self.model, before)

    def step(self) -> torch.Tensor:
        """One single-token decode step. Nothing in it waits for the device: the position lives on the device
        and advances there, the greedy next token stays there. A class's ``decode_context`` is held from here on."""
        if self.fill_state is not None:
            self.fill_state.apply()
        if self.cache_spec.decode_context is not None:
            if self.decode_hold is None:
                self.decode_hold = hooks.DecodeHold(self.cache_spec, self.model)
            self.decode_hold.hold()
        with torch.inference_mode():
            mask = self.mask[:, :self.position + 1] if self.mask is not None else None  # a view: no copy
            kwargs = compat.decode_kwargs(self.model, self.cache, self.position, self.device.torch_device,
                                          position_ids=self.position_ids, attention_mask=mask)
            out = self.model(input_ids=self.next_ids, **kwargs)
            returned = compat.cache_from_output(out)
            if returned is not None:
                self.cache = returned
            self.next_ids = out.logits[:, -1:].argmax(-1)
            self.position_ids.add_(1)
        self.position += 1
        return out.logits

    def count_step(self, warmup: int = 0, scopes: dict[Any, str] | None = None) -> traffic.TrafficCount:
        """The counted traffic of one step (bytes read + written per op; ``scopes`` charge ops to modules), taken
        once at least ``warmup`` decode steps have run on this point since its fill: those :func:`open_point`
        already took count, the rest are taken here, uncounted. The point's slots must hold them (ValueError)."""
        missing = max(0, warmup - (self.position - self.context))
        if self.position + missing + 1 > self.max_tokens:
            raise ValueError(f"count_step({warmup}): {missing} more warm-up steps and the counted one need "
                             f"{self.position + missing + 1} slots; this point has {self.max_tokens}")
        if missing:
            self.warm_up(missing)
        with attention.uncompiled(self.cache_spec.attention):
            return traffic.count(self.step, scopes=scopes)[1]

    def before_step(self) -> None:
        """Untimed: wait for the device, then note the step's start on the monotonic clock."""
        self.device.sync()
        self.step_start_ns.append(time.monotonic_ns())

    def timed_step(self) -> None:
        """The timed region: one step, then wait for the device. Its wall-clock seconds are kept here (the
        suite's own record, whatever pytest-benchmark keeps), timed inside pytest-benchmark's own bracket."""
        start = time.perf_counter()
        self.step()
        self.device.sync()
        self.step_seconds.append(time.perf_counter() - start)

    def timed_tokens_per_step(self) -> float | None:
        """The tokens each sequence gained per timed step, where a step may gain more than one (speculative
        decoding); None here: one token a step."""
        return None

    def timed_mean_tokens(self) -> float | None:
        """Tokens a sequence held during the timed steps, averaged, where a step may gain more than one (the
        session's own figure, context + warm-up + (steps + 1) / 2, counts one a step); None here."""
        return None

    def warm_up(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
        self.device.sync()

    def release(self) -> None:
        hold, self.decode_hold = self.decode_hold, None
        if hold is not None:
            hold.drop()
        if self.fill_state is not None:
            self.fill_state.revert()
            self.fill_state = None
        self.cache = None
        self.next_ids = None
        self.position_ids = None
        self.mask = None


def tokens_needed(context: int, warmup: int, steps: int) -> int:
    """Slots a preallocating cache needs: context + warm-up + timed steps + a small margin."""
    return context + warmup + steps + MARGIN_TOKENS


def check_memory(spec: ModelSpec, cache_spec: CacheSpec, device: Device, max_tokens: int, rows: int = 1) -> None:
    """Skip (PointSkip) when the cache (``rows`` sequences) would not fit in the device's free memory, naming the
    numbers."""
    need = spec.kv_bytes(max_tokens) * rows * cache_spec.memory_factor
    free = device.free_bytes()
    if need > 0.9 * free:
        batch = f" x {rows} sequences" if rows > 1 else ""
        raise PointSkip(f"{cache_spec.name} at {max_tokens} tokens{batch} needs about {need / 2**30:.2f} GiB "
                        f"({spec.bytes_per_token} B/token x {max_tokens}{batch} x {cache_spec.memory_factor}); "
                        f"{device.type} has {free / 2**30:.2f} GiB free")


def open_point(model: Any, spec: ModelSpec, cache_spec: CacheSpec, device: Device, context: int, *,
               warmup: int, steps: int, fill: str = "synthetic", seed: int = 0, batch: BatchShape | None = None,
               point_type: type[DecodePoint] | None = None,
               on_filled: Callable[[], None] | None = None) -> DecodePoint:
    """A built, filled and warmed-up point (``point_type``, default :class:`DecodePoint`), or PointSkip with the
    reason; ``on_filled()`` is called between the fill and the warm-up (:func:`kvcache.measuring.stages.prepared`:
    the warm-up stays right before the timed steps)."""
    batch = batch or BatchShape()
    max_tokens = tokens_needed(context, warmup, steps)
    check_memory(spec, cache_spec, device, max_tokens, batch.size)
    cls = cache_spec.point or point_type or DecodePoint  # a class that brings its own point steps it its way
    fill = hooks.fill_of(cache_spec, fill)  # a class that needs a real prefill gets one, its own point too
    point = cls(model, spec, cache_spec, device, context, max_tokens, fill=fill, seed=seed, batch=batch)
    try:
        point.build()
        if on_filled is not None:
            on_filled()
        point.warm_up(warmup)
    except (compat.Unsupported, ImportError, MemoryError, RuntimeError) as exc:
        reason = attention.compile_failure(cache_spec.attention, exc)
        if reason:  # the release's flex_attention, which Transformers always compiles, does not compile here
            point.release()
            raise PointSkip(f"{cache_spec.name}: {reason}") from None
        if not isinstance(exc, (compat.Unsupported, ImportError)) and not out_of_memory(exc):
            raise  # any other failure is the class's own: reported, not skipped
        point.release()  # whatever it built so far (a pool, a cache) goes now, not with the exception's frames
        if isinstance(exc, ImportError):
            raise PointSkip(f"{cache_spec.name} needs a package that is not installed ({exc})") from None
        if out_of_memory(exc):
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise PointSkip(f"out of memory on {device.type} at {context} tokens: {first}") from None
        raise PointSkip(str(exc)) from None
    return point


#: torch's out-of-memory exceptions in the installed release: ``torch.OutOfMemoryError`` from torch 2.5 (a
#: RuntimeError), ``torch.cuda.OutOfMemoryError`` before it; CPU allocations that fail raise these or MemoryError.
OUT_OF_MEMORY: tuple[type[BaseException], ...] = tuple(
    dict.fromkeys(t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None),
                              MemoryError) if isinstance(t, type)))
#: How an older torch words an allocation failure it raises as a plain RuntimeError (CPU, MPS, CUDA).
OUT_OF_MEMORY_WORDS = ("out of memory", "can't allocate memory", "not enough memory")


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure: one of :data:`OUT_OF_MEMORY`, or a RuntimeError saying so (torch
    releases before 2.5 have no ``torch.OutOfMemoryError``)."""
    if isinstance(exc, OUT_OF_MEMORY):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc).lower() for w in OUT_OF_MEMORY_WORDS)
