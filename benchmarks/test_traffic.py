"""Counted traffic: the bytes one decode step's tensor operations read and write, per cache class,
at two contexts (the slope is exact), and the attention probe. Deterministic: no timing involved."""

import pytest


@pytest.mark.counted
def test_traffic(kv, kv_cache):
    counted = kv.count(kv_cache)  # recorded, whatever it says
    if counted.passes is None and counted.not_growing:  # no figure to judge: a skip with the reason, not an error
        raise kv.skip(kv_cache, None, f"counted passes: {counted.not_growing}")
