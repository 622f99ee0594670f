"""A B-side plug-in for ``kvcache ab`` and ``make gate-power`` (``-p kvcache.testing.twin_layout``): ``dynamic``
replaced (``replace=True``) by a DynamicCache whose K and V are kept token-major, ``[batch, tokens, heads,
head_dim]``, and handed to attention as transposed views, ``[batch, heads, tokens, head_dim]`` with non-contiguous
strides. It moves exactly the counted bytes of ``dynamic`` (the ``cat`` of each step reads the cache and writes it
again, 2.00 passes; attention reads it once, 1.00), in the same ops, but attention reads K and V across strides: a
kernel-level slowdown with no counted byte, what a new torch or Transformers release can ship and only timed figures can
see. Test-only: loaded by ``-p`` alone."""

from __future__ import annotations

from typing import Any

import torch
from transformers import cache_utils


class TokenMajorLayer(cache_utils.DynamicLayer):
    """A DynamicLayer that stores K/V token-major and exposes them (``keys``, ``values``) as head-major views."""

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._k, self._v = key_states.transpose(1, 2), value_states.transpose(1, 2)
        else:
            self._k = torch.cat([self._k, key_states.transpose(1, 2)], dim=1)
            self._v = torch.cat([self._v, value_states.transpose(1, 2)], dim=1)
        self.keys, self.values = self._k.transpose(1, 2), self._v.transpose(1, 2)
        return self.keys, self.values


def token_major_cache(request: Any) -> Any:
    """A DynamicCache of this release whose full-attention layers are :class:`TokenMajorLayer`."""
    from kvcache.measuring import compat

    cache = compat.new_cache(cache_utils.DynamicCache, request.config)
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise compat.Unsupported("this transformers release has no cache layers (DynamicLayer) to keep token-major")
    cache.layers = [TokenMajorLayer() if type(layer) is cache_utils.DynamicLayer else layer for layer in layers]
    if getattr(cache, "layer_class_to_replicate", None) is cache_utils.DynamicLayer:
        cache.layer_class_to_replicate = TokenMajorLayer
    return cache


def register() -> None:
    from kvcache.measuring.caches import register_cache

    register_cache("dynamic", token_major_cache, replace=True,
                   description="test-only B side: DynamicCache kept token-major, handed to attention as transposed "
                               "views (same counted bytes, slower attention)")


register()
