"""SIGINT and SIGTERM during the suite (:class:`Stopper`): the run stops as Ctrl-C stops it, and the points measured
so far are still analysed and written, whole."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest


class Stopper:
    """SIGTERM (what ``timeout``, ``docker stop`` and CI cancellation send) stops the suite as Ctrl-C does, and
    neither signal can lose or spoil what was measured.

    The first SIGINT or SIGTERM while the session runs raises KeyboardInterrupt: pytest ends the session as
    interrupted, the finished points are analysed and written (``kv.session.interrupted`` true, ``exit``
    "interrupted by SIGTERM"), no timed baseline is recorded, and pytest exits 2. Any later signal, and one that
    arrives once the session's results are being written, only prints a line: the writes finish (the JSON and
    the baseline are whole files, the interrupted mark stays) and the exit status is not 0. SIGKILL still stops
    at once, losing what was not written. Installed from the main thread, only over Python's default handlers;
    the previous handlers come back at unconfigure when no signal came. After one, every later signal only prints
    until the process exits (:func:`kvcache.analysing.files.quiet_signals`), and is ignored during the
    interpreter's shutdown: pytest's teardown after unconfigure (its ``gc.collect``, the plugins' unconfigure) is
    not interrupted, the exit status stays 2, no traceback."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self, state: Any) -> None:
        self.state = state  # the session's kvcache.plugin.state.KVState: its exit mark and analysis
        self.received: list[str] = []  # signal names, in the order they came
        self.session: pytest.Session | None = None  # set once the session's results are being written
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        from kvcache.analysing.files import is_quiet

        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for name in self.SIGNALS:
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            handler = signal.getsignal(signum)
            if handler not in (signal.SIG_DFL, signal.default_int_handler) and not is_quiet(handler):
                continue  # ignored (nohup) or someone else's handler: left alone (a stopped session's is replaced)
            self.previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self.handle)

    def restore(self) -> None:
        from kvcache.analysing.files import quiet_signals

        if self.received and self.previous:  # stopping: whatever comes until the process exits only prints
            quiet_signals("kvcache")
            self.previous.clear()
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()

    def finishing(self, session: pytest.Session) -> None:
        """The session's results are being written from now on: no signal interrupts that any more."""
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """A signal can land on an instruction that maps to no source line: CPython 3.11 then gives that traceback
        entry ``tb_lineno`` None, and pytest's report of the interrupt raises TypeError (a traceback, exit 1, no
        JSON). Such entries are unlinked from the traceback before pytest reports it."""
        tb = excinfo.tb
        while tb is not None and tb.tb_next is not None:
            if tb.tb_next.tb_lineno is None:
                tb.tb_next = tb.tb_next.tb_next
            else:
                tb = tb.tb_next

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        """Mark finishing as soon as the test loop ends, however it ends: a first signal between its end and
        session finish would otherwise raise out of pytest's own clean-up, with no JSON written."""
        try:
            return (yield)
        finally:
            self.finishing(session)

    def handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        first = not self.received
        self.received.append(name)
        if first and self.session is None:
            raise KeyboardInterrupt(f"{name}: writing the points measured so far")
        if self.state.kv is None:  # not analysed yet: the run is marked interrupted
            self.state.exit = {"interrupted": True, "exit": f"interrupted by {self.received[0]}"}
        again = "" if first else " again (SIGKILL stops at once and loses them)"
        # os.write, not sys.stderr: the signal may land inside a write to sys.stderr (a reentrant call raises)
        os.write(2, f"\nkvcache: {name}{again}: stopping once the measured points are written\n".encode())

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.restore()
        if self.received and self.session is not None and self.session.exitstatus == pytest.ExitCode.OK:
            self.session.exitstatus = pytest.ExitCode.INTERRUPTED
