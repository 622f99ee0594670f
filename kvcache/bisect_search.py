"""The pure part of ``kvcache bisect``: which figure of a counted run is bisected, when a probe counts as changed,
and which commit to probe next. Standard library only (plus the judge's tolerances, :mod:`kvcache.analysing.gate`);
nothing here runs anything.

Counted figures are exact, so every probe gives a definite answer. A probe is *bad* when its figure differs from the
reference (the good end, or the last change found) by more than the counted judge's tolerance for that figure, in the
direction of the bad end; otherwise *good*. A probe that could not be measured is *skip*: never blamed, like
``git bisect skip``.

Indices: the commits of the range are ``0 .. n-1`` oldest first, ``n-1`` is the bad end; the good end is ``-1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvcache.analysing.gate import COUNTED_RELATIVE_SLACK, OP_CHANGE, Rules, counted_traffic

GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass(frozen=True)
class Measure:
    """A figure of a run's ``kv`` section that a bisect can follow."""

    name: str
    label: str  # for messages: "counted passes"
    unit: str  # "passes", "ops", "weight passes"
    section: str  # "traffic" or "memory"
    key: str  # the figure's key in kv.<section>.<cache>


MEASURES = {
    "passes": Measure("passes", "counted passes", "passes", "traffic", "passes"),
    "ops": Measure("ops", "ATen ops per step", "ops", "traffic", "ops_per_step"),
    "weight": Measure("weight", "weight passes", "weight passes", "traffic", "weight_passes"),
    "held": Measure("held", "memory held per step", "held passes", "memory", "held_passes"),
    "peak": Measure("peak", "memory peak per step", "peak passes", "memory", "peak_passes"),
    "allocated": Measure("allocated", "memory allocated per step", "allocated passes", "memory", "allocated_passes"),
}


@dataclass
class Figure:
    """One class's figure in one run: ``value`` (None when it was not measured, with ``reason``) and ``detail``, the
    per-op parts (counted passes by op, or ATen calls by op) the difference between two commits is named by."""

    value: float | None
    detail: dict[str, float]
    reason: str | None = None


def classes(kv: dict[str, Any]) -> list[str]:
    """The classes of a run, in its own order: its settings' classes, then any it measured besides."""
    settings = kv.get("settings") or {}
    names = [*settings.get("caches", []), *(kv.get("traffic") or {}), *(kv.get("memory") or {})]
    return [c for c in dict.fromkeys(names) if c != "all"]


def skip_reason(kv: dict[str, Any], cache: str) -> str | None:
    """Why the run recorded no figure for ``cache`` (``kv.skipped``), or None."""
    for entry in kv.get("skipped") or []:
        if entry.get("cache") == cache:
            return str(entry.get("reason") or "skipped")
    return None


def figure(kv: dict[str, Any], measure: Measure, cache: str) -> Figure:
    """``cache``'s figure of ``measure`` in a run's ``kv`` section (counted passes: the fused count under
    ``--kv-compile``, as the gate judges it)."""
    section = (kv.get(measure.section) or {}).get(cache)
    if measure.name == "passes":
        section = counted_traffic(section)
    value = (section or {}).get(measure.key) if isinstance(section, dict) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        why = skip_reason(kv, cache)
        if why is None and isinstance(section, dict) and section.get("why_missing"):
            why = str(section["why_missing"])
        if why is None and measure.section == "memory" and not kv.get("memory"):
            why = "the run has no memory figures (kv.memory)"
        return Figure(None, {}, why or f"no {measure.label} of {cache} in the run")
    if measure.name == "passes":
        detail = section.get("by_op") or {}
    elif measure.name == "ops":
        detail = section.get("calls") or {}
    elif measure.section == "memory":
        detail = section.get("by_op") or {}
    else:
        detail = {}
    detail = {str(k): float(v) for k, v in detail.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return Figure(float(value), detail)


def tolerance(kv: dict[str, Any], measure: Measure, cache: str) -> float:
    """How far the figure may move and still count as unchanged: the counted judge's tolerance for it, from the rules
    the run was judged with (``--kv-counted-tolerance``; ``--kv-ops-tolerance`` × layers for ops;
    ``--kv-weight-passes-tolerance``; memory: ``memory_tolerance`` where the run has one, else the counted one)."""
    settings = kv.get("settings") or {}
    rules = Rules.from_settings(settings)
    if measure.name == "ops":
        layers = ((kv.get("traffic") or {}).get(cache) or {}).get("layers") or (kv.get("model") or {}).get("layers")
        return rules.ops_tolerance * (layers or 1)
    if measure.name == "weight":
        return rules.weight_passes_tolerance
    if measure.section == "memory":
        value = settings.get("memory_tolerance")
        return float(value) if isinstance(value, (int, float)) else rules.counted_tolerance
    return rules.counted_tolerance


def differs(value: float, reference: float, tol: float) -> bool:
    """Whether two exact figures differ by more than ``tol`` (with the judge's rounding slack)."""
    return abs(value - reference) > tol * (1 + COUNTED_RELATIVE_SLACK) + 1e-12


def verdict(value: float | None, reference: float, bad: float, tol: float) -> str:
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
    return dict(sorted(((op, d) for op, d in moved.items() if abs(d) > OP_CHANGE),
                       key=lambda kv: (-abs(kv[1]), kv[0])))


def fmt_value(value: float | None, measure: Measure) -> str:
    """A figure for the terminal: ops as a whole number, passes with two decimals (weight passes three)."""
    if value is None:
        return "-"
    if measure.name == "ops":
        return f"{value:g}"
    return f"{value:.3f}" if measure.name == "weight" else f"{value:.2f}"


def fmt_changes(changes: dict[str, float], measure: Measure) -> str:
    """``cat +2.00, clone +1.00`` (ops: ``view +30``)."""
    spec = "+g" if measure.name == "ops" else "+.2f"
    return ", ".join(f"{op} {delta:{spec}}" for op, delta in changes.items()) or "none of its ops by itself"
