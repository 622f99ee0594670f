"""Steps in a series of figures across commits or releases (``kvcache history plot``'s markers and steps.json):
exact figures change at every step the tables show (:func:`counted_steps`); timed ones by asv's approach weighted by
each figure's interval, a step kept only where the two levels' intervals do not overlap (:func:`timed_steps`,
:func:`segments`). Unit-free (:class:`Step`; :func:`steps_markdown` for a job summary). No torch, no numpy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvcache.analysing import tables
from kvcache.analysing.estimates import median
from kvcache.analysing.judge.measure_table import COUNTED_RESOLUTION

if TYPE_CHECKING:
    from kvcache.analysing.records.file_formats import HistoryEntry

#: Half-width, relative to the value, of the interval assumed for a timed figure recorded without one.
NO_INTERVAL = 0.10
Z95 = 1.959963984540054


def counted_steps(values: Sequence[float | None], resolution: float = COUNTED_RESOLUTION) -> \
        list[tuple[int, float, float]]:
    """``(index, before, after)`` at every change of an exact series by ``resolution`` or more (entries without a
    figure skipped)."""
    steps, last = [], None
    for i, value in enumerate(values):
        if value is None:
            continue
        if last is not None and abs(value - last) >= resolution:
            steps.append((i, last, value))
        last = value
    return steps


def segments(ys: Sequence[float], ws: Sequence[float], penalty: float) -> list[int]:
    """Start indices of the weighted least-squares piecewise-constant fit of ``ys`` with ``penalty`` per segment
    (optimal partitioning, O(n²)); the first is 0."""
    n = len(ys)
    sw, swy, swyy = [0.0], [0.0], [0.0]
    for y, w in zip(ys, ws):
        sw.append(sw[-1] + w)
        swy.append(swy[-1] + w * y)
        swyy.append(swyy[-1] + w * y * y)

    def cost(i: int, j: int) -> float:  # segment ys[i:j]
        w = sw[j] - sw[i]
        return swyy[j] - swyy[i] - (swy[j] - swy[i]) ** 2 / w

    best, start = [0.0] + [math.inf] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            c = best[i] + cost(i, j) + penalty
            if c < best[j]:
                best[j], start[j] = c, i
    starts, j = [], n
    while j > 0:
        starts.append(start[j])
        j = start[j]
    return sorted(starts)


def timed_steps(values: Sequence[float | None], intervals: Sequence[Sequence[float] | None]) -> \
        list[tuple[int, float, float]]:
    """``(index, before, after)`` at the steps of a timed series whose figures come with intervals.

    1. A piecewise-constant fit (asv's model), each figure weighted by its interval (σ = half-width / 1.96; a
       figure without one gets ±:data:`NO_INTERVAL` of itself), with a penalty of 2·ln(n) per extra segment.
    2. Neighbouring levels whose intervals overlap are merged (a level's interval: the medians of its figures'
       interval bounds; its value: the median of its figures), the closest pair first, until no two neighbours
       overlap. What remains between two levels is a step, at the first entry of the later level."""
    points = [(i, v, iv) for i, (v, iv) in enumerate(zip(values, intervals)) if v is not None]
    if len(points) < 2:
        return []
    ys, ws, bounds = [], [], []
    for _, v, iv in points:
        lo, hi = (iv[0], iv[1]) if iv else (v - NO_INTERVAL * abs(v), v + NO_INTERVAL * abs(v))
        lo, hi = min(lo, v), max(hi, v)
        sigma = max((hi - lo) / (2 * Z95), 1e-9 * max(1.0, abs(v)))
        ys.append(v)
        ws.append(1 / sigma ** 2)
        bounds.append((lo, hi))
    starts = segments(ys, ws, 2 * math.log(len(ys)))
    groups = [list(range(a, b)) for a, b in zip(starts, [*starts[1:], len(ys)])]

    def level(group: list[int]) -> tuple[float, float, float]:
        return (median([ys[k] for k in group]), median([bounds[k][0] for k in group]),
                median([bounds[k][1] for k in group]))

    while len(groups) > 1:
        levels = [level(g) for g in groups]
        overlaps = [(abs(levels[k + 1][0] - levels[k][0]), k) for k in range(len(groups) - 1)
                    if levels[k][1] <= levels[k + 1][2] and levels[k + 1][1] <= levels[k][2]]
        if not overlaps:
            break
        _, k = min(overlaps)
        groups[k:k + 2] = [groups[k] + groups[k + 1]]
    levels = [level(g) for g in groups]
    return [(points[g[0]][0], levels[k][0], levels[k + 1][0]) for k, g in enumerate(groups[1:])]


@dataclass(frozen=True)
class Step:
    """A change of level in one class's series: at entry ``index`` (named ``label``), from ``before`` to
    ``after`` (the level's value; for timed figures the median of the segment)."""

    measure: str
    cache: str
    setup: str
    index: int
    label: str
    before: float
    after: float

    @property
    def delta(self) -> float:
        return self.after - self.before


def steps_markdown(steps: list[Step], entries: list[HistoryEntry], charts: list[Path]) -> str:
    """``steps.md``: the steps as a Markdown table (for a job summary; every cell escaped by the table renderer),
    with the charts drawn named."""
    by = "commit" if any(e.commit for e in entries) else "release"
    lines = [f"#### Trend across {len(entries)} {by}s", "",
             f"Charts: {', '.join(f'`{p.name}`' for p in charts) or 'none'}. Counted figures: every change is a "
             "step; timed: a step where the levels' intervals do not overlap.", ""]
    if not steps:
        return "\n".join([*lines, "No steps.", ""])
    rows = [[s.measure, s.cache, s.setup, s.label, f"{s.before:.4g}", f"{s.after:.4g}", f"{s.delta:+.4g}"]
            for s in steps]
    table = tables.Table(["measure", "class", "setup", f"at {by}", "before", "after", "Δ"], rows, None, [4, 5, 6])
    return "\n".join([*lines, *tables.markdown(table), ""])
