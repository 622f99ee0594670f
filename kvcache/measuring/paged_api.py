"""What the installed release's continuous batching offers the ``paged`` class, and how it is driven there.

:func:`installed_api` reads the release once into a :class:`PagedAPI` (the attention name from its registry,
``update``'s form from its signature, the mask builder from its modules, the rest by release range); the
functions below build the release's ``PagedAttentionCache`` for a point (:func:`new_paged_cache`), allocate its blocks
(:func:`allocate`) and read the physical slot of every position from the cache's own index helpers
(:func:`slot_lists`). The point that steps the cache is :class:`kvcache.measuring.paged_point.PagedPoint`; the
release-by-release table is in docs/releases.md.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from functools import cache
from types import SimpleNamespace
from typing import Any, Callable

import torch

from kvcache.measuring import compat

PAGED_MODULE = "transformers.generation.continuous_batching"
GENERATION_CONFIG_BLOCK = 32  # the block size while a GenerationConfig sizes the pool (4.53-5.3), tokens
UNBOUNDED_MEMORY = 2**62  # bytes the pool's memory probe reports while a point sizes the pool itself


@dataclass(frozen=True)
class PagedAPI:
    """How the installed release's continuous batching drives its paged cache for SDPA. Each field's comment
    names the releases it holds for (read off every release's continuous batching code, 4.53 ... 5.24)."""

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
def installed_api() -> PagedAPI:
    """The installed release's :class:`PagedAPI`, or :class:`compat.Unsupported` with the reason where it has no
    ``PagedAttentionCache`` (the release gate itself is :func:`kvcache.measuring.paged_point.unsupported_reason`)."""
    module = _import(PAGED_MODULE)
    cache_class = getattr(module, "PagedAttentionCache", None)
    if cache_class is None:
        raise compat.Unsupported(f"paged: transformers {compat.TRANSFORMERS} has no PagedAttentionCache "
                                 f"in {PAGED_MODULE}")
    v = compat.VERSION
    return PagedAPI(
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


def new_paged_cache(r: PagedAPI, model: Any, device: torch.device, dtype: torch.dtype,
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


def cache_layer_types(cache: Any) -> list[str]:
    """The layer types the cache's keyword dicts are keyed by (5.18+: one allocator per type)."""
    return list(getattr(cache, "cache_allocators", None) or ["full_attention"])


def pool_slots(cache: Any) -> int:
    """Token slots of the pool the whole-static read index spans (4.53-4.55: ``num_blocks * block_size``)."""
    return int(cache.num_blocks * cache.block_size)
