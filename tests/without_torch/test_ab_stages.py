"""``kvcache ab``'s driver stepping an item in stages (:func:`kvcache.ab.schedule.run_in_stages`), against scripted
workers: each side alone from its start (its fill) to the end of its timed part, back to back in the given order,
then both finish at once; a side that stops at no stage (a skipped point) or dies is handled. Standard library only:
no torch."""

from __future__ import annotations

from pathlib import Path

from kvcache.ab.schedule import run_in_stages

ITEM = "benchmarks/test_decode.py::test_decode[dynamic-1024-r0]"


class Machine:
    """Both scripted workers: which one runs (told a word, not yet stopped), and every event in order. A fill or a
    timed part (``stage`` up to ``measured``) that starts or runs while the other side runs is a violation."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.alone: str | None = None
        self.events: list[tuple[str, str]] = []
        self.violations: list[str] = []


class ScriptedSide:
    """A worker that stops, in turn, at each stage of ``script`` (``prepared``, ``measured``, ``done``; None: it
    dies there)."""

    def __init__(self, name: str, script: list[str | None], machine: Machine) -> None:
        self.name, self.script, self.machine = name, list(script), machine
        self.log = Path(f"{name}.log")
        self.records: list[dict] = []
        self.finished: list[str] = []
        self.failure: str | None = None
        self.stage: str | None = None
        self.sent_ready = False

    @property
    def label(self) -> str:
        return self.name.upper()

    def tell(self, word: str) -> None:
        m = self.machine
        m.events.append((self.name, word))
        if m.alone is not None and m.alone != self.name:
            m.violations.append(f"{self.name} told {word} while {m.alone} runs alone")
        if word == "stage" or (word == "go" and self.stage == "prepared"):  # its fill, or its timed part
            if m.running - {self.name}:
                m.violations.append(f"{self.name} told {word} while {sorted(m.running)} run")
            m.alone = self.name
        m.running.add(self.name)

    def read(self) -> dict | None:
        m = self.machine
        if not self.sent_ready:
            self.sent_ready = True
            return {"ready": ITEM}
        assert self.name in m.running, f"{self.name} read while stopped: the driver would wait for ever"
        m.running.discard(self.name)
        if m.alone == self.name and self.script[0] != "prepared":  # alone from its start to its timed part's end
            m.alone = None
        stage = self.script.pop(0)
        m.events.append((self.name, str(stage)))
        if stage is None:
            return None
        self.stage = stage
        return {stage: ITEM, "records": [{"side": self.name}]} if stage == "done" else {stage: ITEM}

    def exit_text(self) -> str:
        return "exit 1"

    def last_log_line(self) -> str:
        return "(log)"


def sides(script_a: list[str | None], script_b: list[str | None]) -> tuple[Machine, ScriptedSide, ScriptedSide]:
    machine = Machine()
    return machine, ScriptedSide("a", script_a, machine), ScriptedSide("b", script_b, machine)


def test_each_side_fills_and_measures_alone_back_to_back_then_both_finish_at_once():
    machine, a, b = sides(["prepared", "measured", "done"], ["prepared", "measured", "done"])
    seconds: dict[str, float] = {}
    assert run_in_stages((b, a), ITEM, seconds)  # B first (an odd item of ABBA)
    assert machine.events == [("b", "stage"), ("b", "prepared"), ("b", "go"), ("b", "measured"),
                              ("a", "stage"), ("a", "prepared"), ("a", "go"), ("a", "measured"),
                              ("b", "go"), ("a", "go"), ("b", "done"), ("a", "done")]
    assert machine.violations == []
    assert set(seconds) == {"a", "b"} and a.finished == b.finished == [ITEM] and a.records == [{"side": "a"}]


def test_a_side_that_stops_at_no_stage_is_done_and_the_other_still_measures_alone():
    """B's point is skipped (it ends before its fill is done); A measures, alone as ever."""
    machine, a, b = sides(["prepared", "measured", "done"], ["done"])
    seconds: dict[str, float] = {}
    assert run_in_stages((a, b), ITEM, seconds)
    assert machine.violations == [] and set(seconds) == {"a", "b"} and b.finished == a.finished == [ITEM]
    assert ("a", "go") in machine.events and ("b", "go") not in machine.events


def test_a_second_timed_part_in_one_item_also_runs_alone():
    machine, a, b = sides(["prepared", "measured", "prepared", "measured", "done"], ["prepared", "measured", "done"])
    assert run_in_stages((a, b), ITEM, {})
    assert machine.violations == [] and a.finished == b.finished == [ITEM]


def test_a_side_that_dies_in_its_timed_part_ends_the_item_with_the_failure_named():
    machine, a, b = sides(["prepared", None], ["prepared", "measured", "done"])
    assert not run_in_stages((a, b), ITEM, {})
    assert a.failure is not None and ITEM in a.failure and machine.violations == [] and b.finished == []
