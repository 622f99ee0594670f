"""``kvcache export RUN.json --format github-action-benchmark``: a run's figures for the tools teams already use. One
``{name, unit, value, range?, extra?}`` entry per (class, measure), every figure one where smaller is better
(``customSmallerIsBetter``); a figure the run lacks is left out, one that is not a finite number left out and named.
The entries, units and exit status: docs/pull-requests.md ("For github-action-benchmark"). No torch here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvcache.analysing.estimates import finite, interval
from kvcache.analysing.judge import measure_table
from kvcache.analysing.records import Fit, FitFailure, Run, identity

FORMATS = ("github-action-benchmark",)
#: The measures exported (the measure table's ``exported`` rows), by name; ``memory`` names the memory verdict's
#: figures at once (allocated, peak, held), the one name they had before each could be asked for.
def exported() -> dict[str, measure_table.Measure]:
    return {m.name: m for m in measure_table.selected("exported")}


def export_groups() -> dict[str, tuple[str, ...]]:
    return {"memory": tuple(m.name for m in measure_table.of_verdict("memory") if m.exported)}


def export_names() -> tuple[str, ...]:
    """What ``--measures`` takes: each exported measure, ``memory`` for the memory verdict's together."""
    groups = export_groups()
    return (*(n for n in exported() if not any(n in g for g in groups.values())), *groups)


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


def why_no_figure(run: Run, asked: Sequence[str], notes: Sequence[str] = ()) -> str:
    """Why ``run`` has no figure for ``measures``, one line: every class skipped (with their reasons), no timed fit
    (a counted-only run, or every fit failed), no counted traffic or memory, or figures that are not numbers (the
    ``notes`` of :func:`finite_figure`)."""
    kv = run.record
    skipped = {s.cache: s.reason for s in kv.skipped if s.context is None}
    if not kv.traffic and not kv.fit and not kv.memory:
        if skipped:
            return f"every class was skipped ({'; '.join(f'{c}: {r}' for c, r in skipped.items())})"
        return "it holds no counted traffic, fit or memory of any class"
    table = measure_table.BY_NAME
    sections = {table[n].section for m in asked for n in export_groups().get(m, (m,)) if n in table}
    why = []
    if "fit" in sections and not any(isinstance(f, Fit) for f in kv.fit.values()):
        failed = {c: f.error for c, f in kv.fit.items() if isinstance(f, FitFailure)}
        why.append("no timed fit (" + ("; ".join(f"{c}: {e}" for c, e in failed.items()) if failed
                                      else "a counted-only run?") + ")")
    if "traffic" in sections and not kv.traffic:
        why.append("no counted traffic (a timed-only run?)")
    if "memory" in sections and not kv.memory:
        why.append("no counted memory")
    return "; ".join(why or notes) or "every figure asked for is missing"


def github_action_benchmark(run: Run, measures_asked: Sequence[str] | None = None,
                            notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The ``customSmallerIsBetter`` entries of ``run``: ``name`` (str), ``unit`` (str), ``value`` (a finite
    number), ``range`` (str, where the figure has an interval) and ``extra`` (str, the identity). A figure that is
    there but not a finite number is left out and named in ``notes``."""
    kv = run.record
    extra = extra_of(run)
    groups, table = export_groups(), exported()
    names = [n for measure in measures_asked or export_names() for n in groups.get(measure, (measure,))]
    entries = []
    for cache in run.caches():
        for name in names:
            m = table[name]
            raw, _ = measure_table.raw_of(kv, m, cache)
            value = finite_figure(raw, f"{cache}: {m.label}", notes)
            if value is None:  # absent, not finite, or not a number (a bool included)
                continue
            entry: dict[str, Any] = {"name": f"{cache}: {m.label}", "unit": m.unit,
                                     "value": raw if isinstance(raw, int) else value}
            text = _range(getattr(measure_table.record_of(kv, m, cache), m.interval, None)) if m.interval else None
            if text:
                entry["range"] = text
            entry["extra"] = extra
            entries.append(entry)
    return entries
