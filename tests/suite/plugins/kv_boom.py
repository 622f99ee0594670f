"""A cache class whose step raises (a test plug-in: ``-p kv_boom``): its counted point fails, and the run records
the class in ``kv.session.failed`` with the error's first line in ``kv.session.reasons``."""

from transformers import DynamicCache

from kvcache.caches import register_cache


class Boom(DynamicCache):
    def update(self, *args, **kwargs):
        raise ValueError("boom: this class cannot update")


register_cache("boom", lambda request: Boom(), description="raises on update (a test of failed classes)")
