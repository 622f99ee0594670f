"""A cache's storage in any release: the K/V a cache holds for a layer (layer objects from 4.54, the
``key_cache``/``value_cache`` lists before), filling a layer through ``update``, the tokens held and the bytes
stored. Every read or write of a cache's per-layer storage (``layers[i].keys``, ``key_cache[i]``) is here,
nowhere else."""

from __future__ import annotations

from typing import Any

import torch


def has_layer_objects(cache: Any) -> bool:
    """Whether ``cache`` keeps one layer object per layer (``cache.layers``, 4.54+) rather than the lists
    ``key_cache``/``value_cache`` (4.45-4.53)."""
    return hasattr(cache, "layers")


def layer_kv(cache: Any, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V tensors a cache holds for one layer, in any release."""
    if has_layer_objects(cache):
        return layer_kv_from_layers(cache, layer_idx)
    return layer_kv_from_lists(cache, layer_idx)


def store_layer_kv(cache: Any, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Make ``keys``/``values`` what the release's cache reports for ``layer_idx`` (its length, its masks),
    without copying them: how :class:`kvcache.measuring.fixed.InplaceCache` hands over views of its buffer."""
    if has_layer_objects(cache):
        store_layer_kv_in_layers(cache, layer_idx, keys, values)
    else:
        store_layer_kv_in_lists(cache, layer_idx, keys, values)


def layer_kv_from_layers(cache: Any, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """4.54+: ``cache.layers[i].keys`` / ``.values``."""
    layer = cache.layers[layer_idx]
    return layer.keys, layer.values


def layer_kv_from_lists(cache: Any, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """4.45-4.53: ``cache.key_cache[i]`` / ``cache.value_cache[i]``."""
    return cache.key_cache[layer_idx], cache.value_cache[layer_idx]


def add_layers(cache: Any, layer_idx: int) -> None:
    """4.54+: give a layered cache layer objects up to ``layer_idx``. 4.56+ caches built without a config
    replicate ``layer_class_to_replicate`` (what ``Cache.update`` does lazily); 4.54-4.55 ``append_new_layers``."""
    layers = cache.layers
    if len(layers) > layer_idx:
        return
    replicate = getattr(cache, "layer_class_to_replicate", None)
    if replicate is not None:
        while len(layers) <= layer_idx:
            layers.append(replicate())
    elif hasattr(cache, "append_new_layers"):
        cache.append_new_layers(layer_idx)


def store_layer_kv_in_layers(cache: Any, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """4.54+: set ``layers[i].keys``/``.values`` and mark the layer initialised (5.x layers allocate lazily and
    take their device from the first update)."""
    add_layers(cache, layer_idx)
    layer = cache.layers[layer_idx]
    layer.keys, layer.values = keys, values
    if not getattr(layer, "is_initialized", True):
        layer.device = keys.device
    layer.is_initialized = True


def store_layer_kv_in_lists(cache: Any, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """4.45-4.53: set ``key_cache[i]``/``value_cache[i]`` (empty tensors stand in for layers not yet seen) and,
    for layer 0, ``_seen_tokens``, which those releases read as the cache's length."""
    while len(cache.key_cache) <= layer_idx:
        cache.key_cache.append(torch.tensor([], dtype=keys.dtype, device=keys.device))
        cache.value_cache.append(torch.tensor([], dtype=values.dtype, device=values.device))
    cache.key_cache[layer_idx], cache.value_cache[layer_idx] = keys, values
    if hasattr(cache, "_seen_tokens") and layer_idx == 0:
        cache._seen_tokens = keys.shape[-2]


# --- filling and measuring caches through their public methods -------------------------------------------

def seq_length(cache: Any) -> int:
    """Tokens held (5.4+ returns a 0-dim tensor; up to 5.3 StaticCache counts non-zero rows)."""
    return int(cache.get_seq_length())


def fill_layer(cache: Any, layer_idx: int, keys: torch.Tensor, values: torch.Tensor, start: int) -> None:
    """Write ``keys``/``values`` ([batch, kv_heads, n, head_dim]) at positions ``start..start+n`` of a layer.

    Uses ``cache.update`` with a positional ``cache_kwargs`` dict (accepted by every release; StaticCache up
    to 4.53 requires it, from 5.4 it ignores ``cache_position`` and writes at its own counter, so fill in
    order from slot 0).
    """
    n = keys.shape[-2]
    position = torch.arange(start, start + n, device=keys.device)
    cache.update(keys, values, layer_idx, {"cache_position": position})


def stored_bytes(cache: Any) -> int:
    """Bytes a cache actually stores: every distinct tensor its layer objects (4.54+) or its ``key_cache`` /
    ``value_cache`` lists (up to 4.53; a PagedAttentionCache's pools up to 5.17) hold, quantized data and scales
    included (a tensor subclass that wraps others, like optimum-quanto's packed int4 tensors, by the tensors it
    wraps), each once (a view of a buffer counts the part it spans); a PagedAttentionCache from 5.18 keeps one flat
    ``cache_tensor`` (the whole pool, its two trash sectors included)."""
    seen: set[tuple] = set()
    total = 0

    def visit(value: Any, depth: int = 0) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor) and hasattr(value, "__tensor_flatten__"):
            for name in value.__tensor_flatten__()[0]:  # a wrapper subclass (optimum-quanto's): its inner tensors
                visit(getattr(value, name), depth)
        elif isinstance(value, torch.Tensor):
            if value.numel() > 1:  # scalars (lengths, windows) are bookkeeping, not storage
                key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape),
                       tuple(value.stride()))
                if key not in seen:
                    seen.add(key)
                    total += value.numel() * value.element_size()
        elif depth < 4 and isinstance(value, dict):  # hqq: (data, {scale, zero, ...}) per layer
            for item in value.values():
                visit(item, depth + 1)
        elif depth < 4 and isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth + 1)
        elif depth < 2 and hasattr(value, "__dict__") and not isinstance(value, type):
            for item in vars(value).values():
                visit(item, depth + 1)

    if has_layer_objects(cache):
        layers = cache.layers
    elif hasattr(cache, "key_cache"):
        layers = [cache.key_cache, cache.value_cache]
    else:  # a PagedAttentionCache from 5.18: one flat pool for every layer
        layers = [getattr(cache, "cache_tensor", None)]
    for layer in layers:
        visit(layer, 1)
    return total
