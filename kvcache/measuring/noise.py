"""``--kv-remeasure``'s choice of points: which timed (cache, context) points were noisiest, from the median and
interquartile range (seconds) of each round's steps. Plain arithmetic: no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcache.analysing.estimates import median

Key = tuple[str, int]  # (cache, context)


@dataclass
class RoundMedians:
    """Per timed (cache, context): each round's median step and the interquartile range of its steps (seconds)."""

    rounds: dict[Key, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, cache: str, context: int, samples: list[float]) -> None:
        """One round's step seconds of a point."""
        ordered = sorted(samples)
        iqr = ordered[3 * len(ordered) // 4] - ordered[len(ordered) // 4]
        self.rounds.setdefault((cache, context), []).append((median(ordered), iqr))

    def noise(self, key: Key) -> float:
        """Relative spread of a point's round medians ((max - min) / median); with one round, the relative
        interquartile range of its steps (0 for a zero median)."""
        runs = self.rounds[key]
        if len(runs) > 1:
            medians = [m for m, _ in runs]
            return (max(medians) - min(medians)) / median(medians)
        middle, iqr = runs[0]
        return iqr / middle if middle else 0.0

    def noisiest(self) -> list[Key]:
        """Every point measured, noisiest first."""
        return sorted(self.rounds, key=self.noise, reverse=True)
