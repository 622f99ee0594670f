"""The session's end: the analysis, the baseline recorded when asked, the gate's exit status, the ``kv`` section
written into the ``--benchmark-json`` run (atomically, through symlinks), and the terminal summary.

The analysis is a typed :class:`~kvcache.analysing.records.KV`; it becomes JSON here, at the edge, once."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from kvcache.plugin.state import STATE, KVState, used_state


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Analyse, record the baseline when asked, judge, and set the exit status (before the terminal summary)."""
    state = used_state(session.config)
    if state is None:
        return
    from kvcache.analysing import analysis

    kv = state.analyse()
    write_json_if_missing(session.config, state)
    if state.settings.update_baseline:
        record_baseline(session, state)
    state.failures = analysis.gate_failures(kv)
    if state.failures and state.settings.gate:  # judged against the baseline as it was: recording is no pass
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def record_baseline(session: pytest.Session, state: KVState) -> None:
    """``--kv-update-baseline``: merge this run's passes into the baseline file, each outcome a note of the summary;
    a file that cannot be written fails the session. Nothing is recorded when a signal came after the analysis
    said the session finished."""
    from kvcache.analysing.judge import baseline as baselines

    kv, path, stopper = state.analyse(), state.settings.baseline, state.stopper
    if stopper is not None and stopper.received and not (kv.session is not None and kv.session.interrupted):
        state.notes.append(f"baseline NOT written to {path}: {stopper.received[0]} arrived while the "
                           "results were being written")
        return
    recorded = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        entries, refused = baselines.record(path, kv, recorded)
    except (OSError, baselines.BaselineError) as exc:
        reason = exc if isinstance(exc, baselines.BaselineError) else f"{path}: {baselines.error_line(exc)}"
        state.unwritten.append(f"baseline NOT written: {reason}")  # an output not written: a red line, exit 1
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return
    state.notes += [f"baseline: {line}" for line in refused]
    written = ", ".join(f"{key} ({', '.join(by_cache)})" for key, by_cache in entries.items()) or "nothing"
    state.notes.append(f"baseline written to {path}: {written}")


# --- the run file ---------------------------------------------------------------------------------------
# pytest-benchmark's hooks: optional, so that the plugin loads where pytest-benchmark is not installed.

@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]) -> None:
    state = used_state(config)
    if state is not None:
        output_json["kv"] = state.analyse().to_json()


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """The device and library facts, the same whenever asked: pytest-benchmark asks once at configure time to
    compare with a saved run (``--benchmark-compare``, before anything is measured) and once at the end to
    save, and warns when the two dicts differ. Run-dependent values belong in the ``kv`` section."""
    state = config.stash.get(STATE, None)
    if state is not None and state.checked:
        machine_info["kv_environment"] = state.session.machine()


@pytest.hookimpl(wrapper=True, optionalhook=True)
def pytest_benchmark_compare_machine_info(config: pytest.Config, benchmarksession: Any, machine_info: Any,
                                          compared_benchmark: Any) -> Any:
    """pytest-benchmark 5.3.1 words its "machine_info is different" warning with the storage path relative to the
    working directory, which raises ValueError for a ``--benchmark-storage`` outside it (INTERNALERROR). Give that
    warning with the absolute path instead."""
    try:
        return (yield)
    except ValueError:
        from pytest_benchmark.utils import consistent_dumps

        benchmarksession.logger.warning(
            f"Benchmark machine_info is different. Current: {consistent_dumps(machine_info)} VS saved: "
            f"{consistent_dumps(compared_benchmark.get('machine_info'))} (location: {benchmarksession.storage}).")
        return None


def write_benchmark_json_atomically(config: pytest.Config, state: KVState) -> None:
    """pytest-benchmark writes ``--benchmark-json`` in place (``open(path, "wb")``): a signal or a full disk
    mid-write leaves half a file, and a symlink's target is truncated first. Have it written through
    :func:`kvcache.analysing.files.write_text_atomically` instead, with the same text; a file that cannot be
    written is a one-line note and a failed exit, not a traceback."""
    bench = getattr(config, "_benchmarksession", None)
    if bench is None or not getattr(bench, "json", None) or not callable(getattr(bench, "save_json", None)):
        return
    from pytest_benchmark.utils import safe_dumps

    def save_json(output_json: dict[str, Any]) -> None:
        if _write_json(state, bench.json, safe_dumps(output_json, ensure_ascii=True, indent=4)):
            bench.logger.info(f"Wrote benchmark data in: {bench.json}", purple=True)

    bench.save_json = save_json


def write_json_if_missing(config: pytest.Config, state: KVState) -> None:
    """pytest-benchmark writes no JSON when no benchmark ran (counted-only, --benchmark-disable); write one
    of the same shape so the counted results are not lost."""
    path = config.getoption("benchmark_json", None)
    if not path or getattr(getattr(config, "_benchmarksession", None), "benchmarks", None):
        return  # none asked for, or pytest-benchmark wrote it, with the kv section from update_json
    kv = state.analyse().to_json()
    doc = {"machine_info": {"kv_environment": kv["environment"]}, "commit_info": {}, "benchmarks": [],
           "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(), "version": None, "kv": kv}
    _write_json(state, path, json.dumps(doc, indent=4))


def _write_json(state: KVState, path: str | Path, text: str) -> bool:
    """Write the ``--benchmark-json`` run atomically (through symlinks); a file that cannot be written is a red
    line at the end and a failed exit (``state.unwritten``), not a traceback. Whether it was written."""
    from kvcache.analysing import files

    try:
        files.write_text_atomically(path, text)
    except OSError as exc:
        state.unwritten.append(f"--benchmark-json {files.path_shown(path)} NOT written ({exc.strerror or exc})")
        return False
    return True


# --- the terminal summary ---------------------------------------------------------------------------------

def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = used_state(config)
    if state is None or state.kv is None:
        return
    from kvcache.analysing import analysis, summary
    from kvcache.analysing.tables import terminal_text  # a run's strings shown, never obeyed by the terminal

    tr = terminalreporter
    tr.section("kvcache-passes")
    for line in summary.lines(state.kv):
        tr.write_line(line)
    for note in state.notes:
        tr.write_line(terminal_text(note))
    for line in state.unwritten:
        tr.write_line(terminal_text(line), red=True, bold=True)
    for line in analysis.warnings(state.kv):
        tr.write_line(terminal_text(line), yellow=True, bold=True)
    if state.failures:
        mode = "" if state.settings.gate else " (not failing: --kv-no-gate)"
        for line in state.failures:
            tr.write_line(terminal_text(line) + mode, red=bool(not mode), bold=True)
    red = [terminal_text(line) for line in (state.failures if state.settings.gate else []) + state.unwritten]
    session = getattr(tr, "_session", None)  # its exit status is final here: 1, or 2 when a signal stopped it
    if red and (session is None or session.exitstatus == pytest.ExitCode.TESTS_FAILED):
        report_gate_failed(tr, red)


#: The node id of the failed report that makes a red gate red in pytest's own words (:func:`report_gate_failed`).
GATE_ITEM = "kv-cache gate"


def report_gate_failed(tr: Any, lines: list[str]) -> None:
    """The session-end gate failed (a regression, or an output not written): besides its red lines above, a failed
    report of a synthetic item, :data:`GATE_ITEM`, in the terminal reporter's stats, so that pytest's own short
    summary says ``FAILED kv-cache gate - <first reason>`` and its last line ``N passed, 1 failed``, red, as the
    exit status (1) does. Only the terminal sees it: junitxml, xdist and the other plugins' hooks do not."""
    more = f" (+{len(lines) - 1} more above)" if len(lines) > 1 else ""
    report = pytest.TestReport(nodeid=GATE_ITEM, location=(GATE_ITEM, None, GATE_ITEM), keywords={},
                               outcome="failed", longrepr=lines[0] + more, when="call")
    tr.stats.setdefault("failed", []).append(report)
    if hasattr(tr, "_main_color"):  # pytest caches the last line's colour; let it see the failure
        tr._main_color = None
