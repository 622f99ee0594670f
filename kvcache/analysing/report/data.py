"""Runs shaped into what the report tables and draws: names, points per class, per-point quartiles, the line
of each class, skipped points, crossovers and the HTML chart's data. Numbers only, nothing drawn here.

Units: times in ms, sizes in MB (1e6 bytes) or bytes where a name says so, contexts in tokens, passes =
bytes moved per byte of KV cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvcache.analysing import bandwidth, tables
from kvcache.analysing import fit as fitting
from kvcache.analysing.estimates import finite, median
from kvcache.analysing.records import KV, Crossovers, Fit, Point, Run, jsonable
from kvcache.analysing.tables import MISSING

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
DASHES = ["", "6 4", "2 3", "8 3 2 3"]
TRAINED_REACH = 1.5  # draw the trained context if it lies within this factor of the largest measured context


class ReportError(RuntimeError):
    """A report that cannot be written (no matplotlib, unwritable directory); the message is one line."""


# ----------------------------------------------------------------------------------------------- runs


def shape_text(value: Any) -> str:
    """A tensor shape as ``1×3×1024×64``; ``none`` for no tensor."""
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return "×".join(str(v) for v in value) if value else "scalar"
    return str(value)


def run_names(runs: list[Run]) -> list[str]:
    """Display name of each run: its label, plus the file name where labels repeat (:func:`tables.unique_labels`)."""
    return tables.unique_labels([run.label for run in runs], [run.path for run in runs])


def model_name(kv: KV) -> str:
    """The model of a run: its description's name, else the ``--kv-model`` it was asked for."""
    return str(kv.model.name or kv.settings.model or "?")


def dtype(kv: KV) -> str:
    return str(kv.settings.dtype or kv.model.dtype or "?")


def run_title(run: Run, name: str) -> str:
    """A chart title: the run's name over its model and dtype."""
    kv = run.record
    return f"{name}\n{model_name(kv)}, {dtype(kv)}"


def run_caches(run: Run) -> list[str]:
    """Cache classes of a run: those with points or records, then those only named in its settings."""
    caches = run.caches()
    for cache in run.record.settings.caches:
        if str(cache) not in caches:
            caches.append(str(cache))
    return caches


def all_caches(runs: list[Run]) -> list[str]:
    """Cache classes of all runs, in first-seen order (fixes each class's colour)."""
    seen: dict[str, None] = {}
    for run in runs:
        for cache in run_caches(run):
            seen.setdefault(cache)
    return list(seen)


def cache_colours(runs: list[Run]) -> dict[str, str]:
    return {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(all_caches(runs))}


def points_by_cache(run: Run) -> dict[str, list[Point]]:
    """Timed points of each cache class, sorted by context then round."""
    groups: dict[str, list[Point]] = {}
    for p in run.points:
        groups.setdefault(p.cache, []).append(p)
    return {c: sorted(ps, key=lambda p: (p.context, p.round)) for c, ps in groups.items()}


def point_stats(p: Point) -> dict[str, float]:
    """Median and quartiles of a point's per-step times, in ms."""
    ms = np.asarray(p.samples_s, dtype=float) * 1e3
    q25, q50, q75 = np.percentile(ms, [25, 50, 75])
    return {"median_ms": float(q50), "q25_ms": float(q25), "q75_ms": float(q75)}


def per_context(points: list[Point]) -> list[dict[str, Any]]:
    """Per context: median over rounds of the point medians (ms), mean KV bytes (and MB), mean counted MB."""
    by_ctx: dict[int, list[Point]] = {}
    for p in points:
        by_ctx.setdefault(p.context, []).append(p)
    out = []
    for ctx in sorted(by_ctx):
        ps = by_ctx[ctx]
        counted = [float(p.counted_bytes) for p in ps if finite(p.counted_bytes) is not None]
        out.append({
            "context": ctx,
            "median_ms": median(point_stats(p)["median_ms"] for p in ps),
            "kv_bytes": sum(p.kv_bytes for p in ps) / len(ps),
            "kv_mb": sum(p.kv_bytes for p in ps) / len(ps) / 1e6,
            "counted_mb": sum(counted) / len(counted) / 1e6 if counted else None,
            "rounds": len(ps),
        })
    return out


def trained_context(kv: KV) -> int | None:
    """The model's trained context in tokens (kv.model.max_position_embeddings), if known."""
    x = finite(kv.model.max_position_embeddings)
    return int(x) if x else None


def skip_reasons(run: Run) -> dict[tuple[str, int | None], str]:
    """kv.skipped as {(cache, context or None for the whole class): reason}."""
    return {(skip.cache, skip.context): skip.reason or "no reason" for skip in run.record.skipped}


def missing_points(run: Run) -> list[tuple[str, int, str]]:
    """(cache, context, why) for each context measured by some class of the run but not by this one."""
    groups = points_by_cache(run)
    contexts = sorted({p.context for p in run.points})
    reasons = skip_reasons(run)
    out = []
    for cache in run_caches(run):
        have = {p.context for p in groups.get(cache, [])}
        for ctx in contexts:
            if ctx not in have:
                why = reasons.get((cache, ctx)) or reasons.get((cache, None))
                out.append((cache, ctx, f"skipped: {why}" if why else "not measured (no skip reason recorded)"))
    return out


# ----------------------------------------------------------------------------------------------- lines


def refit(points: list[Point]) -> fitting.LineFit:
    """The line of a class's point medians, ms against KV bytes, for a run without kv.fit; FitError (one line,
    why) where :mod:`kvcache.analysing.fit` would give no passes figure from these points."""
    contexts = {p.context for p in points}
    if len(contexts) < fitting.MIN_CONTEXTS:
        raise fitting.FitError(fitting.too_few_contexts(len(contexts)))
    fitting.check_finite(points)
    line = fitting.least_squares([p.kv_bytes for p in points], [point_stats(p)["median_ms"] for p in points])
    fitting.check_slope(line.slope / fitting.MS_PER_S)
    return line


def fit_problem(run: Run, cache: str, points: list[Point]) -> str | None:
    """Why a class has no passes figure and no fitted line, or None: the reason kv.fit records (runs written
    before fits were checked are held to the same rules, :func:`kvcache.analysing.fit.record_problem`); with no
    kv.fit for the class, why its points give no line (:func:`refit`)."""
    fit = run.record.fit.get(cache)
    if fit is not None:
        return fitting.record_problem(fit)
    try:
        refit(points)
    except fitting.FitError as exc:
        return str(exc)
    return None


def fit_line(run: Run, cache: str, points: list[Point]) -> dict[str, Any] | None:
    """Intercept (ms) and slope (ms per KV byte) of a class's line: from kv.fit, else refit from its points.

    Slope = 1 / (effective_gbps * 1e6) ms per byte. Returns None when neither is possible or the fit gives no
    passes figure (:func:`fit_problem`): no line is drawn from a fit that cannot be judged.
    """
    fit = run.record.fit.get(cache)
    if fit is not None:
        if fitting.record_problem(fit) is not None or not isinstance(fit, Fit):
            return None
        intercept, eff = finite(fit.intercept_ms), finite(fit.effective_gbps)
        if intercept is not None and eff is not None and eff > 0:
            return {"intercept_ms": intercept, "ms_per_byte": 1.0 / (eff * 1e6), "source": "kv.fit"}
        return None
    try:
        line = refit(points)
    except fitting.FitError:
        return None
    return {"intercept_ms": line.intercept, "ms_per_byte": line.slope, "source": "refit from points"}


def no_figure_cell(reason: str) -> str:
    """A table cell in place of the timed passes: why there is no figure."""
    return f"{MISSING} ({reason})" if fitting.NO_FIGURE in reason else f"{MISSING} ({fitting.NO_FIGURE}: {reason})"


def run_crossovers(kv: KV) -> Crossovers:
    """Contexts (tokens) where the KV cache meets the weights: ``kv.crossovers`` when the run records them, else
    worked out from the run by the analysis's own rule (:func:`kvcache.analysing.bandwidth.crossovers`)."""
    if kv.crossovers is not None:
        return kv.crossovers
    return bandwidth.crossovers(kv.model, kv.fit, kv.traffic, kv.memory)


# ----------------------------------------------------------------------------------------------- HTML chart


def chart_data(runs: list[Run]) -> dict[str, Any]:
    """What the HTML chart draws: one series per (run, cache class), contexts in tokens, times in ms, sizes in MB."""
    colours = cache_colours(runs)
    names = run_names(runs)
    series = []
    contexts: set[int] = set()
    trained: dict[int, None] = {}
    for ri, (run, name) in enumerate(zip(runs, names)):
        groups = points_by_cache(run)
        reasons = skip_reasons(run)
        tc = trained_context(run.record)
        if tc:
            trained.setdefault(tc)
        for cache in run_caches(run):
            pts = groups.get(cache, [])
            contexts.update(p.context for p in pts)
            points = []
            for p in pts:
                counted = finite(p.counted_bytes)
                points.append({"context": p.context, "round": p.round, **point_stats(p), "kv_mb": p.kv_bytes / 1e6,
                               "counted_mb": None if counted is None else counted / 1e6,
                               "beyond": p.beyond_trained_context})
            skipped = {str(ctx): why for (c, ctx), why in reasons.items() if c == cache and ctx is not None}
            series.append({
                "id": f"s{len(series)}", "cache": cache, "run": name,
                "label": cache if len(runs) == 1 else f"{cache} — {name}",
                "colour": colours[cache], "dash": DASHES[ri % len(DASHES)], "points": points,
                "medians": [{k: v for k, v in c.items() if k != "kv_bytes"} for c in per_context(pts)],
                "skipped": skipped, "skipped_class": reasons.get((cache, None)),
            })
    max_ctx = max(contexts, default=0)
    trained_list = [t for t in trained if max_ctx and t <= TRAINED_REACH * max_ctx]
    ymax = max((p["q75_ms"] for s in series for p in s["points"]), default=0.0)
    return jsonable({
        "series": series, "contexts": sorted(contexts), "trained": trained_list,
        "trained_beyond": [t for t in trained if t not in trained_list],
        "xmax": max([max_ctx, *trained_list]) * 1.04 if max_ctx else 1.0,
        "ymax": ymax * 1.08 if ymax > 0 else 1.0,
    })
