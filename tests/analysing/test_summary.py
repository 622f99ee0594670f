"""kvcache.analysing.summary: the terminal summary of a run never fails on a figure that is not known."""

from __future__ import annotations

from fakerun import make_run

from kvcache.analysing import summary


def test_a_class_without_counted_passes_or_an_interval_is_summarised():
    """``passes`` is optional in ``kv.traffic.<cache>`` (and null in JSON): it was formatted with ``:.3f``."""
    kv = make_run()["kv"]
    kv["traffic"]["dynamic"]["passes"] = None
    kv["fit"]["static"]["passes_ci"] = [None, None]
    lines = summary.lines(kv)
    assert any(line.startswith("counted dynamic: - passes") for line in lines), lines
    assert any(line.startswith("counted static: 1.000 passes") for line in lines), lines
