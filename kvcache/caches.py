"""The public face of the cache registry: everything a user's ``conftest.py``, ``-p`` module or package needs to add a
cache class (:func:`register_cache`, :class:`Unsupported`, ...; the registry is :mod:`kvcache.measuring.caches`,
the reference docs/cache-classes.md), a class that hooks the model included (``fill_context=``,
``decode_context=``; :func:`register_press` for a kvpress press). Importing it imports neither torch nor
transformers: what a class with its own point (``point=``) builds on, :class:`DecodePoint`, :class:`PointSkip` (a
point that cannot run here: a skip with the reason), :class:`BatchShape` (its ``batch=``) and :func:`tokens_needed`,
are imported from :mod:`kvcache.measuring.decode` when first named."""

from typing import TYPE_CHECKING, Any

from kvcache.measuring.batch import BatchShape
from kvcache.measuring.caches import ENTRY_POINT_GROUP, CacheError, get, parse_caches, register_cache, registry
from kvcache.measuring.cachespec import CacheRequest, CacheSpec, Unsupported
from kvcache.measuring.hooks import HookError
from kvcache.measuring.presses import register_press

if TYPE_CHECKING:
    from kvcache.measuring.decode import DecodePoint, PointSkip, tokens_needed

#: Names imported on first use, from the module that holds them (it imports torch).
LAZY = {"DecodePoint": "kvcache.measuring.decode", "PointSkip": "kvcache.measuring.decode",
        "tokens_needed": "kvcache.measuring.decode"}

__all__ = ["ENTRY_POINT_GROUP", "BatchShape", "CacheError", "CacheRequest", "CacheSpec", "DecodePoint", "HookError",
           "PointSkip", "Unsupported", "get", "parse_caches", "register_cache", "register_press", "registry",
           "tokens_needed"]


def __getattr__(name: str) -> Any:
    if name in LAZY:
        import importlib

        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'kvcache.caches' has no attribute {name!r}")
