"""The session of ``kvcache ab``: both workers started and checked against each other (:func:`start`), then stepped
through the suite's items in its own order (:func:`drive`): counted items (roles in :data:`CONCURRENT_ROLES`) on both
sides at once, every other item on one side and then on the other, back to back, which side goes first alternating
from one item to the next (ABBA). Standard library only."""

from __future__ import annotations

import selectors
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kvcache.ab_sides import ABError, Hello, Side

CONCURRENT_ROLES = ("counted", "other")  # items whose figures do not depend on time: both sides at once
#: Identity fields that must match between the sides: (label, section of the worker's hello, key, default).
MUST_MATCH = (("model", "settings", "model", None), ("dtype", "settings", "dtype", None),
              ("device", "environment", "device_name", None), ("threads", "environment", "threads", None),
              ("driver", "settings", "driver", "loop"), ("batch", "settings", "batch", 1),
              ("ragged", "settings", "ragged", False), ("compile", "settings", "compile", "off"))


@dataclass
class Pair:
    """One item both sides finished: its node id, its role and which side ran it first (None: both at once)."""

    item: str
    role: str
    first: str | None

    def to_json(self) -> dict[str, Any]:
        return {"item": self.item, "role": self.role, "first": self.first}


@dataclass
class Session:
    """Both sides, the items in measuring order with their roles, the pairs finished so far, and how it ended
    (``interrupted``: the signal's name; ``notes``: what the output should say besides)."""

    sides: list[Side]
    pairs: list[Pair] = field(default_factory=list)
    interrupted: str | None = None
    roles: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def identity_problem(a: Hello, b: Hello) -> str | None:
    """The identity fields on which the two workers' hellos differ, or None."""
    differ = [f"{label} (A: {a.value(section, key, d)}, B: {b.value(section, key, d)})"
              for label, section, key, d in MUST_MATCH if a.value(section, key, d) != b.value(section, key, d)]
    if not differ:
        return None
    return ("the sides differ in " + "; ".join(differ) + ": an A/B compares environments on one identity (releases, "
            "torch, patches, plug-ins and environment variables may differ)")


def start(session: Session, common: list[str], cwd: Path) -> None:
    """Start both workers and read their hellos; ABError when a side cannot run the suite or the sides differ."""
    for side in session.sides:
        side.start(common, cwd)
    waiting = {side.answers.fileno(): side for side in session.sides if side.answers is not None}
    with selectors.DefaultSelector() as selector:  # whichever answers first: a side that fails is said at once
        for fd in waiting:
            selector.register(fd, selectors.EVENT_READ)
        while waiting:
            for key, _ in selector.select():
                side = waiting.pop(key.fd)
                selector.unregister(key.fd)
                message = side.read()
                if message is None or "hello" not in message:
                    raise ABError(f"side {side.label} cannot run the suite ({side.exit_text()}): "
                                  f"{side.last_log_line()} (see {side.log})")
                try:
                    side.hello = Hello.from_message(message["hello"])
                except KeyError as exc:  # a worker of another kvcache-passes, older than this driver
                    raise ABError(f"side {side.label}'s worker sent no {exc} in its hello: give both sides this "
                                  "kvcache-passes") from None
    a, b = (side.hello for side in session.sides)
    if not a.items:
        raise ABError(f"side A collected no item of the suite (see {session.sides[0].log})")
    problem = identity_problem(a, b)
    if problem:
        raise ABError(problem)
    if a.items != b.items:
        only = sorted(set(a.items) ^ set(b.items))[:3]
        raise ABError(f"the sides collected different items ({', '.join(only) or 'in another order'}): give both "
                      "the same common options")
    session.items, session.roles = a.items, a.roles


def run_item(side: Side, nodeid: str) -> bool:
    """Let ``side`` run ``nodeid``; False (and ``side.failure`` set) when the worker is gone."""
    message = side.read()
    if message is None or message.get("ready") != nodeid:
        side.failure = side.failure or f"worker {side.exit_text()} before {nodeid} (see {side.log})"
        return False
    side.tell("go")
    return finish_item(side, nodeid)


def finish_item(side: Side, nodeid: str) -> bool:
    """Take ``side``'s records of ``nodeid`` once it is done; False (and ``side.failure`` set) when it died."""
    message = side.read()
    if message is None or message.get("done") != nodeid:
        side.failure = f"worker {side.exit_text()} during {nodeid} (see {side.log}: {side.last_log_line()})"
        return False
    side.records += message["records"]
    side.finished.append(nodeid)
    return True


def drive(session: Session, say: Callable[[str], None]) -> None:
    """Step both workers through every item (see the module docstring); stops at the first failure."""
    a, b = session.sides
    for side in session.sides:
        side.tell("go")  # past the hello
    k = 0
    for nodeid, role in zip(session.items, session.roles):
        if role in CONCURRENT_ROLES:
            ready = [side.read() for side in (a, b)]
            for side, message in zip((a, b), ready):
                if message is None or message.get("ready") != nodeid:
                    side.failure = f"worker {side.exit_text()} before {nodeid} (see {side.log})"
                    return
            for side in (a, b):
                side.tell("go")
            if not all([finish_item(a, nodeid), finish_item(b, nodeid)]):
                return
            session.pairs.append(Pair(nodeid, role, None))
            continue
        order = (a, b) if k % 2 == 0 else (b, a)
        k += 1
        for side in order:
            if not run_item(side, nodeid):
                return
        session.pairs.append(Pair(nodeid, role, order[0].name))
        say(f"  {len(session.pairs)}/{len(session.items)} {nodeid} ({order[0].label}{order[1].label})")
