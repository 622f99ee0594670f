"""A pytest plugin for tests of ``kvcache ab`` (``-p kv_ab_die`` with ``KV_AB_DIE_AT=<part of a node id>``): the
process kills itself (SIGKILL: nothing is written) when the item whose id contains that text starts, as a worker
that crashes mid-run would."""

import os
import signal

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    at = os.environ.get("KV_AB_DIE_AT")
    if at and at in item.nodeid:
        os.kill(os.getpid(), signal.SIGKILL)
