"""The figures ``kvcache sentinel`` watches and when one changed: every counted figure the gate judges, keyed by where
it sits in a run's ``kv`` section (``traffic.dynamic.passes``, ``memory.dynamic.held_passes``), found through one
table of figure families (:data:`FAMILIES`; a family joins by being present in the runs) and judged with the counted
judge's tolerance for it. Standard library only; nothing here runs anything."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from kvcache.analysing.records import KV
from kvcache.bisect import search

ANY = "*"  # in a family's path: every key found there


@dataclass(frozen=True)
class Family:
    """Figures of one kind: the bisect measure (:data:`kvcache.bisect.search.BISECT_MEASURES`) whose field, per-op
    parts and tolerance they have, found at ``path`` inside each class's record (:data:`ANY`: every key there)."""

    measure: str
    path: tuple[str, ...] = ()


#: Every counted figure the gate judges, by family: counted passes (per class, and so per attention
#: implementation), ATen ops per step and weight passes (the overhead gate), memory per step (the memory gate), and
#: counted passes per GPU class and per attention backend where the runs have them.
FAMILIES = (
    Family("passes"),
    Family("ops"),
    Family("weight"),
    Family("held"),
    Family("peak"),
    Family("allocated"),
    Family("passes", ("gpus", ANY)),  # kv.traffic.<cache>.gpus.<gpu>.passes
    Family("passes", ("backends", ANY)),  # kv.traffic.<cache>.backends.<backend>.passes
)


@dataclass(frozen=True)
class Watched:
    """One figure of one run: its key, class, the measure that reads it (a bisect follows it with that measure), its
    value, the tolerance it is judged with and its per-op parts."""

    key: str
    cache: str
    measure: search.Measure
    value: float
    tolerance: float
    detail: dict[str, float]

    @property
    def label(self) -> str:
        return label(self.measure, self.cache)


def label(measure: search.Measure, cache: str) -> str:
    """``counted passes of dynamic`` (``counted passes of dynamic, gpus T4`` inside a family's path)."""
    return f"{measure.label} of {cache}" + (f", {' '.join(measure.path)}" if measure.path else "")


def _paths(node: Any, pattern: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """The concrete paths inside the JSON object ``node`` that ``pattern`` names (:data:`ANY` matches every key)."""
    if not pattern:
        yield ()
        return
    if not isinstance(node, dict):
        return
    head, rest = pattern[0], pattern[1:]
    for key in (list(node) if head == ANY else [head]):
        if isinstance(node.get(key), dict):
            yield from ((key, *tail) for tail in _paths(node[key], rest))


def figures(kv: KV) -> dict[str, Watched]:
    """Every figure of :data:`FAMILIES` the run measured, by key, in the table's order then the run's."""
    found: dict[str, Watched] = {}
    for family in FAMILIES:
        base = search.BISECT_MEASURES[family.measure]
        records: dict[str, Any] = kv.traffic if base.section == "traffic" else kv.memory
        for cache, record in records.items():
            for path in _paths(record.to_json(), family.path):
                measure = replace(base, path=path)
                fig = search.figure_of(kv, measure, cache)
                if fig.value is None:
                    continue
                key = ".".join([base.section, cache, *path, base.key])
                found[key] = Watched(key, cache, measure, fig.value, search.tolerance(kv, measure, cache), fig.detail)
    return found


@dataclass(frozen=True)
class Moved:
    """A figure of the reference that the new run has beyond its tolerance (``after`` None: the new run has no such
    figure any more)."""

    key: str
    before: float
    after: Watched | None


def moved_figures(reference: dict[str, float], new: dict[str, Watched]) -> list[Moved]:
    """The figures of ``reference`` ({key: value}) that ``new`` changed beyond their tolerance or no longer has, in
    ``reference``'s order. A figure only ``new`` has is no change: it is recorded from then on."""
    out = []
    for key, before in reference.items():
        now = new.get(key)
        if now is None or search.differs(now.value, before, now.tolerance):
            out.append(Moved(key, before, now))
    return out
