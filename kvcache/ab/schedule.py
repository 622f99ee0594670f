"""The session of ``kvcache ab``: both workers started and checked against each other (:func:`start`), then stepped
through the suite's items in its own order (:func:`drive`): counted items (roles in :data:`CONCURRENT_ROLES`) on both
sides at once; every other item in stages (:func:`run_in_stages`): each side alone from its start to the end of its
timed part (fill the cache, warm up, time the steps), one side and then the other, back to back, which side goes
first alternating from one item to the next (ABBA), then both finish at once (count a step, read the profile).
Nothing runs beside a side's fill or timed part. Standard library only."""

from __future__ import annotations

import selectors
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kvcache.ab import clock
from kvcache.ab.sides import ABError, Hello, Side
from kvcache.analysing.records.ab_document import ABItem

CONCURRENT_ROLES = ("counted", "other")  # items whose figures do not depend on time: both sides at once
STAGES = ("prepared", "measured", "done")  # where a worker stops in an item run in stages (the last: its records)
#: Identity fields that must match between the sides: (label, section of the worker's hello, key, default).
MUST_MATCH = (("model", "settings", "model", None), ("dtype", "settings", "dtype", None),
              ("device", "environment", "device_name", None), ("threads", "environment", "threads", None),
              ("driver", "settings", "driver", "loop"), ("batch", "settings", "batch", 1),
              ("ragged", "settings", "ragged", False), ("compile", "settings", "compile", "off"))


@dataclass
class ABSession:
    """Both sides, the items in measuring order with their roles, the pairs finished so far, and how it ended
    (``interrupted``: the signal's name; ``notes``: what the output should say besides)."""

    sides: list[Side]
    pairs: list[ABItem] = field(default_factory=list)
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


def start(session: ABSession, common: list[str], cwd: Path) -> None:
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


def _ready(sides: tuple[Side, ...], nodeid: str) -> bool:
    """Each side's ``ready`` for ``nodeid``; False (and ``side.failure`` set) when a worker is gone."""
    for side in sides:
        message = side.read()
        if message is None or message.get("ready") != nodeid:
            side.failure = side.failure or f"worker {side.exit_text()} before {nodeid} (see {side.log})"
            return False
    return True


def _next_stage(side: Side, nodeid: str) -> str | None:
    """Where ``side`` stopped in ``nodeid``: ``prepared``, ``measured`` or ``done`` (its records taken); None (and
    ``side.failure`` set) when it died."""
    message = side.read()
    stage = next((key for key in STAGES if message is not None and message.get(key) == nodeid), None)
    if stage is None:
        side.failure = f"worker {side.exit_text()} during {nodeid} (see {side.log}: {side.last_log_line()})"
        return None
    if stage == "done":
        assert message is not None
        side.records += message["records"]
        side.finished.append(nodeid)
    return stage


def run_concurrently(sides: tuple[Side, Side], nodeid: str, seconds: dict[str, float]) -> bool:
    """Both sides run ``nodeid`` at once (each one's wall seconds into ``seconds``); False when a worker is gone."""
    if not _ready(sides, nodeid):
        return False
    for side in sides:
        side.tell("go")
    began = clock.now()
    for side in sides:
        if _next_stage(side, nodeid) != "done":  # an item run with "go" stops at no stage
            side.failure = side.failure or f"worker sent no records of {nodeid} (see {side.log})"
            return False
        seconds[side.name] = clock.now() - began
    return True


def run_in_stages(order: tuple[Side, Side], nodeid: str, seconds: dict[str, float]) -> bool:
    """Both sides run ``nodeid`` in stages (:mod:`kvcache.measuring.stages`): each side alone, in ``order``, from
    its start to the end of its timed part (fill, warm-up, timed steps: as in a run of its own), back to back; then
    whatever is left (counting a step, reading a profile) on both at once (each side's seconds from its start to the
    end of its timed part into ``seconds``). Whenever every side has stopped (at a stage, done, or not started): a
    side that is prepared goes on alone; else the next side in ``order`` starts alone; else every side that has
    measured goes on at once; else the item is done. False when a worker is gone. Each side fills alone, right
    before its timed part, as in a run of its own (docs/ab.md, "Notes")."""
    if not _ready(order, nodeid):
        return False
    where: dict[str, str] = {}
    waiting: list[Side] = list(order)  # not started yet
    running: list[Side] = []
    began: float | None = None
    while True:
        for side in running:
            stage = _next_stage(side, nodeid)
            if stage is None:
                return False
            where[side.name] = stage
            if stage != "prepared" and began is not None:  # its fill and timed part are over
                seconds[side.name] = clock.now() - began
                began = None
        prepared = [side for side in order if where.get(side.name) == "prepared"]
        if prepared:
            running = prepared[:1]  # its timed part: nothing else runs
            running[0].tell("go")
        elif waiting:
            running, began = [waiting.pop(0)], clock.now()  # alone from its start: its fill too
            running[0].tell("stage")
            seconds.setdefault(running[0].name, 0.0)
        else:
            running = [side for side in order if where.get(side.name) == "measured"]
            if not running:
                return True
            for side in running:
                side.tell("go")


def drive(session: ABSession, say: Callable[[str], None]) -> None:
    """Step both workers through every item (see the module docstring); stops at the first failure."""
    a, b = session.sides
    for side in session.sides:
        side.tell("go")  # past the hello
    k = 0
    for nodeid, role in zip(session.items, session.roles):
        seconds: dict[str, float] = {}
        began = clock.now()
        if role in CONCURRENT_ROLES:
            if not run_concurrently((a, b), nodeid, seconds):
                return
            session.pairs.append(ABItem(nodeid, role, None, seconds, clock.now() - began))
            continue
        order = (a, b) if k % 2 == 0 else (b, a)
        k += 1
        if not run_in_stages(order, nodeid, seconds):
            return
        session.pairs.append(ABItem(nodeid, role, order[0].name, seconds, clock.now() - began))
        say(f"  {len(session.pairs)}/{len(session.items)} {nodeid} ({order[0].label}{order[1].label})")
