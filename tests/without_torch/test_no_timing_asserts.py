"""No test asserts on elapsed time: a test whose outcome depends on how fast or steady the machine is fails some day
in CI beside other processes (issue 49: ``test_ab_more_rounds`` failed 3 times of 3 in a fresh clone's CI). A test
that needs time to pass drives a clock of its own (``tests/abdriver.py``: ``kvcache ab``'s driver on a clock that
ticks) or made-up figures (``tests/suite/plugins/kv_ab_figures.py``); one that reads measured seconds checks what
they are (numbers, not below 0, in the right place), never how many there are.

A static check over ``tests/**/*.py``: an ``assert`` is flagged when its expression calls a clock of :mod:`time`,
or orders (``<``, ``<=``, ``>``, ``>=``) something that names a duration (:data:`DURATION`: a name, an attribute or a
string key such as ``elapsed``, ``wall``, ``seconds``, ``step_s``, ``budget_ms``, ``clock_cost``) against anything
but 0 (a sign check: seconds are a number not below zero) or a set (``set(profiled["ops_s"]) <= ...``: names, not
times). Equality is not flagged: a wall time is never equal to a figure, so an ``==`` on seconds is on a clock the
test drives (``record.seconds == 60`` on a fake clock). :data:`ALLOWED` lists, with the reason, the few tests that
keep a bound on measured time because timing is what they check."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
#: The clocks of :mod:`time` (``time.monotonic()`` ...): an assert that reads one asserts on the time now.
CLOCKS = frozenset({"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "process_time",
                    "process_time_ns", "thread_time", "thread_time_ns"})
#: A word that names a duration: the whole name, or one of its ``_``-separated parts, or its unit suffix.
DURATION = re.compile(r"(^|_)(elapsed|duration|durations|wall|seconds|secs|took|clock|cost)(_|$)|_(s|ms|us|ns)$")
#: ``(file under tests/, test function)``: why it may bound measured time. Each entry must still be needed (a test
#: below checks that it flags something).
ALLOWED = {
    ("measuring/test_ledger_profiled.py", "test_the_clocked_step_costs_about_what_the_plain_steps_between_them_cost"):
        # what it checks is the instrument's own cost, which only timing shows: the median of 12 profiled steps
        # against the median of the plain steps timed in alternation with them on the same point (a neighbour
        # slows both), bounded at 2x where +4% to +16% is measured; an instrument that changes the step (torch
        # .profiler on CPU: 2-10x) is what it catches
        "the profiled step against the plain steps between them, a loose ratio of interleaved timings",
    ("measuring/test_ledger_profiled.py", "test_the_clock_takes_its_own_cost_out_of_each_step"):
        # a step's seconds are at least its ops' seconds by construction (``OpClock.step_s`` is a max), whatever the
        # timings; and the clock's cost per op, a median of 5 repeats of a few microseconds, is checked to be a
        # figure below a millisecond (200x what it measures), not a speed
        "an invariant of OpClock.step_s, and a sanity bound 200x above the figure measured",
}


def _words(node: ast.AST) -> set[str]:
    """The names, attributes and string subscript keys in ``node``."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
            out.add(n.slice.value)
    return out


def _reads_a_clock(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in CLOCKS
               and isinstance(n.func.value, ast.Name) and n.func.value.id == "time" for n in ast.walk(node))


def _zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value == 0


def _a_set(node: ast.AST) -> bool:
    return isinstance(node, (ast.Set, ast.SetComp)) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("set", "frozenset"))


def _ordered_durations(test: ast.AST) -> list[str]:
    """The duration words of every ordering comparison in ``test`` other than a sign check or one of sets."""
    found = []
    for node in ast.walk(test):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if not isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) or _zero(left) or _zero(right):
                continue
            if _a_set(left) or _a_set(right):
                continue
            found += sorted(w for w in _words(left) | _words(right) if DURATION.search(w))
    return found


def timing_asserts(source: str) -> list[tuple[int, str | None, str]]:
    """``(line, enclosing function or None, why)`` of each assert in ``source`` that asserts on elapsed time."""
    out = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, function or child.name)  # a nested helper counts as the test around it
                continue
            if isinstance(child, ast.Assert):
                why = (["reads a clock of time"] if _reads_a_clock(child.test) else []) + [
                    f"orders {word}" for word in dict.fromkeys(_ordered_durations(child.test))]
                if why:
                    out.append((child.lineno, function, "; ".join(why)))
            visit(child, function)

    visit(ast.parse(source), None)
    return out


def flagged() -> dict[tuple[str, str | None], list[str]]:
    """``{(file under tests/, function): ["line: why", ...]}`` over every test file."""
    out: dict[tuple[str, str | None], list[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        if "data" in path.relative_to(TESTS).parts:
            continue
        for line, function, why in timing_asserts(path.read_text()):
            out.setdefault((path.relative_to(TESTS).as_posix(), function), []).append(f"{line}: {why}")
    return out


def test_no_test_asserts_on_elapsed_time():
    found = {key: lines for key, lines in flagged().items() if key not in ALLOWED}
    assert not found, found


def test_every_allowed_test_still_bounds_measured_time():
    found = flagged()
    assert not [key for key in ALLOWED if key not in found]


def test_what_the_check_flags_and_what_it_leaves():
    flags = [
        "assert more['seconds'] <= 90",
        "assert time.monotonic() - began < 5",
        "assert elapsed < budget",
        "assert 0 <= ledger.clock_cost_per_op(counts) < 1e-3",
        "assert statistics.median(profiled['step_s']) < 2 * statistics.median(profiled['plain_s'])",
        "assert all(p.wall > 1 for p in pairs)",
        "assert done.duration_ms >= 10",
        "assert time.time() == 0",
    ]
    leaves = [
        "assert record.seconds == 60 and record.extensions[0].estimate_s == 60",  # on a clock the test drives
        "assert all(s > 0 for s in step_seconds)",  # a sign check
        "assert 0 <= row['ms']",
        "assert {'cat', 'linear'} <= set(profiled['ops_s'])",  # names
        "assert len(points) > 3 and passes < 3.05",
        "assert set(p['seconds']) == {'a', 'b'}",
    ]
    for source in flags:
        assert timing_asserts(source), source
    for source in leaves:
        assert not timing_asserts(source), source
    nested = "def test_x():\n    def check(done):\n        assert done.elapsed < 3\n    check(1)\n"
    assert timing_asserts(nested) == [(3, "test_x", "orders elapsed")]
