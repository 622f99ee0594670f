"""The pure part of ``kvcache bisect``: which figure of a counted run is bisected, when a probe counts as changed
(*bad*: beyond the counted judge's tolerance towards the bad end; *good*; *skip*: never blamed), and which commit to
probe next. Indices: the range's commits ``0 .. n-1`` oldest first, the bad end ``n-1``, the good end ``-1``. No
torch, and nothing here runs anything (docs/bisect.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvcache.analysing.compare import skip_reason
from kvcache.analysing.judges import COUNTED_RELATIVE_SLACK
from kvcache.analysing.options import MIN_OP_PASSES
from kvcache.analysing.records import KV
from kvcache.analysing.rules import Rules
from kvcache.analysing.sdpa_rules import GPUS
from kvcache.analysing.tables import MISSING

GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass(frozen=True)
class Measure:
    """A figure of a run's ``kv`` section that a bisect can follow: the record field ``key`` of
    ``kv.<section>.<cache>`` and ``detail``, the field of its per-op parts (None: it has none); with ``path``, the
    fields of the object at that path inside the class's record instead (``("gpus", "T4")``:
    ``kv.traffic.<cache>.gpus.T4.passes``), read from its JSON, so that a family of figures a later schema adds is
    followed before any record knows it."""

    name: str
    label: str  # for messages: "counted passes"
    unit: str  # "passes", "ops", "weight passes"
    section: str  # "traffic" or "memory"
    key: str
    detail: str | None = None
    path: tuple[str, ...] = ()


BISECT_MEASURES = {
    "passes": Measure("passes", "counted passes", "passes", "traffic", "passes", "by_op"),
    "ops": Measure("ops", "ATen ops per step", "ops", "traffic", "ops_per_step", "calls"),
    "weight": Measure("weight", "weight passes", "weight passes", "traffic", "weight_passes"),
    # held: no per-op detail (the bytes a step keeps are not what one op allocated)
    "held": Measure("held", "memory held per step", "held passes", "memory", "held_passes"),
    "peak": Measure("peak", "memory peak per step", "peak passes", "memory", "peak_passes", "peak_by_op"),
    "allocated": Measure("allocated", "memory allocated per step", "allocated passes", "memory", "allocated_passes",
                         "allocated_by_op"),
    # per GPU class (--kv-gpus, added to every probe): the step's counted passes under the SDPA backend torch's rules
    # select on that class
    **{f"gpu:{gpu}": Measure(f"gpu:{gpu}", f"counted passes on {gpu}", "passes", "gpus", gpu, "by_op")
       for gpu in GPUS},
}


@dataclass
class Figure:
    """One class's figure in one run: ``value`` (None when it was not measured, with ``reason``) and ``detail``, the
    per-op parts (counted passes by op, ATen calls by op, or memory passes by op) the difference between two commits
    is named by."""

    value: float | None
    detail: dict[str, float]
    reason: str | None = None


def classes(kv: KV) -> list[str]:
    """The classes of a run, in its own order: its settings' classes, then any it measured besides."""
    names = [*kv.settings.caches, *kv.traffic, *kv.memory]
    return [c for c in dict.fromkeys(names) if c != "all"]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def figure_of(kv: KV, measure: Measure, cache: str) -> Figure:
    """``cache``'s figure of ``measure`` in a run's ``kv`` section (counted passes: the fused count under
    ``--kv-compile``, as the gate judges it)."""
    why_missing = None
    if measure.section == "gpus":  # the class's figure on that GPU class: a Counted with passes, by_op
        traffic = kv.traffic.get(cache)
        record: Any = traffic.gpu_counted().get(measure.key) if traffic is not None else None
        why_missing = record.why_missing if record is not None else None
        value = record.passes if record is not None else None
        if not _number(value):
            return Figure(None, {}, skip_reason(kv, cache) or why_missing or f"no {measure.label} of {cache} in the "
                          "run")
        return Figure(float(value), {str(op): float(v) for op, v in record.by_op.items() if _number(v)})
    if measure.section == "memory":
        record = kv.memory.get(cache)
    elif measure.name == "passes" and not measure.path:  # the fused count under --kv-compile, else the eager one
        traffic = kv.traffic.get(cache)
        record = traffic.counted() if traffic is not None else None
        why_missing = record.why_missing if record is not None else None
    else:
        record = kv.traffic.get(cache)
    if measure.path:  # a figure inside the class's record: read from its JSON
        node: Any = record.to_json() if record is not None else None
        for part in measure.path:
            node = node.get(part) if isinstance(node, dict) else None
        value = node.get(measure.key) if isinstance(node, dict) else None
        parts = node.get(measure.detail) if isinstance(node, dict) and measure.detail else None
    else:
        value = None if record is None else getattr(record, measure.key)
        parts = getattr(record, measure.detail) if measure.detail and record is not None else None
    if not _number(value):
        why = skip_reason(kv, cache) or why_missing
        if why is None and measure.section == "memory" and not kv.memory:
            why = "the run has no memory figures (kv.memory)"
        return Figure(None, {}, why or f"no {measure.label} of {cache} in the run")
    detail = {str(op): float(v) for op, v in (parts if isinstance(parts, dict) else {}).items() if _number(v)}
    return Figure(float(value), detail)


def tolerance(kv: KV, measure: Measure, cache: str) -> float:
    """How far the figure may move and still count as unchanged: the counted judge's tolerance for it, from the rules
    the run was judged with (``--kv-counted-tolerance``; ``--kv-ops-tolerance`` × layers for ops;
    ``--kv-weight-passes-tolerance``; memory: ``--kv-memory-tolerance`` where the run has one, else the counted
    one)."""
    rules = Rules.from_settings(kv.settings)
    if measure.name == "ops":
        traffic = kv.traffic.get(cache)
        layers = traffic.layers if traffic is not None and traffic.layers else kv.model.layers
        return rules.ops_tolerance * (layers or 1)
    if measure.name == "weight":
        return rules.weight_passes_tolerance
    if measure.section == "memory":
        return rules.memory_tolerance if kv.settings.memory_tolerance is not None else rules.counted_tolerance
    return rules.counted_tolerance


def differs(value: float, reference: float, tol: float) -> bool:
    """Whether two exact figures differ by more than ``tol`` (with the judge's rounding slack)."""
    return abs(value - reference) > tol * (1 + COUNTED_RELATIVE_SLACK) + 1e-12


def good_or_bad(value: float | None, reference: float, bad: float, tol: float) -> str:
    """``bad`` when ``value`` moved from ``reference`` by more than ``tol`` towards the bad end's figure ``bad``,
    ``skip`` when there is no value, else ``good``."""
    if value is None:
        return SKIP
    direction = 1.0 if bad >= reference else -1.0
    return BAD if direction * (value - reference) > tol * (1 + COUNTED_RELATIVE_SLACK) + 1e-12 else GOOD


def moved_away(value: float, reference: float, bad: float, tol: float) -> bool:
    """Whether ``value`` moved from ``reference`` beyond ``tol`` away from the bad end (a figure that went the other
    way first: the bisect takes it as good, and says so)."""
    direction = 1.0 if bad >= reference else -1.0
    return direction * (value - reference) < -tol * (1 + COUNTED_RELATIVE_SLACK) - 1e-12


def bracket(lo: int, hi: int, verdicts: dict[int, str]) -> tuple[int, int]:
    """The narrowest ``(good, bad)`` pair the probes allow inside ``[lo, hi]``: the last good index, then the first
    bad index after it (``lo`` is good and ``hi`` bad by definition)."""
    good = max([lo, *(i for i, v in verdicts.items() if lo < i < hi and v == GOOD)])
    bad = min([hi, *(i for i, v in verdicts.items() if good < i < hi and v == BAD)])
    return good, bad


def next_probe(lo: int, hi: int, verdicts: dict[int, str]) -> int | None:
    """The next index to probe between the good ``lo`` and the bad ``hi``: the unprobed one nearest the middle of the
    narrowest bracket (rounded down; the later one on a tie, as after a skipped middle); None when none is left."""
    good, bad = bracket(lo, hi, verdicts)
    middle = (good + bad) // 2
    left = [i for i in range(good + 1, bad) if i not in verdicts]
    return min(left, key=lambda i: (abs(i - middle), -i)) if left else None


def outcome(lo: int, hi: int, verdicts: dict[int, str]) -> tuple[int, int, list[int]]:
    """``(good, first_bad, skipped)`` once nothing is left to probe: ``first_bad`` is the first bad commit when
    ``skipped`` is empty; otherwise the first bad commit is one of ``skipped + [first_bad]`` (only commits that could
    not be measured lie between the last good and the first bad one)."""
    good, bad = bracket(lo, hi, verdicts)
    return good, bad, [i for i in range(good + 1, bad) if verdicts.get(i) == SKIP]


def op_changes(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """``{op: after - before}`` of the ops whose part moved by more than the judge's per-op step (new and vanished
    ops included), the largest move first."""
    ops = dict.fromkeys([*before, *after])
    moved = {op: after.get(op, 0.0) - before.get(op, 0.0) for op in ops}
    return dict(sorted(((op, d) for op, d in moved.items() if abs(d) > MIN_OP_PASSES),
                       key=lambda kv: (-abs(kv[1]), kv[0])))


def fmt_value(value: float | None, measure: Measure) -> str:
    """A figure for the terminal: ops as a whole number, passes with two decimals (weight passes three)."""
    if value is None:
        return MISSING
    if measure.name == "ops":
        return f"{value:g}"
    return f"{value:.3f}" if measure.name == "weight" else f"{value:.2f}"


def fmt_changes(changes: dict[str, float], measure: Measure) -> str:
    """``cat +2.00, clone +1.00`` (ops: ``view +30``)."""
    spec = "+g" if measure.name == "ops" else "+.2f"
    return ", ".join(f"{op} {delta:{spec}}" for op, delta in changes.items()) or "none of its ops by itself"
