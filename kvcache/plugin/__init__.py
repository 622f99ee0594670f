"""The pytest plugin, installed as the ``pytest11`` entry point ``kvcache.plugin``: ``--kv-*`` options, parametrization
and order of the benchmarks, fixtures, and the session-end analysis, report and gate. Outside the suite it imports
nothing and checks nothing (:func:`pytest_configure`). pytest reads the hooks and fixtures from here; each hook lives
in the module of its concern (:mod:`.options`, :mod:`.startup`, :mod:`.discovery`, :mod:`.schedule`,
:mod:`.transport`, :mod:`.signals`, :mod:`.finish`, :mod:`.state`: docs/architecture.md)."""

from __future__ import annotations

from typing import Any

import pytest

from kvcache.analysing.settings import SettingsError
from kvcache.plugin.discovery import collects_suite
from kvcache.plugin.finish import (
    pytest_benchmark_compare_machine_info,
    pytest_benchmark_update_json,
    pytest_benchmark_update_machine_info,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
from kvcache.plugin.options import given_options, pytest_addoption, settings_from
from kvcache.plugin.schedule import pytest_collection_modifyitems, pytest_generate_tests, pytest_ignore_collect
from kvcache.plugin.startup import check_before_running, new_state
from kvcache.plugin.state import state_of
from kvcache.plugin.transport import pytest_runtest_makereport

__all__ = [  # the hooks and fixtures pytest finds here
    "kv", "kv_drift", "pytest_addoption", "pytest_benchmark_compare_machine_info", "pytest_benchmark_update_json",
    "pytest_benchmark_update_machine_info", "pytest_collection_modifyitems", "pytest_configure",
    "pytest_generate_tests", "pytest_ignore_collect", "pytest_runtest_makereport", "pytest_sessionfinish",
    "pytest_terminal_summary",
]

MARKERS = ("timed: a timed decode point of the kvcache-passes suite (pytest-benchmark)",
           "counted: counted traffic of one decode step, kvcache-passes suite (deterministic)")


def pytest_configure(config: pytest.Config) -> None:
    """Declare the suite's markers; then nothing more unless a ``--kv-*`` option is given (its values are
    checked) or the arguments reach the suite (then everything the run needs is checked too)."""
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if config.getoption("help", False):
        return
    suite = collects_suite(config)
    if not suite and not given_options(config):
        return  # not the suite's run: nothing imported, nothing checked
    try:
        state = new_state(config, settings_from(config))
    except SettingsError as exc:
        raise pytest.UsageError(str(exc)) from None
    if suite:
        check_before_running(config, state)


@pytest.fixture(scope="session")
def kv(request: pytest.FixtureRequest) -> Any:
    """The measuring session (:class:`kvcache.measuring.session.KVSession`)."""
    return state_of(request.config).session


@pytest.fixture
def kv_drift(kv: Any) -> Any:
    """The first timed point measured this session (skips when none was)."""
    if kv.first_point is None:
        pytest.skip("drift: no timed point was measured before this test")
    return kv.first_point
