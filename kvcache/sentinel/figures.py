"""The figures ``kvcache sentinel`` watches and when one changed: every counted figure the gate judges, keyed by where
it sits in a run's ``kv`` section (``traffic.dynamic.passes``, ``memory.dynamic.held_passes``), found through the
measure table's ``watched`` rows (:mod:`kvcache.analysing.judge.measure_table`; a figure joins by being present in the
runs) and judged with the counted judge's tolerance for it. Standard library only; nothing here runs anything."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcache.analysing.judge import measure_table
from kvcache.analysing.records import KV
from kvcache.bisect import search


@dataclass(frozen=True)
class Watched:
    """One figure of one run: its key, class, the measure that reads it (a bisect follows it with that measure), its
    value, the tolerance it is judged with and its per-op parts."""

    key: str
    cache: str
    measure: search.Followed
    value: float
    tolerance: float
    detail: dict[str, float]

    @property
    def label(self) -> str:
        return label(self.measure, self.cache)


def label(measure: search.Followed, cache: str) -> str:
    """``counted passes of dynamic`` (``counted passes on T4 of dynamic`` for a figure per key)."""
    return f"{measure.label} of {cache}"


def figures(kv: KV) -> dict[str, Watched]:
    """Every watched figure (the measure table's ``watched`` rows) the run measured, by key, in the table's order
    then the run's; a figure per key (a GPU class, an SDPA backend) for every key the run has."""
    found: dict[str, Watched] = {}
    for row in measure_table.selected("watched"):
        records: dict[str, Any] = getattr(kv, row.section)
        for cache in records:
            keys = measure_table.keys_of(kv, row, cache) if row.per_key else [None]
            for key in keys:
                measure = search.Followed(row, key)
                fig = search.figure_of(kv, measure, cache)
                if fig.value is None:
                    continue
                name = ".".join([row.section, cache, *measure.path, row.field])
                found[name] = Watched(name, cache, measure, fig.value, search.tolerance(kv, measure, cache),
                                      fig.detail)
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
