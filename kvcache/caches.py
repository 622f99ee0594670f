"""The public face of the cache registry: everything a user's ``conftest.py``, ``-p`` module or package needs to add a
cache class (:func:`register_cache`, :class:`Unsupported`, ...; the registry is :mod:`kvcache.measuring.caches`,
the reference docs/cache-classes.md). Importing it imports neither torch nor transformers."""

from kvcache.measuring.caches import ENTRY_POINT_GROUP, CacheError, get, parse_caches, register_cache, registry
from kvcache.measuring.cachespec import CacheRequest, CacheSpec, Unsupported

__all__ = ["ENTRY_POINT_GROUP", "CacheError", "CacheRequest", "CacheSpec", "Unsupported", "get", "parse_caches",
           "register_cache", "registry"]
