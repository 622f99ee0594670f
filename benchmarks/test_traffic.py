"""Counted traffic: the bytes one decode step's tensor operations read and write, per cache class,
at two contexts (the slope is exact), and the attention probe. Deterministic: no timing involved."""

import pytest

from kvcache.session import Skip


@pytest.mark.counted
def test_traffic(kv, kv_cache):
    try:
        result = kv.count(kv_cache)
    except Skip as exc:
        pytest.skip(str(exc))
    assert result["passes"] > 0
