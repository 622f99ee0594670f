"""Timed decode steps: one benchmark per (cache class, context length, round), then the drift check.

Each point: a fresh cache filled untimed to the context, ``--kv-warmup`` untimed steps, then
``--kv-steps`` timed single-token steps, each bracketed by a device sync. The median step is the
figure; the session-end fit turns medians against KV bytes into passes over the cache. A point that
cannot run here (memory, release, package) is skipped with the reason.
"""

import pytest


@pytest.mark.timed
def test_copy_bandwidth(kv, kv_copy_label):
    """The device's copy bandwidth (1 GiB copies, read + write), at the start, each round and the end."""
    result = kv.measure_copy(kv_copy_label)
    assert result.gbps > 0


@pytest.mark.timed
def test_decode(kv, kv_point, benchmark):
    kv.run_timed(kv_point, benchmark)


@pytest.mark.timed
def test_drift(kv, kv_drift, benchmark):
    """The first point measured again, last: its change is the session's drift."""
    kv.run_timed(kv_drift, benchmark, kind="drift")
