"""Caches without the extra copies, as classes: :class:`InplaceCache` (``inplace``: the new token written in place,
attention given a view of the filled part) and :class:`StaticSlicedCache` with :func:`sliced_sdpa`
(``static-sliced``: views of the filled slots, grouped-query attention run natively). docs/cache-classes.md."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from transformers import cache_utils

from kvcache.measuring import compat

SLICED_ATTENTION = "kvcache_sliced_sdpa"


class InplaceCache(cache_utils.DynamicCache):
    """DynamicCache that appends by writing into a preallocated buffer (doubling when full)."""

    def __init__(self, config: Any = None, capacity: int = 0, **kwargs: Any) -> None:
        super().__init__(**compat.dynamic_init_kwargs(config, **kwargs))
        self.capacity = int(capacity)
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._lengths: dict[int, int] = {}
        self.growths = 0

    def _grow(self, layer_idx: int, like_k: torch.Tensor, like_v: torch.Tensor, needed: int) -> None:
        old = self._buffers.get(layer_idx)
        capacity = max(self.capacity, needed)
        if old is not None:
            capacity = max(capacity, 2 * old[0].shape[-2])
            self.growths += 1
        shape_k = (*like_k.shape[:-2], capacity, like_k.shape[-1])
        shape_v = (*like_v.shape[:-2], capacity, like_v.shape[-1])
        new_k = torch.empty(shape_k, dtype=like_k.dtype, device=like_k.device)
        new_v = torch.empty(shape_v, dtype=like_v.dtype, device=like_v.device)
        if old is not None:
            n = self._lengths[layer_idx]
            new_k[..., :n, :].copy_(old[0][..., :n, :])
            new_v[..., :n, :].copy_(old[1][..., :n, :])
        self._buffers[layer_idx] = (new_k, new_v)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: Any = None, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        n = self._lengths.get(layer_idx, 0)
        end = n + key_states.shape[-2]
        buffer = self._buffers.get(layer_idx)
        if buffer is None or end > buffer[0].shape[-2]:
            self._grow(layer_idx, key_states, value_states, end)
            buffer = self._buffers[layer_idx]
        buffer[0][..., n:end, :].copy_(key_states)
        buffer[1][..., n:end, :].copy_(value_states)
        self._lengths[layer_idx] = end
        keys, values = buffer[0][..., :end, :], buffer[1][..., :end, :]
        compat.store_layer_kv(self, layer_idx, keys, values)
        return keys, values


class StaticSlicedCache(cache_utils.StaticCache):
    """StaticCache whose ``update`` hands attention only the filled slots (a view, no copy)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._filled: dict[int, int] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: Any = None, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().update(key_states, value_states, layer_idx, cache_kwargs, *args, **kwargs)
        filled = self._filled.get(layer_idx, 0) + key_states.shape[-2]
        self._filled[layer_idx] = filled
        return keys[:, :, :filled], values[:, :, :filled]


def sliced_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA over the K/V it is given (the filled slots), without expanding K/V to all query heads.

    The mask the model built covers the whole static buffer; it is cut to the filled length. For a
    single query token the query heads sharing a KV head become rows of one query ([B, kv_heads,
    groups, D]), so plain SDPA reads each KV head once; longer queries use ``enable_gqa``.
    """
    batch, heads, q_len, head_dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[-2]
    groups = heads // kv_heads
    mask = attention_mask[..., :kv_len] if attention_mask is not None else None
    if groups > 1 and q_len == 1 and (mask is None or mask.shape[1] == 1):
        packed = query.reshape(batch, kv_heads, groups, head_dim)
        out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
        out = out.reshape(batch, heads, q_len, head_dim)
    else:
        causal = mask is None and q_len > 1
        extra = {"enable_gqa": True} if groups > 1 else {}
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout,
                                             is_causal=causal, scale=scaling, **extra)
    return out.transpose(1, 2).contiguous(), None


def register_sliced_attention() -> None:
    """Register :func:`sliced_sdpa` (and the SDPA mask builder for its name); Unsupported up to 4.47."""
    compat.register_attention(SLICED_ATTENTION, sliced_sdpa, with_sdpa_mask=True)
