"""A pytest plugin for tests (``-p kv_signals --kv-test-signal SIGTERM --kv-test-second keyboard_interrupt``):
sends this process a signal, as ``timeout``, ``docker stop``, CI cancellation or an impatient Ctrl-C would,
at moments chosen so that the test is deterministic.

- first: at the start of the second round of timed points (round 0 has finished); ``--kv-test-first counted``: at
  the second counted item instead (the first one finished); ``none``: the only signal is the second one;
- second (``--kv-test-second``): ``keyboard_interrupt`` (while pytest handles the first: its
  ``pytest_keyboard_interrupt`` hook), ``update_json`` (while the session's results are being written:
  pytest-benchmark's ``pytest_benchmark_update_json``, just before it writes the JSON), ``sessionfinish``
  (the JSON written, the analysis done, the baseline not yet recorded), ``unconfigure`` (pytest's teardown, after
  the suite's own unconfigure has run: what a second Ctrl-C a second after the first lands in), ``shutdown``
  (during the interpreter's shutdown, once it has put Python's signal handlers back to the default: from the
  finaliser of an object this module holds, as its globals are cleared), or ``none``.
"""

import os
import signal

import pytest

_CONFIG = []  # pytest_keyboard_interrupt is given no config


def pytest_addoption(parser):
    parser.addoption("--kv-test-signal", default="SIGTERM")
    parser.addoption("--kv-test-first", default="round-1")
    parser.addoption("--kv-test-second", default="none")


def _send(config):
    os.kill(os.getpid(), getattr(signal, config.getoption("kv_test_signal")))


_SENT_FIRST = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    point = getattr(getattr(item, "callspec", None), "params", {}).get("kv_point")
    first = item.config.getoption("kv_test_first")
    if point is not None and point.round == 1 and first == "round-1":
        _send(item.config)
    if first == "counted" and item.get_closest_marker("counted") is not None:
        _SENT_FIRST.append(item.nodeid)
        if len(_SENT_FIRST) == 2:
            _send(item.config)


def pytest_keyboard_interrupt(excinfo):
    config = _CONFIG[0]
    if config.getoption("kv_test_second") == "keyboard_interrupt":
        _send(config)


@pytest.hookimpl(tryfirst=True)
def pytest_benchmark_update_json(config, benchmarks, output_json):
    if config.getoption("kv_test_second") == "update_json":
        _send(config)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    if session.config.getoption("kv_test_second") == "sessionfinish":
        _send(session.config)


class _AtShutdown:
    """Sends the signal when it is finalised: as the interpreter clears this module's globals, after the
    interpreter has restored the default signal handlers (where a signal that is only handled by Python kills)."""

    def __init__(self, signum):
        self.signum = signum

    def __del__(self):
        os.kill(os.getpid(), self.signum)


def pytest_configure(config):
    _CONFIG[:] = [config]
    if config.getoption("kv_test_second") == "shutdown":
        globals()["_SHUTDOWN"] = _AtShutdown(getattr(signal, config.getoption("kv_test_signal")))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if config.getoption("kv_test_second") == "unconfigure":
        _send(config)
