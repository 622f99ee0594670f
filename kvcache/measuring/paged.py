"""The ``paged`` class: continuous batching's ``PagedAttentionCache``, stepped one decode token per live sequence.

:class:`PagedPoint` has the interface of :class:`~kvcache.measuring.decode.DecodePoint` (build, step, timed_step,
warm_up, release) over ``batch.size`` concurrent sequences (``batch.lengths(context)`` tokens each, so ragged
batches work). It drives the model's forward itself, in the calling thread (the traffic counter is a dispatch mode
and must see every op of a step): never ``generate_batch``'s background thread or its scheduler. What it uses of
the installed release is what continuous batching uses there:

- the release's own ``PagedAttentionCache``, sized by the release's own configuration object (a GenerationConfig
  to 5.3, a ContinuousBatchingConfig from 5.4) to ``num_blocks`` whole blocks of the release's default size (32
  tokens to 5.3, 256 from 5.4) for every sequence's context + warm-up + steps + margin; blocks allocated by the
  cache's own allocator, the physical slot of every position taken from the cache's own index helper;
- the release's attention implementation for SDPA over a paged cache (``sdpa_paged`` 4.53-4.57, ``paged|sdpa``
  5.0-5.18, plain ``sdpa`` from 5.19, where SDPA recognises the cache), so that the cache's own ``update`` writes the
  new K/V at ``write_index`` and gathers every live sequence's K/V at ``read_index`` for attention, every layer,
  every step: the gather this class exists to measure (advanced indexing, ``index``, up to 5.5; ``index_select``
  from 5.6);
- the forward keywords the release's batch preparation hands the model (its ``get_model_kwargs``): packed
  ``input_ids``/``position_ids`` [1, N], cumulative query/key lengths, maximum lengths, read/write indices (one
  tensor, or one per layer group from 4.57), ``logits_indices``, the block-diagonal additive mask built by the
  release's own ``build_attention_mask`` (4.57+; before, its inline ``triu`` logic, copied), ``cache``,
  ``use_cache=False``, and whatever else that release passes (``block_tables``, ``block_table``, ``is_causal``,
  ``logits_to_keep``). 4.53-4.55 hand over their whole static buffers (a read index as long as the pool, padded
  with -1, and a mask as wide): so does this class there. Not passed: ``logits_processor_args`` (5.6+), which only
  the release's logits processors read, after the forward.

Per step nothing waits for the device: the sequences' lengths are host integers the point advances itself (every
sequence grows by one token a step), the read index is sliced from a slot table made once at build (one device
tensor per layer group), the write index looked up in it at the device-resident positions, the cumulative key
lengths advanced on the device, and the next tokens are the greedy argmax of the step's logits, kept there. The
release builds the same indices on the host and copies them over every step; the values are the same.

Sequence ``i`` is filled (and its first token drawn) from a generator seeded ``seed + i``, as a DecodePoint with
that seed and its length would be: at batch 1 the two decode the same tokens, and in a batch every sequence decodes
what it decodes alone (tests/measuring/test_paged.py).

Release differences are all here (:func:`release`); releases before 4.53 have no continuous batching and are
skipped with the reason (:func:`unsupported_reason`). Layer kinds: full attention only (the registry says so).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cache
from types import SimpleNamespace
from typing import Any, Callable

import torch

from kvcache.measuring import attention, compat
from kvcache.measuring.decode import FILL_CHUNK, DecodePoint

PAGED_SINCE = (4, 53)
PAGED_MODULE = "transformers.generation.continuous_batching"
REQUEST_ID = "kvcache-seq-{}"
GENERATION_CONFIG_BLOCK = 32  # the block size while a GenerationConfig sizes the pool (4.53-5.3)
UNBOUNDED_MEMORY = 2**62  # what the pool's memory probe reports while this point sizes the pool itself


def unsupported_reason(version: str | None = None) -> str | None:
    """Why ``paged`` cannot run on Transformers ``version`` (default: the installed one), in one line, or None."""
    text = version or compat.TRANSFORMERS
    if compat.InstalledVersion(text) < PAGED_SINCE:
        return (f"paged: transformers {text} has no PagedAttentionCache "
                f"(continuous batching arrived in {'.'.join(map(str, PAGED_SINCE))})")
    return None


@dataclass(frozen=True)
class PagedRelease:
    """How the installed release's continuous batching drives its paged cache for SDPA (see the module docstring).
    The attention name comes from the release's registry, ``update``'s form from its signature, the mask builder
    from its modules; the rest by release range, each range read off that release's continuous batching code
    (every release 4.53 ... 5.24)."""

    version: tuple[int, ...]
    cache_class: type
    attention: str  # the attention implementation continuous batching runs SDPA under
    whole_static: bool  # 4.53-4.55: the whole static buffers (read index padded with -1 to the pool, mask as wide)
    seqlens_keys: tuple[str, str]  # cumulative query/key lengths: cumulative_seqlens_* to 4.55, cu_seq_lens_* after
    max_keys: tuple[str, str]  # max_seqlen_q/k to 5.18, max_length_q/k from 5.19
    grouped_index: bool  # read/write index one tensor per layer group (a list) from 4.57
    k_by_type: bool  # cu_seq_lens_k / max_length_k as {layer type: value} from 5.19 (update picks its own)
    update_takes_kwargs: bool  # cache.update(key, value, layer, kwargs) from 5.19; read_index=, write_index= before
    index_dtype: torch.dtype  # int32 to 5.5, int64 from 5.6
    block_tables: bool  # passes the cache's block tables dict (to 4.56)
    block_table_key: bool  # passes block_table=None (5.4+: no kernel block table for SDPA)
    is_causal: bool  # passes is_causal=False (5.19+)
    logits_to_keep: bool  # the model slices its hidden states to logits_indices (5.13+, where the model takes it)
    mask_builder: Callable[..., None] | None  # the release's build_attention_mask (4.57+), else its inline logic


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _attention_name() -> str:
    """The name SDPA over a paged cache is registered under: ``sdpa_paged`` (4.53-4.57), ``paged|sdpa`` (5.0-5.18),
    else plain ``sdpa`` (5.19+: SDPA updates a paged cache it is handed)."""
    from transformers import modeling_utils

    interface = getattr(modeling_utils, "AttentionInterface", None)
    names = set(getattr(interface, "_global_mapping", {}) or {})
    for name in ("sdpa_paged", "paged|sdpa"):
        if name in names:
            return name
    return "sdpa"


def _mask_builder() -> Callable[..., None] | None:
    for module in ("utils", "input_outputs", "input_ouputs", "continuous_api"):
        found = getattr(_import(f"{PAGED_MODULE}.{module}"), "build_attention_mask", None)
        if found is not None:
            return found
    return None


def _takes_kwargs_dict(update: Callable[..., Any]) -> bool:
    """Whether ``update`` takes the forward keywords as one dict argument ``kwargs`` (5.19+), not as ``**kwargs``."""
    param = inspect.signature(update).parameters.get("kwargs")
    return param is not None and param.kind is not inspect.Parameter.VAR_KEYWORD


@cache
def release() -> PagedRelease:
    """The installed release's :class:`PagedRelease`, or :class:`compat.Unsupported` with the reason."""
    reason = unsupported_reason()
    if reason:
        raise compat.Unsupported(reason)
    module = _import(PAGED_MODULE)
    cache_class = getattr(module, "PagedAttentionCache", None)
    if cache_class is None:
        raise compat.Unsupported(f"paged: transformers {compat.TRANSFORMERS} has no PagedAttentionCache "
                                 f"in {PAGED_MODULE}")
    v = compat.VERSION
    return PagedRelease(
        version=v, cache_class=cache_class, attention=_attention_name(),
        whole_static=v < (4, 56),
        seqlens_keys=(("cumulative_seqlens_q", "cumulative_seqlens_k") if v < (4, 56)
                      else ("cu_seq_lens_q", "cu_seq_lens_k")),
        max_keys=("max_seqlen_q", "max_seqlen_k") if v < (5, 19) else ("max_length_q", "max_length_k"),
        grouped_index=v >= (4, 57), k_by_type=v >= (5, 19),
        update_takes_kwargs=_takes_kwargs_dict(cache_class.update),
        index_dtype=torch.int32 if v < (5, 6) else torch.int64,
        block_tables=v < (4, 57), block_table_key=v >= (5, 4), is_causal=v >= (5, 19), logits_to_keep=v >= (5, 13),
        mask_builder=_mask_builder() if v >= (4, 57) else None,
    )


def prepare() -> None:
    """The registry's ``prepare``: :class:`compat.Unsupported` (the class is skipped with the reason) where the
    installed release has no paged cache this class can drive."""
    release()


def build_inline_mask(attention_mask: torch.Tensor, cumulative_seqlens_q: list[int],
                      cumulative_seqlens_k: list[int]) -> None:
    """The block-diagonal mask as 4.53-4.56 build it inline in ``_build_tensors`` (copied; no sliding window then)."""
    min_value = torch.finfo(attention_mask.dtype).min
    for i in range(len(cumulative_seqlens_q) - 1):
        seqlen_q = cumulative_seqlens_q[i + 1] - cumulative_seqlens_q[i]
        seqlen_k = cumulative_seqlens_k[i + 1] - cumulative_seqlens_k[i]
        if seqlen_q < seqlen_k and seqlen_q >= 1:
            diagonal = cumulative_seqlens_k[i + 1] - seqlen_q + 1 - cumulative_seqlens_k[i]
        else:
            diagonal = 1
        query_range = slice(cumulative_seqlens_q[i], cumulative_seqlens_q[i + 1])
        key_range = slice(cumulative_seqlens_k[i], cumulative_seqlens_k[i + 1])
        block = torch.full(attention_mask[..., query_range, key_range].shape, min_value,
                           dtype=attention_mask.dtype, device=attention_mask.device)
        attention_mask[..., query_range, key_range] = torch.triu(block, diagonal=diagonal)


# --- building the release's cache ------------------------------------------------------------------------------

def _cache_config(params: dict[str, inspect.Parameter], blocks: int, block_size: int, batch_tokens: int) -> Any:
    """The configuration object the cache takes: a GenerationConfig (4.53-5.3: ``num_blocks``, ``block_size``,
    ``max_batch_tokens``) or a ContinuousBatchingConfig (5.4+), with the pool sized by this point, as many batch
    tokens as sequences, block sharing off and no kernel block table (SDPA has none)."""
    if "generation_config" in params:
        from transformers import GenerationConfig

        return GenerationConfig(num_blocks=blocks, block_size=block_size, max_batch_tokens=batch_tokens)
    wanted = dict(num_blocks=blocks, max_batch_tokens=batch_tokens, allow_block_sharing=False,
                  max_blocks_per_request=0, max_requests_per_batch=batch_tokens, max_memory_percent=0.9)
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    names = {f.name for f in fields(ContinuousBatchingConfig)} if is_dataclass(ContinuousBatchingConfig) else set(
        inspect.signature(ContinuousBatchingConfig).parameters)
    size_key = "page_size" if "page_size" in names else "block_size"
    return ContinuousBatchingConfig(**{size_key: block_size},
                                    **{k: value for k, value in wanted.items() if k in names})


def _default_block_size(params: dict[str, inspect.Parameter]) -> int:
    """The release's own default block (page) size: 32 where a GenerationConfig carries it (4.53-5.3), the
    ContinuousBatchingConfig default from 5.4 (256)."""
    if "generation_config" in params:
        return GENERATION_CONFIG_BLOCK
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    default = ContinuousBatchingConfig()
    return int(getattr(default, "page_size", None) or default.block_size)


@contextlib.contextmanager
def _pool_sized_here(cache_class: type) -> Iterator[None]:
    """While the pool is built: its memory probe (``PagedAttentionMemoryHandler.get_available_memory``) reports
    unbounded memory, and the module's logger says only errors. This point sizes the pool itself (``num_blocks``) and
    the suite checks free memory itself; the probe would read 0 on a CPU without psutil (a MemoryError) and empty the
    CUDA allocator cache on a GPU, and 4.55-4.56 log the pool's size as a warning every time one is built."""
    module = inspect.getmodule(cache_class)
    handler = getattr(module, "PagedAttentionMemoryHandler", None)
    logger = getattr(module, "logger", None)
    level = logger.level if isinstance(logger, logging.Logger) else None
    original = handler.__dict__.get("get_available_memory") if handler is not None else None
    if original is not None:
        handler.get_available_memory = lambda *args, **kwargs: UNBOUNDED_MEMORY
    if level is not None:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        if original is not None:
            handler.get_available_memory = original
        if level is not None:
            logger.setLevel(level)


def _distributed_helper() -> Any:
    """The DistributedHelper 5.9+ caches take: no device mesh (one process, nothing sharded)."""
    helper = _import(f"{PAGED_MODULE}.distributed").DistributedHelper
    params = inspect.signature(helper).parameters
    return helper(**{name: None for name, p in params.items() if p.default is inspect.Parameter.empty})


def new_cache(r: PagedRelease, model: Any, device: torch.device, dtype: torch.dtype,
              tokens: list[int]) -> tuple[Any, int]:
    """The release's PagedAttentionCache with room for ``tokens[i]`` tokens of every sequence (whole blocks of the
    release's default size), and that block size."""
    params = dict(inspect.signature(r.cache_class.__init__).parameters)
    block_size = _default_block_size(params)
    blocks = sum(math.ceil(n / block_size) for n in tokens)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    offered = {
        "config": config, "device": device, "dtype": dtype,
        "generation_config": None, "continuous_batching_config": None,
        "tp_size": None, "layer_device_map": None, "initial_prompt_shapes": None, "num_requests": len(tokens),
        "allow_block_sharing": False, "tp_plan": {},
        "model_supports_logits_to_keep": supports_logits_to_keep(model),
    }
    cache_config = _cache_config(params, blocks, block_size, len(tokens))
    offered["generation_config" if "generation_config" in params else "continuous_batching_config"] = cache_config
    if "distributed_helper" in params:
        offered["distributed_helper"] = _distributed_helper()
    kwargs = {name: offered[name] for name in params if name in offered}
    with _pool_sized_here(r.cache_class):
        return r.cache_class(**kwargs), block_size


def page_geometry(cache: Any) -> tuple[int, int] | None:
    """(KV heads, head dim) one token of one layer takes in the pool: the cache's own attributes (to 5.17), or its
    allocators' (5.18+)."""
    allocators = getattr(cache, "cache_allocators", None) or {}
    for holder in (cache, *allocators.values()):
        heads, dim = getattr(holder, "num_key_value_heads", None), getattr(holder, "head_dim", None)
        if heads and dim:
            return int(heads), int(dim)
    return None


def check_geometry(cache: Any, spec: Any) -> None:
    """:class:`compat.Unsupported` unless every layer caches K and V of the pool's geometry: the pool is sized from the
    config's KV heads and head dim, which a model caching something else (DeepSeek's latent) does not write."""
    geometry = page_geometry(cache)
    if geometry is None:
        return
    heads, dim = geometry
    for layer, shape in enumerate(spec.cached_shapes()):
        if shape is not None and tuple(shape) != (heads, dim, dim):
            raise compat.Unsupported(
                f"paged: transformers {compat.TRANSFORMERS}'s PagedAttentionCache holds {heads} KV heads x {dim} dims "
                f"per token and layer, {spec.name} caches {shape[0]} x {shape[1]} (keys) and {shape[2]} (values) "
                f"in layer {layer}")


def supports_logits_to_keep(model: Any) -> bool:
    """Whether the model slices its hidden states itself (``logits_to_keep``), as 5.13+ continuous batching asks."""
    supports = getattr(model, "_supports_logits_to_keep", None)
    return bool(callable(supports) and supports())


def allocate(cache: Any, request_id: str, tokens: int, block_size: int) -> None:
    """Blocks for ``tokens`` tokens of one sequence, through the cache's own allocator: ``allocate_blocks(n, id)``
    (4.53-4.57), ``allocate_blocks(n, id, allocated_blocks)`` (5.0-5.17), ``can_store_request_tokens(state, n)``
    (5.18+)."""
    if hasattr(cache, "can_store_request_tokens"):
        from transformers.generation.continuous_batching.requests import RequestState

        ok = cache.can_store_request_tokens(RequestState(request_id=request_id, initial_tokens=[]), tokens)
    else:
        blocks = math.ceil(tokens / block_size)
        if "allocated_blocks" in inspect.signature(cache.allocate_blocks).parameters:
            ok = cache.allocate_blocks(blocks, request_id, 0)
        else:
            ok = cache.allocate_blocks(blocks, request_id)
    if ok is None or ok is False:
        raise RuntimeError(f"paged: the pool could not allocate {tokens} tokens for {request_id}")


def slot_lists(cache: Any, request_id: str, tokens: int) -> list[list[int]]:
    """Per layer group, the physical cache slot of each of positions 0..tokens-1 of one sequence, from the cache's
    own index helper: ``_get_physical_indices`` (4.53-4.56), ``extend_write_indices`` (4.57-5.0),
    ``extend_read_and_write_indices`` (5.1+) asked to write ``tokens`` tokens from position 0."""
    if hasattr(cache, "_get_physical_indices"):
        return [cache._get_physical_indices(SimpleNamespace(request_id=request_id), list(range(tokens)))]
    groups = len(getattr(cache, "cache_allocators", None) or getattr(cache, "group_cache_managers", None) or [0])
    write: list[list[int]] = [[] for _ in range(groups)]
    if hasattr(cache, "extend_read_and_write_indices"):
        cache.extend_read_and_write_indices(request_id, 0, tokens, [[] for _ in range(groups)], write)
    else:
        cache.extend_write_indices(request_id, 0, tokens, write)
    return write


def layer_types(cache: Any) -> list[str]:
    """The layer types the cache's keyword dicts are keyed by (5.18+: one allocator per type)."""
    return list(getattr(cache, "cache_allocators", None) or ["full_attention"])


# --- the point -------------------------------------------------------------------------------------------------

@dataclass
class PagedPoint(DecodePoint):
    """A PagedAttentionCache of the installed release holding ``batch.size`` sequences, stepped one token each.

    ``position`` is the longest sequence's tokens; ``lengths`` every sequence's (host integers, advanced by the
    point: each step adds one token to every sequence). ``next_ids`` and ``position_ids`` are [1, N] on the device.
    """

    lengths: list[int] = field(default_factory=list)
    paged: PagedRelease | None = None
    slots: list[torch.Tensor] = field(default_factory=list)  # per layer group: [N, capacity] physical slots
    cu_q: torch.Tensor | None = None
    cu_k: torch.Tensor | None = None
    cu_k_step: torch.Tensor | None = None
    row_starts: torch.Tensor | None = None  # where each sequence's row starts in a flattened slot table
    logits_indices: torch.Tensor | None = None
    read_buffers: list[torch.Tensor] = field(default_factory=list)  # 4.53-4.55: the whole static read index
    mask_buffer: torch.Tensor | None = None  # 4.53-4.55: the whole static mask
    keeps_logits: bool = False  # the model takes logits_to_keep (5.13+ hand it logits_indices)

    def build(self) -> PagedPoint:
        """Make the release's paged cache with room for every sequence, fill each to its length (untimed), switch the
        model to the release's paged SDPA and pick the first input token of every sequence."""
        r = self.paged = release()  # Unsupported with the reason where this release has no paged cache to drive
        if getattr(self.model, "_supports_attention_backend", True) is False:
            raise compat.Unsupported(f"paged: {type(self.model).__name__} runs its own attention code, not a "
                                     "registered attention function, so it cannot read a paged cache")
        device, dtype = self.device.torch_device, next(self.model.parameters()).dtype
        n = self.batch.size
        self.lengths = self.batch.lengths(self.context)
        extra = self.max_tokens - self.context  # warm-up + steps + margin, for every sequence
        capacity = [length + extra for length in self.lengths]
        self.cache, block_size = new_cache(r, self.model, device, dtype, capacity)
        check_geometry(self.cache, self.spec)
        tables = []
        for i, tokens in enumerate(capacity):
            allocate(self.cache, REQUEST_ID.format(i), tokens, block_size)
            tables.append(slot_lists(self.cache, REQUEST_ID.format(i), tokens))
        width = max(capacity)
        self.slots = [torch.tensor([table[g] + [0] * (width - len(table[g])) for table in tables],
                                   dtype=r.index_dtype).to(device) for g in range(len(tables[0]))]
        tokens = []
        with torch.inference_mode():
            for i in range(n):  # sequence i: its K/V, then its first token, from a generator seeded seed + i
                gen = torch.Generator(device="cpu").manual_seed(self.seed + i)
                if self.fill == "synthetic":
                    self._fill_synthetic(i, gen, dtype)
                else:
                    self._fill_prefill(i, gen)
                tokens.append(torch.randint(1, self.spec.vocab, (1, 1), generator=gen))
            self.next_ids = torch.cat(tokens, dim=1).to(device)
            self.position_ids = torch.tensor([self.lengths], device=device)
            self.cu_q = torch.arange(n + 1, dtype=torch.int32, device=device)
            self.cu_k = torch.tensor(_cumulative([length + 1 for length in self.lengths]), dtype=torch.int32,
                                     device=device)
            self.cu_k_step = torch.arange(n + 1, dtype=torch.int32, device=device)
            self.row_starts = torch.arange(n, device=device) * width
            self.logits_indices = torch.arange(n, dtype=r.index_dtype, device=device)
            if r.whole_static:
                pool = _pool_slots(self.cache)
                self.read_buffers = [torch.empty(pool, dtype=r.index_dtype, device=device) for _ in self.slots]
                self.mask_buffer = torch.empty(1, 1, n, pool, dtype=dtype, device=device)
        # the release's paged SDPA, or the paged implementation this key names (``paged@paged|eager``: --kv-attn)
        chosen = self.cache_spec.attention
        named = attention.SEPARATOR in self.cache_spec.name and attention.paging(chosen)
        compat.set_attention(self.model, chosen if named else r.attention)
        self.keeps_logits = supports_logits_to_keep(self.model)
        self.position = max(self.lengths)
        self.device.sync()
        return self

    # --- filling ---
    def _write(self, layer: int, keys: torch.Tensor, values: torch.Tensor, writes: list[torch.Tensor]) -> None:
        """Write K/V ([1, heads, n, dim]) at the slots ``writes`` (one tensor per group) through the cache's own
        ``update``, reading nothing back (an empty read index)."""
        r = self.paged
        reads = [w[:0] for w in writes]
        if r.update_takes_kwargs:
            n = keys.shape[-2]
            lengths = torch.tensor([0, n], dtype=torch.int32, device=keys.device)
            types = layer_types(self.cache)
            kwargs = {r.seqlens_keys[1]: {t: lengths for t in types}, r.max_keys[1]: {t: n for t in types},
                      "read_index": reads, "write_index": writes}
            self.cache.update(keys, values, layer, kwargs)
        elif r.grouped_index:
            self.cache.update(keys, values, layer, read_index=reads, write_index=writes)
        else:
            self.cache.update(keys, values, layer, read_index=reads[0], write_index=writes[0])

    def _fill_synthetic(self, i: int, gen: torch.Generator, dtype: torch.dtype) -> None:
        """Random non-zero K/V for every token of sequence ``i``, every layer, in chunks (O(its length)), drawn as
        DecodePoint draws them, written through the cache's ``update``."""
        shapes = self.spec.cached_shapes()
        device = self.device.torch_device
        length = self.lengths[i]
        for start in range(0, length, FILL_CHUNK):
            n = min(FILL_CHUNK, length - start)
            writes = [slots[i, start:start + n] for slots in self.slots]
            for layer, shape in enumerate(shapes):
                if shape is None:
                    continue
                heads, key_dim, value_dim = shape
                k = torch.randn(1, heads, n, key_dim, generator=gen).to(device, dtype)
                v = torch.randn(1, heads, n, value_dim, generator=gen).to(device, dtype)
                self._write(layer, k, v, writes)

    def _fill_prefill(self, i: int, gen: torch.Generator) -> None:
        """A real forward over sequence ``i``'s random tokens (plain SDPA into a DynamicCache, as DecodePoint's
        prefill), its K/V then written into the paged cache through ``update``."""
        device = self.device.torch_device
        length = self.lengths[i]
        compat.set_attention(self.model, "sdpa")
        ids = torch.randint(1, self.spec.vocab, (1, length), generator=gen).to(device)
        dynamic = compat.new_dynamic_cache(self.model.config)
        kwargs = compat.decode_kwargs(self.model, dynamic, 0, device)
        kwargs["position_ids"] = torch.arange(length, device=device)[None]
        if "cache_position" in kwargs:
            kwargs["cache_position"] = torch.arange(length, device=device)
        out = self.model(input_ids=ids, **kwargs)
        dynamic = compat.cache_from_output(out) or dynamic
        for layer, shape in enumerate(self.spec.cached_shapes()):
            if shape is not None:
                keys, values = compat.layer_kv(dynamic, layer)
                self._write(layer, keys, values, [slots[i, :length] for slots in self.slots])

    # --- stepping ---
    def forward_kwargs(self) -> dict[str, Any]:
        """The keywords the release's batch preparation hands the model for this decode step (see the module
        docstring): built from the host lengths and device tensors, nothing copied from the host."""
        r = self.paged
        n = self.batch.size
        seqlens_k = [length + 1 for length in self.lengths]
        cu_q, cu_k = list(range(n + 1)), _cumulative(seqlens_k)
        total_k = cu_k[-1]
        # This step's slot of every sequence: the slot table's entry at its position (a lookup of N entries)
        entries = self.position_ids.view(n) + self.row_starts
        writes = [slots.view(-1).index_select(0, entries) for slots in self.slots]
        if n == 1:
            reads = [slots[0, :seqlens_k[0]] for slots in self.slots]
        else:
            reads = [torch.cat([slots[i, :k] for i, k in enumerate(seqlens_k)]) for slots in self.slots]
        dtype = next(self.model.parameters()).dtype
        if r.whole_static:  # reset_static_tensors + _build_tensors: the whole buffers, every step
            for buffer, read in zip(self.read_buffers, reads):
                buffer.fill_(-1)
                buffer[:total_k] = read
            reads = self.read_buffers
            mask = self.mask_buffer
            mask.fill_(torch.finfo(dtype).min)
        else:
            mask = torch.full((1, 1, n, total_k), torch.finfo(dtype).min, dtype=dtype, device=self.device.torch_device)
        if r.mask_builder is not None:
            r.mask_builder(attention_mask=mask, cumulative_seqlens_q=cu_q, cumulative_seqlens_k=cu_k, sliding_window=1)
        else:
            build_inline_mask(mask, cu_q, cu_k)
        types = layer_types(self.cache)
        kwargs: dict[str, Any] = {
            "input_ids": self.next_ids, "position_ids": self.position_ids, "attention_mask": mask,
            r.seqlens_keys[0]: self.cu_q,
            r.seqlens_keys[1]: {t: self.cu_k for t in types} if r.k_by_type else self.cu_k,
            r.max_keys[0]: 1,
            r.max_keys[1]: {t: max(seqlens_k) for t in types} if r.k_by_type else max(seqlens_k),
            "read_index": reads if r.grouped_index else reads[0],
            "write_index": writes if r.grouped_index else writes[0],
            "logits_indices": self.logits_indices, "cache": self.cache, "use_cache": False,
        }
        if r.block_tables:
            kwargs["block_tables"] = self.cache._block_tables
        if r.block_table_key:
            kwargs["block_table"] = None
        if r.is_causal:
            kwargs["is_causal"] = False
        if r.logits_to_keep and self.keeps_logits:
            kwargs["logits_to_keep"] = self.logits_indices
        return kwargs

    def step(self) -> torch.Tensor:
        """One decode step: one new token for every sequence, the greedy argmax of the last step's logits. Nothing in
        it waits for the device."""
        with torch.inference_mode():
            kwargs = self.forward_kwargs()
            logits = self.model(**kwargs).logits
            if "logits_to_keep" not in kwargs:
                logits = logits[:, self.logits_indices]
            self.next_ids = logits.argmax(-1)
            self.position_ids.add_(1)
            self.cu_k.add_(self.cu_k_step)
        self.lengths = [length + 1 for length in self.lengths]
        self.position = max(self.lengths)
        return logits

    def release(self) -> None:
        super().release()
        self.slots, self.read_buffers = [], []
        self.cu_q = self.cu_k = self.cu_k_step = self.row_starts = self.logits_indices = self.mask_buffer = None


def _cumulative(values: list[int]) -> list[int]:
    out = [0]
    for value in values:
        out.append(out[-1] + value)
    return out


def _pool_slots(cache: Any) -> int:
    """Token slots of the pool the whole-static read index spans (4.53-4.55: ``num_blocks * block_size``)."""
    return int(cache.num_blocks * cache.block_size)
