"""A B-side plug-in for ``kvcache ab`` and ``make gate-power`` (``-p kvcache.testing.twin_copy``): ``dynamic``
replaced (``replace=True``) by the planted copy twin (:class:`kvcache.testing.classes.PlantedCopyCache`: one
extra full copy of K and V per step, +2.00 counted passes, ``clone``). Test-only: loaded by ``-p`` alone."""

from __future__ import annotations

from typing import Any


def register() -> None:
    from kvcache.measuring import compat
    from kvcache.measuring.caches import register_cache
    from kvcache.testing.classes import PlantedCopyCache

    def planted(request: Any) -> Any:
        return compat.new_cache(PlantedCopyCache, request.config)

    register_cache("dynamic", planted, memory_factor=3.0, replace=True,
                   description="test-only B side: DynamicCache plus one planted full copy of K/V per step (+2 passes)")


register()
