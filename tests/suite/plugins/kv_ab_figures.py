"""A pytest plugin for tests of ``kvcache ab`` (``-p kv_ab_figures``, given to both sides): each timed point's steps,
and the drift re-measurement's, are made up before the worker sends them, so that the paired verdicts do not depend
on how fast or steady the machine is.

Every step of a point at ``context`` tokens takes ``1 ms * (1 + context / 256)``: a line that grows with the cache,
the same on both sides. On the side whose environment names a file in ``KV_AB_FIGURES_SLOWER`` (``--b-env``), each
point is 1% slower than the one that side measured before it, counted in that file across the side's workers (the
first session's, then each extension's, one after the other): that side's speed moves away from the other's all
through the session, in every context, so the paired drift is above zero however many rounds are pooled. With
``--kv-max-drift 0`` a paired timed verdict is then inconclusive for a reason more rounds can help, and more rounds
never decide it. The slope stays above zero on both sides (the drift of a session of a few tens of points is far
below the 4.5x between 256 and 2048 tokens)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvcache.analysing.records.measured import from_wire, to_wire
from kvcache.analysing.records.timed import Point

SLOWER = "KV_AB_FIGURES_SLOWER"
RECORD = "kv_record"  # kvcache.plugin.transport.RECORD: the records an item's report carries
STEP_PER_TOKEN_S, STEP_S, SLOWER_BY = 1e-3 / 256, 1e-3, 1.01


def made_up(context: int) -> float:
    """Seconds of each step of a point at ``context`` tokens, on the side that does not slow down."""
    s = STEP_S + STEP_PER_TOKEN_S * context
    counter = os.environ.get(SLOWER)
    if counter:
        path = Path(counter)
        n = int(path.read_text()) if path.exists() else 0  # the points this side measured before this one
        path.write_text(str(n + 1))
        s *= SLOWER_BY ** n
    return s


@pytest.hookimpl(tryfirst=True)  # before the worker (kvcache.ab.worker) takes the records to send them
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    properties = getattr(report, "user_properties", [])
    for i, (name, value) in enumerate(properties):
        if name != RECORD:
            continue
        record = from_wire(value)
        if isinstance(record, Point) and record.samples_s:
            record.update(samples_s=[made_up(record.context)] * len(record.samples_s))
            properties[i] = (name, to_wire(record))
