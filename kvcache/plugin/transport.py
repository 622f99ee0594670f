"""Records from each item to one place: the records an item produced (:mod:`kvcache.analysing.records.measured`)
travel in its report (``user_properties`` named :data:`RECORD`), so the session-end analysis sees every item, from xdist
workers too, whatever pytest-benchmark keeps or saves; :class:`RecordGatherer` collects them into the session's state.

This is the process boundary: each record travels as one JSON text
(:func:`~kvcache.analysing.records.measured.to_wire`),
read back on the controller (:func:`~kvcache.analysing.records.measured.from_wire`), in this process too, so a run
analyses the same records with or without xdist."""

from __future__ import annotations

from typing import Any

import pytest

from kvcache.plugin.discovery import item_role
from kvcache.plugin.finish import write_benchmark_json_atomically
from kvcache.plugin.state import STATE, KVState

RECORD = "kv_record"  # the user_properties name of a measurement record (its JSON text)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Attach the records the item produced (and a failed point's class) to its report."""
    outcome = yield
    state = item.config.stash.get(STATE, None)
    if state is None or not state.started:
        return
    from kvcache.analysing.records.measured import Failed, to_wire

    report = outcome.get_result()
    for record in state.session.take_records():
        report.user_properties.append((RECORD, to_wire(record)))
    if not report.failed:
        return
    role, key = item_role(item)
    if role in ("point", "counted", "copy", "remeasure", "drift"):
        cache = getattr(key, "cache", key if role == "counted" else None)
        failed = Failed.of(cache=cache, role=role, nodeid=item.nodeid, reason=failure_line(report))
        report.user_properties.append((RECORD, to_wire(failed)))


def failure_line(report: pytest.TestReport) -> str:
    """The first line of a failed item's error (``ValueError: ...``), at most 300 characters; its node id where
    pytest kept no crash message."""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    message = str(getattr(crash, "message", "") or "").strip()
    return (message.splitlines()[0] if message else f"{report.nodeid} failed")[:300]


class RecordGatherer:
    """Gathers the records of every report (this process's items, or each xdist worker's on the
    controller) into the session's state; registered with the state."""

    def __init__(self, state: KVState) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in getattr(report, "user_properties", ()):
            if name != RECORD:
                continue
            from kvcache.analysing.records.measured import Failed, from_wire

            record = from_wire(value)
            self.state.records.append(record)  # a failed class's record carries its reason to kv.session.reasons
            if isinstance(record, Failed) and record.cache:
                self.state.failed.append(record.cache)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> Any:
        """Note how the session ended before anything is analysed or saved: pytest-benchmark writes its JSON,
        with the ``kv`` section, in its own (inner) wrapper of this hook."""
        stopper = self.state.stopper
        if stopper is not None:
            stopper.finishing(session)
        code = int(exitstatus)
        name = pytest.ExitCode(code).name.lower() if code in {int(c) for c in pytest.ExitCode} else str(code)
        self.state.exit = {"interrupted": code in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR),
                           "exit": name}
        if stopper is not None and stopper.received:  # pytest may not know: a second signal cut its handling short
            self.state.exit = {"interrupted": True, "exit": f"interrupted by {stopper.received[0]}"}
        write_benchmark_json_atomically(session.config, self.state)
        yield
        if self.state.unwritten and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if stopper is not None and stopper.received and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.INTERRUPTED  # a signal while the results were written
