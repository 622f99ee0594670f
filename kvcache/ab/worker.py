"""One side of ``kvcache ab``: a pytest plugin (``-p kvcache.ab.worker --kv-ab-control R,W``) that turns an ordinary
run of the suite into a worker the driver steps item by item, over two pipes: a hello with the items and the side's
settings, then per item ``ready``, the driver's ``go``/``stage``/``stop``, and ``done`` with the item's records (the
protocol: docs/ab.md, "How it runs"). Standard library only at import; the suite's own plugin does the measuring.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

CONTROL = pytest.StashKey["Control"]()


class Control:
    """The two pipe ends to the driver: requests in (``R``), answers out (``W``)."""

    def __init__(self, spec: str) -> None:
        try:
            read_fd, write_fd = (int(part) for part in spec.split(","))
        except ValueError:
            raise pytest.UsageError(f"--kv-ab-control {spec!r}: expected two file descriptors R,W") from None
        self.requests = os.fdopen(read_fd, "r", buffering=1)
        self.answers = os.fdopen(write_fd, "w", buffering=1)
        self.records: list[str] = []  # the JSON text of each record (kvcache.analysing.records.measured.to_wire)
        self.failed = False
        self.item: str | None = None  # the node id of the item running in stages, None when not in stages

    def send(self, message: dict[str, Any]) -> None:
        self.answers.write(json.dumps(message, default=str) + "\n")
        self.answers.flush()

    def wait(self) -> str:
        """The driver's next word (``go``, ``stage`` or ``stop``); ``stop`` when the driver is gone."""
        line = self.requests.readline()
        return line.strip() or "stop"

    def reached(self, stage: str) -> None:
        """A mark of :mod:`kvcache.measuring.stages`: in stages, say so and wait for the driver's ``go``; a
        ``stop`` ends the session at once (the item in flight makes no pair)."""
        if self.item is None:
            return
        self.send({stage: self.item})
        if self.wait() != "go":
            pytest.exit("kvcache ab: stopped by the driver", returncode=2)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--kv-ab-control", default=None, help="(internal: kvcache ab) the driver's pipes, R,W")
    parser.addoption("--kv-ab-roles", default=None, help="(internal: kvcache ab --more-rounds-within) only the "
                     "items of these roles, comma-separated (e.g. point,copy,drift)")


def pytest_configure(config: pytest.Config) -> None:
    spec = config.getoption("kv_ab_control")
    if spec:
        config.stash[CONTROL] = Control(spec)
        from kvcache.measuring import stages

        stages.handle(config.stash[CONTROL].reached)


def _identity(config: pytest.Config) -> dict[str, Any]:
    """What must match between the sides, from the suite's state: settings, the device and torch threads as the
    session resolves them, the Transformers and torch releases (which may differ)."""
    from kvcache.plugin.state import STATE

    state = config.stash.get(STATE, None)
    if state is None:
        return {"settings": {}, "environment": {}, "baseline": None}
    session = state.session
    env = session.environment()
    from kvcache.analysing.records.identity import recorded_settings

    settings = recorded_settings(state.settings).to_json()  # JSON: the pipe to the driver is the process boundary
    baseline = state.baseline.to_json() if state.baseline is not None else None  # JSON: the pipe, as the settings
    return {"settings": settings, "environment": env, "baseline": baseline}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--kv-ab-roles``: only the items of those roles (:func:`kvcache.plugin.discovery.item_role`), among those
    the run's own selection kept (the suite's hook, trylast, orders what is left)."""
    roles = config.getoption("kv_ab_roles", None)
    if not roles:
        return
    from kvcache.plugin.discovery import item_role

    keep = set(roles.split(","))
    dropped = [item for item in items if item_role(item)[0] not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item_role(item)[0] in keep]


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    control = session.config.stash.get(CONTROL, None)
    if control is None:
        return
    from kvcache.plugin.discovery import item_role

    hello = {"items": [item.nodeid for item in session.items],
             "roles": [item_role(item)[0] for item in session.items], **_identity(session.config)}
    control.send({"hello": hello})
    if control.wait() != "go":
        session.shouldstop = "kvcache ab: stopped by the driver before measuring"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    control = item.config.stash.get(CONTROL, None)
    if control is None:
        return None
    if item.session.shouldstop:
        return True  # not run: pytest stops the session after this call
    control.records, control.failed, control.item = [], False, None
    control.send({"ready": item.nodeid})
    word = control.wait()
    if word not in ("go", "stage"):
        item.session.shouldstop = "kvcache ab: stopped by the driver"
        return True
    control.item = item.nodeid if word == "stage" else None
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in getattr(report, "user_properties", ()):
        if name == "kv_record" and _CURRENT:
            _CURRENT[0].records.append(value)
    if report.failed and _CURRENT:
        _CURRENT[0].failed = True


_CURRENT: list[Control] = []  # the control of this process (pytest_runtest_logreport is given no config)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    control = session.config.stash.get(CONTROL, None)
    if control is not None:
        _CURRENT[:] = [control]


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    if _CURRENT:
        control = _CURRENT[0]
        control.send({"done": nodeid, "failed": control.failed, "records": control.records})
        control.records, control.failed, control.item = [], False, None
