"""A pytest plugin for tests (``-p kv_interrupt``): presses Ctrl-C at the start of the second round of timed
points, as a user would in the middle of a sweep."""

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    point = getattr(getattr(item, "callspec", None), "params", {}).get("kv_point")
    if point is not None and point.round == 1:
        raise KeyboardInterrupt
