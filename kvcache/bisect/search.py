"""The pure part of ``kvcache bisect``: which figure of a counted run is bisected, when a probe counts as changed
(*bad*: beyond the counted judge's tolerance towards the bad end; *good*; *skip*: never blamed), and which commit to
probe next. Indices: the range's commits ``0 .. n-1`` oldest first, the bad end ``n-1``, the good end ``-1``. No
torch, and nothing here runs anything (docs/bisect.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcache.analysing.compare import skip_reason
from kvcache.analysing.decoding import PHASES
from kvcache.analysing.judge import measure_table
from kvcache.analysing.judge.judges import COUNTED_RELATIVE_SLACK
from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.options import MIN_OP_PASSES, option
from kvcache.analysing.records import KV
from kvcache.analysing.sdpa.selection import BACKENDS, GPUS
from kvcache.analysing.tables import MISSING

GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass(frozen=True)
class Followed:
    """A figure a bisect follows: a row of the measure table (:mod:`kvcache.analysing.judge.measure_table`, its
    ``bisected`` rows) and, for a figure per key, the key (a GPU class, an SDPA backend): ``gpu:t4``."""

    measure: measure_table.Measure
    key: str | None = None

    @property
    def name(self) -> str:
        return f"{self.measure.name}:{self.key}" if self.key is not None else self.measure.name

    @property
    def label(self) -> str:  # for messages: "counted passes", "counted passes on t4"
        return f"{self.measure.label} {self.key}" if self.key is not None else self.measure.label

    @property
    def unit(self) -> str:
        return self.measure.unit

    @property
    def path(self) -> tuple[str, ...]:
        return measure_table.concrete_path(self.measure, self.key)


#: The keys of the per-key measures a bisect may name: the GPU classes torch's rules know, the SDPA backends, the
#: phases of a decoding strategy's step.
KEYS = {"gpu": tuple(GPUS), "backend": BACKENDS, "phase": PHASES}


def bisect_measures() -> dict[str, Followed]:
    """Every name ``--measure`` takes, by name: the table's bisected names, the older names they replaced
    (``passes``, ``weight``), a figure per key as ``gpu:t4``, ``backend:flash``."""
    return {name: Followed(m, name.partition(":")[2] or None) for name, m in measure_table.bisect_names(KEYS).items()}
DEFAULT_MEASURE = "counted"


def followed(name: str) -> Followed:
    """The figure a name recorded by a bisect or the sentinel means (any key of a per-key measure, as a run has
    it: ``gpu:T4``); counted passes for a name the table does not have (a file from before a measure's rename)."""
    try:
        measure, key = measure_table.named(name)
    except KeyError:
        return bisect_measures()[DEFAULT_MEASURE]
    return Followed(measure, key)


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


def figure_of(kv: KV, measure: Followed, cache: str) -> Figure:
    """``cache``'s figure of ``measure`` in a run's ``kv`` section (counted passes: the fused count under
    ``--kv-compile``, as the gate judges it)."""
    row = measure.measure
    raw, parts = measure_table.raw_of(kv, row, cache, measure.key)
    if not measure_table.finite_number(raw):
        record = measure_table.record_of(kv, row, cache)
        why_missing = getattr(record, "why_missing", None) if record is not None and not row.path else None
        if row.path and record is not None:  # a prediction that failed says why (``error``)
            node: Any = record.to_json()
            for part in measure.path:
                node = node.get(part) if isinstance(node, dict) else None
            why_missing = node.get("error") if isinstance(node, dict) else None
        why = skip_reason(kv, cache) or why_missing
        if why is None and row.section == "memory" and not kv.memory:
            why = "the run has no memory figures (kv.memory)"
        return Figure(None, {}, why or f"no {measure.label} of {cache} in the run")
    detail = {str(op): float(v) for op, v in (parts if isinstance(parts, dict) else {}).items()
              if measure_table.finite_number(v)}
    return Figure(float(raw), detail)


def tolerance(kv: KV, measure: Followed, cache: str) -> float:
    """How far the figure may move and still count as unchanged: the counted judge's tolerance for it (its row's
    option), from the rules the run was judged with; ops: ``--kv-ops-tolerance`` × layers; memory:
    ``--kv-memory-tolerance`` where the run has one, else the counted one (a run from before it)."""
    rules = Rules.from_settings(kv.settings)
    row = measure.measure
    if row.name == "ops":
        traffic = kv.traffic.get(cache)
        layers = traffic.layers if traffic is not None and traffic.layers else kv.model.layers
        return rules.ops_tolerance * (layers or 1)
    if row.section == "memory" and kv.settings.memory_tolerance is None:
        return rules.counted_tolerance
    setting = option(row.tolerance).setting if row.tolerance else "counted_tolerance"
    return float(getattr(rules, setting))


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


def fmt_value(value: float | None, measure: Followed) -> str:
    """A figure for the terminal: ops as a whole number, passes with two decimals (weight passes three)."""
    if value is None:
        return MISSING
    if measure.unit == "ops":
        return f"{value:g}"
    return f"{value:.3f}" if measure.measure.name == "weight_passes" else f"{value:.2f}"


def fmt_changes(changes: dict[str, float], measure: Followed) -> str:
    """``cat +2.00, clone +1.00`` (ops: ``view +30``)."""
    spec = "+g" if measure.unit == "ops" else "+.2f"
    return ", ".join(f"{op} {delta:{spec}}" for op, delta in changes.items()) or "none of its ops by itself"
