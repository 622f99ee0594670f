"""A pytest plugin for tests (``-p kv_leaks``), also imported by tests directly: leaking cache classes the suite never
saw, registered through the public plug-in API (:func:`kvcache.caches.register_cache`), whose memory figures are
known in advance. Each is a DynamicCache that moves exactly the bytes DynamicCache moves (3.00 counted passes: no op
is added) but keeps references it should have dropped:

- ``leak-previous``: keeps the previous step's K and V of every layer alive beside the new ones. After a step the
  cache holds its K/V twice over (the new ``cat`` result and the one before it): ``held_passes`` 2.00 where
  DynamicCache holds 1.00; it allocates what DynamicCache allocates (``allocated_passes`` 1.00).
- ``leak-previous-keys``: the same with K only (half of the KV bytes): ``held_passes`` 1.50.
"""

from __future__ import annotations

from typing import Any

from transformers import cache_utils

from kvcache.caches import register_cache


class LeakPreviousCache(cache_utils.DynamicCache):
    """DynamicCache that keeps the K/V its last two updates returned, per layer: the current ones (the cache's own)
    and the previous step's, which DynamicCache would have freed."""

    KEEP_VALUES = True

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        kept = self.__dict__.setdefault("_kept", {}).setdefault(layer_idx, [])
        kept.append((keys, values) if self.KEEP_VALUES else (keys,))
        del kept[:-2]
        return keys, values


class LeakPreviousKeysCache(LeakPreviousCache):
    """:class:`LeakPreviousCache` keeping only the previous step's keys."""

    KEEP_VALUES = False


def _build(cls: type) -> Any:
    def build(request: Any) -> Any:
        from kvcache.measuring import compat

        return compat.new_cache(cls, request.config)
    return build


def register() -> None:
    """Register both leaking classes (again: idempotent)."""
    register_cache("leak-previous", _build(LeakPreviousCache), in_all=False, replace=True,
                   description="test-only: DynamicCache keeping the previous step's K/V alive (held 2.00)")
    register_cache("leak-previous-keys", _build(LeakPreviousKeysCache), in_all=False, replace=True,
                   description="test-only: DynamicCache keeping the previous step's keys alive (held 1.50)")


register()
