"""Achieved bandwidth per point (counted bytes of a step over its median time, GB/s) and its share of the copy
bandwidth: one rule (:mod:`kvcache.analysing.bandwidth`), against the session's median copy bandwidth."""

from __future__ import annotations

import pytest
from fakerun import analysed, make_run

from kvcache.analysing.bandwidth import achieved_fraction, achieved_gbps


def test_achieved_gbps_is_counted_bytes_over_the_median_step():
    assert achieved_gbps(2e9, 0.1) == pytest.approx(20.0)
    assert achieved_gbps(None, 0.1) is None and achieved_gbps(2e9, None) is None
    assert achieved_gbps(0, 0.1) is None and achieved_gbps(2e9, 0.0) is None


def test_achieved_fraction_is_the_share_of_the_copy_bandwidth():
    assert achieved_fraction(5.0, 20.0) == pytest.approx(0.25)
    assert achieved_fraction(None, 20.0) is None and achieved_fraction(5.0, None) is None
    assert achieved_fraction(5.0, 0.0) is None


def test_points_set_the_achieved_bandwidth_against_the_session_median_copy_not_the_first():
    run = make_run({"dynamic": 3.0}, noise=0.0)
    run["kv"]["copy"]["measurements"] = [
        {"label": label, "gbps": gbps, "samples_gbps": [gbps] * 5}
        for label, gbps in (("start", 10.0), ("round-1", 20.0), ("end", 40.0))
    ]
    kv = analysed(run)["kv"]
    assert kv["copy_gbps"] == 20.0
    for point in kv["points"]:
        assert point["achieved_gbps"] == pytest.approx(point["counted_bytes"] / (point["median_ms"] / 1e3) / 1e9)
        assert point["achieved_fraction"] == pytest.approx(point["achieved_gbps"] / 20.0)
