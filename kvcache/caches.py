"""The public face of the cache registry: everything a user's ``conftest.py``, ``-p`` module or package needs to
add a cache class (the registry lives in :mod:`kvcache.measuring.caches`, the records in
:mod:`kvcache.measuring.cachespec`; docs/cache-classes.md is the reference)::

    from kvcache.caches import Unsupported, register_cache

    def needs_cuda() -> None:
        import torch

        if not torch.cuda.is_available():
            raise Unsupported("mine needs CUDA")  # the class is skipped with this reason

    register_cache("mine", lambda request: MyCache(), prepare=needs_cuda, description="my cache")

Importing it imports neither torch nor transformers.
"""

from kvcache.measuring.caches import ENTRY_POINT_GROUP, CacheError, get, parse_caches, register_cache, registry
from kvcache.measuring.cachespec import CacheRequest, CacheSpec, Unsupported

__all__ = ["ENTRY_POINT_GROUP", "CacheError", "CacheRequest", "CacheSpec", "Unsupported", "get", "parse_caches",
           "register_cache", "registry"]
