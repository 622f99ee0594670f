"""``kvcache export RUN.json --format github-action-benchmark``: a run's figures for the tools teams already use. One
``{name, unit, value, range?, extra?}`` entry per (class, measure), every figure one where smaller is better
(``customSmallerIsBetter``); a figure the run lacks is left out, one that is not a finite number left out and named.
The entries, units and exit status: docs/pull-requests.md ("For github-action-benchmark"). No torch here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvcache.analysing import identity, judges
from kvcache.analysing.estimates import finite, interval
from kvcache.analysing.records import Fit, FitFailure, Run

FORMATS = ("github-action-benchmark",)
#: measure -> (name suffix, unit, section (kv.traffic or kv.fit), the record's field, its interval field)
EXPORT_MEASURES: dict[str, tuple[str, str, str, str, str | None]] = {
    "counted": ("counted passes", "passes", "traffic", "passes", None),
    "ops": ("ATen ops per step", "ops", "traffic", "ops_per_step", None),
    "weight_passes": ("weight passes", "passes", "traffic", "weight_passes", None),
    "timed": ("timed passes", "passes", "fit", "passes", "passes_ci"),
    "intercept": ("intercept", "ms", "fit", "intercept_ms", "intercept_ci"),
}
ALL = (*EXPORT_MEASURES, "memory")


def extra_of(run: Run) -> str:
    """The run's identity as one line: ``tiny, bfloat16 on cpu: ...; transformers 5.24.0; torch 2.13.0+cpu``."""
    ident = identity.of_run(run.record)
    return f"{identity.describe(ident)}; transformers {run.transformers}; torch {ident.torch}"


def _range(value: Any) -> str | None:
    bounds = interval(value)
    return None if bounds is None else f"{bounds[0]:.4g} to {bounds[1]:.4g} (bootstrap interval)"


def finite_figure(raw: Any, label: str, notes: list[str] | None) -> float | None:
    """``raw`` as a finite float (:func:`~kvcache.analysing.estimates.finite`); None when absent or not a finite
    number, the latter said in ``notes`` (``LABEL is nan, not a finite number: left out``): never dropped quietly."""
    value = finite(raw)
    if value is None and raw is not None and notes is not None:
        notes.append(f"{label} is {raw!r}, not a finite number: left out")
    return value


def why_no_figure(run: Run, measures: Sequence[str], notes: Sequence[str] = ()) -> str:
    """Why ``run`` has no figure for ``measures``, one line: every class skipped (with their reasons), no timed fit
    (a counted-only run, or every fit failed), no counted traffic or memory, or figures that are not numbers (the
    ``notes`` of :func:`finite_figure`)."""
    kv = run.record
    skipped = {s.cache: s.reason for s in kv.skipped if s.context is None}
    if not kv.traffic and not kv.fit and not kv.memory:
        if skipped:
            return f"every class was skipped ({'; '.join(f'{c}: {r}' for c, r in skipped.items())})"
        return "it holds no counted traffic, fit or memory of any class"
    why = []
    if {"timed", "intercept"} & set(measures) and not any(isinstance(f, Fit) for f in kv.fit.values()):
        failed = {c: f.error for c, f in kv.fit.items() if isinstance(f, FitFailure)}
        why.append("no timed fit (" + ("; ".join(f"{c}: {e}" for c, e in failed.items()) if failed
                                      else "a counted-only run?") + ")")
    if {"counted", "ops", "weight_passes"} & set(measures) and not kv.traffic:
        why.append("no counted traffic (a timed-only run?)")
    if "memory" in measures and not kv.memory:
        why.append("no counted memory")
    return "; ".join(why or notes) or "every figure asked for is missing"


def github_action_benchmark(run: Run, measures: Sequence[str] = ALL,
                            notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The ``customSmallerIsBetter`` entries of ``run``: ``name`` (str), ``unit`` (str), ``value`` (a finite
    number), ``range`` (str, where the figure has an interval) and ``extra`` (str, the identity). A figure that is
    there but not a finite number is left out and named in ``notes``."""
    kv = run.record
    extra = extra_of(run)
    sections: dict[str, dict[str, Any]] = {"traffic": kv.traffic,
                                           "fit": {c: f for c, f in kv.fit.items() if isinstance(f, Fit)}}
    entries = []
    for cache in run.caches():
        for measure in measures:
            if measure == "memory":
                memory = kv.memory.get(cache)  # allocated, peak and held passes
                figures = {} if memory is None else {
                    n: finite_figure(getattr(memory, n), f"{cache}: memory {n.replace('_', ' ')}", notes)
                    for n in judges.MEMORY_FIGURES}
                entries += [{"name": f"{cache}: memory {name.replace('_', ' ')}", "unit": "passes", "value": value,
                             "extra": extra} for name, value in figures.items() if value is not None]
                continue
            suffix, unit, section, key, interval_key = EXPORT_MEASURES[measure]
            record = sections[section].get(cache)
            raw = getattr(record, key) if record is not None else None
            value = finite_figure(raw, f"{cache}: {suffix}", notes)
            if value is None:  # absent, not finite, or not a number (a bool included)
                continue
            entry: dict[str, Any] = {"name": f"{cache}: {suffix}", "unit": unit,
                                     "value": raw if isinstance(raw, int) else value}
            text = _range(getattr(record, interval_key)) if interval_key else None
            if text:
                entry["range"] = text
            entry["extra"] = extra
            entries.append(entry)
    return entries
