"""The public face of the cache registry: what a user's ``conftest.py`` or package needs to add a cache
class (see :mod:`kvcache.measuring.caches`, where the registry lives)::

    from kvcache.caches import register_cache

    register_cache("mine", lambda request: MyCache(), description="my cache")
"""

from kvcache.measuring.caches import (
    ENTRY_POINT_GROUP,
    CacheError,
    CacheRequest,
    CacheSpec,
    get,
    parse_caches,
    register_cache,
    registry,
)

__all__ = ["ENTRY_POINT_GROUP", "CacheError", "CacheRequest", "CacheSpec", "get", "parse_caches", "register_cache",
           "registry"]
