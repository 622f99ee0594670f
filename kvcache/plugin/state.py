"""The session's state (:class:`KVState`), kept in pytest's stash under :data:`STATE`: the settings, the measuring
session, the records gathered from every item and the analysis made from them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from kvcache.analysing.settings import Settings

if TYPE_CHECKING:
    from kvcache.analysing.records import KV
    from kvcache.analysing.records.file_formats import BaselineFile
    from kvcache.analysing.records.jsonrecord import Record
    from kvcache.plugin.signals import Stopper

STATE = pytest.StashKey["KVState"]()
PROBLEM = pytest.StashKey[str]()  # a bad option found when the suite turned up during collection


class KVState:
    """Per-session state: settings, the measuring session (built on first use), the analysis."""

    def __init__(self, settings: Settings, worker: bool = False) -> None:
        self.settings = settings
        self.baseline: BaselineFile | None = None  # loaded by check_before_running
        self.checked = False  # check_before_running passed: the suite runs in this session
        self.worker = worker  # an xdist worker: measures and reports records, never analyses
        self._session: Any = None
        self.records: list[Record] = []  # every item's (kvcache.analysing.records.measured), here or from xdist workers
        self.failed: list[str] = []  # classes with a failed point
        self.exit: dict[str, Any] = {"interrupted": False, "exit": "running"}  # how the session ended (kv.session)
        self.kv: KV | None = None  # the analysis, once made
        self.failures: list[str] = []
        self.notes: list[str] = []
        self.stopper: Stopper | None = None  # installed by check_before_running (not on xdist workers)
        self.unwritten: list[str] = []  # outputs that could not be written at the end (each a one-line reason)

    @property
    def started(self) -> bool:
        """Whether the measuring session was built (something of the suite ran in this process)."""
        return self._session is not None

    @property
    def session(self) -> Any:
        """The measuring session (:class:`kvcache.measuring.session.KVSession`), built on first use."""
        if self._session is None:
            from kvcache.measuring.devices import Device
            from kvcache.measuring.session import KVSession

            self._session = KVSession(self.settings, Device.from_choice(self.settings.device))
        return self._session

    @property
    def used(self) -> bool:
        """Whether any item of the suite reported a record (here or on an xdist worker)."""
        return not self.worker and bool(self.records)

    def analyse(self) -> KV:
        """The ``kv`` section of this session (made once, from the records gathered so far)."""
        from kvcache.analysing import analysis
        from kvcache.analysing.records import identity

        if self.kv is None:
            session = {**self.exit, "failed": sorted(set(self.failed))}
            self.kv = analysis.analyse(self.records, identity.recorded_settings(self.settings), self.baseline,
                                       session)
        return self.kv


def state_of(config: pytest.Config) -> KVState:
    """The state, for the suite's fixtures; a usage error outside the suite."""
    state = config.stash.get(STATE, None)
    if state is None:
        raise pytest.UsageError("the kvcache-passes fixtures belong to its suite (pytest benchmarks, or "
                                "pytest --pyargs kvcache.benchmarks)")
    return state


def used_state(config: pytest.Config) -> KVState | None:
    """The state when the suite measured something in this session (here or on xdist workers), else None."""
    state = config.stash.get(STATE, None)
    return state if state is not None and state.used else None
