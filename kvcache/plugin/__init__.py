"""The pytest plugin, installed as the ``pytest11`` entry point ``kvcache.plugin``: ``--kv-*`` options,
parametrization and order of the benchmarks, fixtures, and the session-end analysis, report and gate.

Installed, it loads in every pytest run of the environment, so it costs nothing and checks nothing unless the
run is the suite's (:func:`pytest_configure`): options and markers are declared, nothing else is imported.
With a ``--kv-*`` option given, the options are checked at start-up; when the run's arguments reach the
suite (``pytest benchmarks`` here, ``pytest --pyargs kvcache.benchmarks`` anywhere), so are the device, the
paths the run writes, the copy tensor, the model's config and the baseline. Every bad input is a one-line
usage error (exit 4) before anything runs.

pytest reads the hooks and fixtures from this module; each hook lives in the module of its concern:

- :mod:`~kvcache.plugin.options`: the ``--kv-*`` options and the settings read from them;
- :mod:`~kvcache.plugin.startup`: the session's state made and every input checked before anything runs;
- :mod:`~kvcache.plugin.discovery`: where the suite is, and what each of its items measures;
- :mod:`~kvcache.plugin.schedule`: which suite files are collected, their parameters and the measuring order;
- :mod:`~kvcache.plugin.transport`: each item's measurements, as records in its report, gathered in one place;
- :mod:`~kvcache.plugin.signals`: SIGINT and SIGTERM stop the run without losing what was measured;
- :mod:`~kvcache.plugin.finish`: the analysis, the baseline, the gate, the run file and the terminal summary;
- :mod:`~kvcache.plugin.state`: the session's state, shared by all of them.
"""

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
