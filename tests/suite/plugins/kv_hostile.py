"""A pytest plugin for tests (``-p kv_hostile``): DynamicCache registered through the public plug-in API
(:func:`kvcache.caches.register_cache`) under a name made of terminal controls, :data:`NAME`: ESC sequences that
clear the screen and turn red, and a carriage return that would overwrite the line with a forged one."""

from __future__ import annotations

from typing import Any

from transformers import cache_utils

from kvcache.caches import register_cache

NAME = "dyn\x1b[2J\x1b[31mamic\rregression: none"


def build(request: Any) -> Any:
    from kvcache.measuring import compat

    return compat.new_cache(cache_utils.DynamicCache, request.config)


register_cache(NAME, build, in_all=False, replace=True, description="test-only: DynamicCache under a hostile name")
