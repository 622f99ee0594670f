"""The judge's rules: what a verdict allows. Their defaults come from the options table
(:data:`kvcache.analysing.options.RULE_DEFAULTS`), their one home. Stdlib only."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvcache.analysing.options import RULE_DEFAULTS
from kvcache.analysing.records.context import RunSettings


@dataclass(frozen=True)
class Rules:
    """What the judge allows: tolerances (finite, non-negative), absolute bounds, the fit quality asked for, the
    drift allowed against the timed baseline's decode speed. Every value is checked when made (ValueError, one line
    naming the rule and the value): a NaN would fail every comparison and so pass anything."""

    tolerance: float = RULE_DEFAULTS["tolerance"]
    counted_tolerance: float = RULE_DEFAULTS["counted_tolerance"]
    min_r2: float = RULE_DEFAULTS["min_r2"]
    max_passes: dict[str, float] = field(default_factory=dict)
    strict: bool = False
    ops_tolerance: float = RULE_DEFAULTS["ops_tolerance"]  # ATen ops per layer per step
    weight_passes_tolerance: float = RULE_DEFAULTS["weight_passes_tolerance"]
    ledger_tolerance: float = RULE_DEFAULTS["ledger_tolerance"]  # timed passes an op may rise by besides tolerance
    memory_tolerance: float = RULE_DEFAULTS["memory_tolerance"]  # allocated, peak and held passes, each
    max_drift: float = RULE_DEFAULTS["max_drift"]  # the decode speed's allowed shift from the timed baseline's

    #: Every rule a run's settings hold (``kv.settings``, the ``--kv-*`` options of the same names).
    SETTINGS = ("tolerance", "counted_tolerance", "min_r2", "max_passes", "strict", "ops_tolerance",
                "weight_passes_tolerance", "ledger_tolerance", "max_drift", "memory_tolerance")

    def __post_init__(self) -> None:
        for name in ("tolerance", "counted_tolerance", "min_r2", "ops_tolerance", "weight_passes_tolerance",
                     "ledger_tolerance", "max_drift", "memory_tolerance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} {value!r} must be a finite number, at least 0")
        if self.min_r2 > 1:
            raise ValueError(f"min_r2 {self.min_r2!r} must be a number from 0 to 1")
        if not isinstance(self.max_passes, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                for v in self.max_passes.values()):
            raise ValueError(f"max_passes {self.max_passes!r} must map each cache to a finite number above 0")
        if not isinstance(self.strict, bool):
            raise ValueError(f"strict {self.strict!r} must be true or false")

    @classmethod
    def from_settings(cls, settings: RunSettings, **override: Any) -> Rules:
        """The rules a run was judged with: its settings (``kv.settings``; a rule it lacks keeps its default), each
        rule in ``override`` replacing the run's. ValueError when a value cannot judge (NaN, out of range)."""
        recorded = {k: getattr(settings, k) for k in cls.SETTINGS}
        return cls(**{**{k: v for k, v in recorded.items() if v is not None}, **override})

    def describe(self) -> str:
        """One line of the tolerances, for ``kvcache compare``'s preamble."""
        bounds = "".join(f", {cache} at most {value:g} passes" for cache, value in self.max_passes.items())
        return (f"timed ×{1 + self.tolerance:.2f} (interval lower bound), counted +{self.counted_tolerance:g} passes; "
                f"ops per step +{self.ops_tolerance:g} per layer, weight passes +{self.weight_passes_tolerance:g}; "
                f"intercept ×{1 + self.tolerance:.2f}; ledger ×{1 + self.tolerance:.2f} or "
                f"+{self.ledger_tolerance:g} passes per op; memory (allocated, peak, held) "
                f"+{self.memory_tolerance:g} passes; R² at least {self.min_r2:g}; decode speed within "
                f"±{self.max_drift:.0%} of the timed baseline's{bounds}")
