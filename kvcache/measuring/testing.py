"""Test-only cache classes for checking the gates: a clean dynamic cache and its twin with one planted
extra full copy of K and V per step (+2 passes: the copy reads the cache and writes it again).
Registered as ``twin-clean`` and ``twin-planted`` by the suite's ``benchmarks/conftest.py`` (never by the
production registry); not part of ``--kv-caches all``."""

from __future__ import annotations

from typing import Any

from transformers import cache_utils


class PlantedCopyCache(cache_utils.DynamicCache):
    """DynamicCache that clones the whole of K and V after every append: one extra read + write."""

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        return keys.clone(), values.clone()


def register() -> None:
    """Register the twins (again: idempotent)."""
    from kvcache.measuring.caches import _dynamic, register_cache

    def planted(req: Any) -> Any:
        from kvcache.measuring import compat

        return compat.new_cache(PlantedCopyCache, req.config)

    register_cache("twin-clean", _dynamic, in_all=False, replace=True,
                   description="test-only: DynamicCache, the clean twin of twin-planted")
    register_cache("twin-planted", planted, in_all=False, memory_factor=3.0, replace=True,
                   description="test-only: DynamicCache plus one planted full copy of K/V per step (+2 passes)")
