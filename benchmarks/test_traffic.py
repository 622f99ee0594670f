"""Counted traffic: the bytes one decode step's tensor operations read and write, per cache class,
at two contexts (the slope is exact), and the attention probe. Deterministic: no timing involved."""

import pytest


@pytest.mark.counted
def test_traffic(kv, kv_cache):
    assert kv.count(kv_cache).passes > 0
