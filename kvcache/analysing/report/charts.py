"""latency.png, traffic.png, ledger.png and memory.png (matplotlib, imported lazily, Agg backend; what each shows:
docs/reports.md). Text from a run is drawn as it is: mathtext is off while a figure is built and saved
(:func:`_plain_text`), so a ``$`` in a name can neither typeset nor break the chart, and a control character
(ESC, ...) is drawn as its code."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from kvcache.analysing.estimates import finite
from kvcache.analysing.records import Run, Traffic
from kvcache.analysing.report.data import (
    PALETTE,
    TRAINED_REACH,
    ReportError,
    cache_colours,
    fit_line,
    fit_problem,
    missing_points,
    per_context,
    point_stats,
    points_by_cache,
    run_caches,
    run_names,
    run_title,
    trained_context,
)
from kvcache.analysing.tables import chart_text

TOP_OPS = 7  # traffic.png shows this many largest ops; the rest are stacked as "other ops"
BARS_PER_ROW = 12  # traffic.png starts a new row of bars past this many cache classes ...
RUNS_PER_ROW = 4  # ... or this many runs
NO_BREAKDOWN = "total (no per-op breakdown)"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ReportError("matplotlib is not installed (pip install matplotlib; in a checkout, "
                          "pip install -e '.[report]'); "
                          "cannot write latency.png and traffic.png") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


F = TypeVar("F", bound=Callable[..., Any])


def _plain_text(func: F) -> F:
    """``func`` run with matplotlib's mathtext off (rcParam ``text.parse_math``): every text the figure gets
    is drawn literally, never parsed as ``$...$`` math; and every text set meanwhile (titles, labels, legends, tick
    labels, annotations) has its control and bidirectional formatting characters but the line break shown as their
    code (:func:`kvcache.analysing.tables.chart_text`: ``\\x1b``, ``\\r``, ``\\u202e``)."""

    @functools.wraps(func)
    def plain(*args: Any, **kwargs: Any) -> Any:
        plt = _pyplot()
        from matplotlib.text import Text

        setter = Text.set_text

        def shown(self: Any, s: Any) -> None:
            setter(self, None if s is None else chart_text(s))

        Text.set_text = shown  # type: ignore[method-assign]
        try:
            with plt.rc_context({"text.parse_math": False} if "text.parse_math" in plt.rcParams else {}):
                return func(*args, **kwargs)
        finally:
            Text.set_text = setter  # type: ignore[method-assign]

    return plain  # type: ignore[return-value]


@_plain_text
def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def plot_latency(runs: list[Run], path: Path) -> Path:
    """Write latency.png (:func:`latency_figure`)."""
    return _save(latency_figure(runs), path)


def plot_traffic(runs: list[Run], path: Path) -> Path:
    """Write traffic.png (:func:`traffic_figure`)."""
    return _save(traffic_figure(runs), path)


def plot_memory(runs: list[Run], path: Path) -> Path | None:
    """Write memory.png (:func:`memory_figure`) when some run has counted memory; None otherwise."""
    figure = memory_figure(runs)
    return None if figure is None else _save(figure, path)


def memory_rows(run: Run) -> dict[str, tuple[list[int], list[float], list[float]]]:
    """{cache: (contexts, MB held after the step, MB live at its peak)} of a run's counted memory (``kv.memory``; MB =
    1e6 bytes): the bytes of the storages the counted step made or touched, after it and at its high-water mark."""
    out = {}
    for cache, entry in run.record.memory.items():
        steps = entry.steps if entry.steps is not None else {}
        contexts, held, peak = [], [], []
        for context in sorted(steps, key=lambda c: int(c) if str(c).isdigit() else 0):
            step = steps[context]
            values = [finite(step.held), finite(step.before), finite(step.peak)]
            if not str(context).isdigit() or None in values:
                continue
            contexts.append(int(context))
            held.append(values[0] / 1e6)
            peak.append((values[1] + values[2]) / 1e6)
        if contexts:
            out[cache] = (contexts, held, peak)
    return out


@_plain_text
def memory_figure(runs: list[Run]) -> Any:
    """One panel per run with counted memory: per class, MB held after the counted step (solid) and live at its
    peak (dashed) against context (tokens); None when no run has counted memory."""
    with_memory = [(run, name) for run, name in zip(runs, run_names(runs)) if memory_rows(run)]
    if not with_memory:
        return None
    plt = _pyplot()
    colours = cache_colours(runs)
    ncols = min(len(with_memory), 3)
    nrows = math.ceil(len(with_memory) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.8 * nrows), squeeze=False, layout="constrained")
    for ax in axes.flat[len(with_memory):]:
        ax.set_axis_off()
    for ax, (run, name) in zip(axes.flat, with_memory):
        for cache, (contexts, held, peak) in memory_rows(run).items():
            colour = colours.get(cache, PALETTE[0])
            ax.plot(contexts, held, "o-", color=colour, label=f"{cache}: held")
            ax.plot(contexts, peak, "s--", color=colour, alpha=0.7, label=f"{cache}: peak")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("MB live (storages the counted step made or touched)")
        ax.set_title(f"{run_title(run, name)}: memory per decode step", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
    return fig


def plot_ledger(runs: list[Run], path: Path) -> Path | None:
    """Write ledger.png (:func:`ledger_figure`) when some run has a ledger; None otherwise."""
    figure = ledger_figure(runs)
    return None if figure is None else _save(figure, path)


@_plain_text
def ledger_figure(runs: list[Run]) -> Any:
    """One panel per run with a ledger: horizontal bars per (class, op), counted passes and timed passes (with
    their interval) side by side; None when no run has a ledger."""
    with_ledger = [(run, name, run.record) for run, name in zip(runs, run_names(runs)) if run.record.ledger]
    if not with_ledger:
        return None
    plt = _pyplot()
    heights = [sum(len(rows) for rows in kv.ledger.values()) for _, _, kv in with_ledger]
    fig, axes = plt.subplots(len(with_ledger), 1, figsize=(9, 1.5 + 0.32 * sum(heights)),
                             gridspec_kw={"height_ratios": [max(h, 1) for h in heights]}, squeeze=False)
    for ax, (run, name, kv) in zip(axes[:, 0], with_ledger):
        labels, counted, timed, low, high = [], [], [], [], []
        for cache, rows in kv.ledger.items():
            traffic = kv.traffic.get(cache)
            by_op = traffic.by_op if traffic is not None else {}
            for op, row in rows.items():
                value = finite(row.timed)
                ci = row.timed_ci if row.timed_ci and len(row.timed_ci) == 2 else [None, None]
                labels.append(f"{cache}: {op}")
                counted.append(finite(by_op.get(op)) or 0.0)
                timed.append(value or 0.0)
                low.append(max((value or 0.0) - (finite(ci[0]) if finite(ci[0]) is not None else value or 0.0), 0.0))
                high.append(max((finite(ci[1]) if finite(ci[1]) is not None else value or 0.0) - (value or 0.0), 0.0))
        y = np.arange(len(labels))[::-1]
        ax.barh(y + 0.2, counted, height=0.4, color=PALETTE[0], label="counted passes")
        ax.barh(y - 0.2, timed, height=0.4, color=PALETTE[1], xerr=[low, high], ecolor="#444", capsize=2,
                label="timed passes (interval)")
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
        ax.axvline(0, color="#888", linewidth=0.8)
        ax.set_xlabel("passes over the KV cache per decode step")
        ax.set_title(f"{run_title(run, name)}: per-op ledger", fontsize=10)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------- latency


@_plain_text
def latency_figure(runs: list[Run]) -> Any:
    """Median step time (ms) against context (tokens), one panel per run, three panels a row."""
    plt = _pyplot()
    colours = cache_colours(runs)
    n = max(len(runs), 1)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 6.0 * nrows), squeeze=False, layout="constrained")
    for ax in axes.flat[len(runs):]:
        ax.set_axis_off()
    if not runs:
        axes[0][0].text(0.5, 0.5, "no runs", ha="center", va="center", transform=axes[0][0].transAxes)
    for ax, run, name in zip(axes.flat, runs, run_names(runs)):
        _latency_panel(ax, run, name, colours)
    return fig


def _latency_panel(ax: Any, run: Run, name: str, colours: dict[str, str]) -> None:
    groups = points_by_cache(run)
    notes = []
    for cache in run_caches(run):
        pts = groups.get(cache, [])
        if not pts:
            notes.append(f"{cache}: no timed points")
            continue
        stats = [point_stats(p) for p in pts]
        med = np.array([s["median_ms"] for s in stats])
        err = np.array([med - [s["q25_ms"] for s in stats], [s["q75_ms"] for s in stats] - med])
        ax.errorbar([p.context for p in pts], med, yerr=np.clip(err, 0, None), fmt="o", ms=4, capsize=3,
                    color=colours[cache], label=f"{cache} (median, IQR)")
        line = fit_line(run, cache, pts)
        if line is None:
            problem = fit_problem(run, cache, pts)
            notes.append(f"{cache}: no fitted line ({problem})" if problem else f"{cache}: no fit")
            continue
        per_ctx = per_context(pts)
        xs = [c["context"] for c in per_ctx]
        ys = [line["intercept_ms"] + line["ms_per_byte"] * c["kv_bytes"] for c in per_ctx]
        eff = 1.0 / (line["ms_per_byte"] * 1e6)  # positive: fit_line draws no line that falls
        src = "" if line["source"] == "kv.fit" else f", {line['source']}"
        ax.plot(xs, ys, "-", color=colours[cache], lw=1.3, alpha=0.85,
                label=f"{cache} fit: {line['intercept_ms']:.1f} ms + KV/{eff:.2f} GB/s{src}")
    for cache, ctx, why in missing_points(run):
        notes.append(f"{cache} @ {ctx:,}: {why}")
    if not run.points:
        ax.text(0.5, 0.5, "no timed points in this run", ha="center", va="center", transform=ax.transAxes)
    trained = trained_context(run.record)
    max_ctx = max((p.context for p in run.points), default=0)
    if trained and (not max_ctx or trained <= TRAINED_REACH * max_ctx):
        ax.axvline(trained, color="0.35", ls="--", lw=1, label=f"trained context ({trained:,})")
    elif trained:
        notes.append(f"trained context {trained:,} tokens is beyond the chart")
    if notes:
        text = "\n".join(notes[:5]) + (f"\n… and {len(notes) - 5} more" if len(notes) > 5 else "")
        ax.text(0.99, 0.02, text, ha="right", va="bottom", fontsize=7, color="0.3", transform=ax.transAxes)
    ax.set_title(run_title(run, name), fontsize=10)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("median step time (ms)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    entries = len(ax.get_legend_handles_labels()[0])
    if entries:  # below the axes, under the x label: it never covers a point or a line
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1 if entries <= 4 else 2,
                  frameon=False)


# ----------------------------------------------------------------------------------------------- traffic


def traffic_rows(runs: list[Run]) -> list[list[int]]:
    """Indices of the runs drawn in each row of traffic.png: a new row past BARS_PER_ROW bars or RUNS_PER_ROW runs
    (a run with more classes than BARS_PER_ROW gets a row of its own)."""
    rows: list[list[int]] = []
    bars = 0
    for i, run in enumerate(runs):
        width = max(len(run_caches(run)), 1)
        if not rows or len(rows[-1]) >= RUNS_PER_ROW or bars + width > BARS_PER_ROW:
            rows.append([])
            bars = 0
        rows[-1].append(i)
        bars += width
    return rows


@_plain_text
def traffic_figure(runs: list[Run]) -> Any:
    """Counted passes per cache class, stacked by op; one group of bars per run, runs wrapped into rows."""
    plt = _pyplot()
    entries = [[(cache, run.record.traffic.get(cache)) for cache in run_caches(run)] for run in runs]
    totals: dict[str, float] = {}
    for run_entries in entries:
        for _, t in run_entries:
            for op, v in (t.by_op.items() if t is not None else ()):
                totals[op] = totals.get(op, 0.0) + abs(finite(v) or 0.0)
    top = sorted(totals, key=lambda op: -totals[op])[:TOP_OPS]
    ops = top + (["other ops"] if len(totals) > len(top) else [])
    op_colour = {op: PALETTE[i % len(PALETTE)] for i, op in enumerate(ops)}
    op_colour[NO_BREAKDOWN] = "#999999"

    if not any(t for run_entries in entries for _, t in run_entries):
        fig, ax = plt.subplots(figsize=(6.4, 5.2), layout="constrained")
        what = "this run" if len(runs) == 1 else "these runs"
        ax.text(0.5, 0.5, f"no counted traffic in {what}", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig

    rows = traffic_rows(runs)
    widths = [sum(max(len(entries[i]), 1) for i in row) * 1.1 + 2.5 * len(row) for row in rows]
    fig, axes = plt.subplots(len(rows), 1, figsize=(max(6.4, max(widths)), 4.6 * len(rows) + 0.8), squeeze=False,
                             sharey=True, layout="constrained")
    names = run_names(runs)
    slots = max(sum(max(len(entries[i]), 1) for i in row) + 0.8 * (len(row) - 1) for row in rows)
    top_height = 0.0
    for ax, row in zip(axes[:, 0], rows):
        top_height = max(top_height, _traffic_panel(ax, [(runs[i], names[i], entries[i]) for i in row],
                                                    single=len(runs) == 1, top=top, ops=ops, op_colour=op_colour))
        ax.set_xlim(-0.7, slots - 0.3)  # same bar width in every row; short rows are left-aligned
    axes[0, 0].set_ylim(top=top_height * 1.15 if top_height > 0 else 1)
    labels: dict[str, Any] = {}
    for ax in axes[:, 0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            labels.setdefault(label, handle)
    fig.legend(list(labels.values()), list(labels), loc="outside lower center", ncol=min(len(labels), 4),
               fontsize=7, frameon=False)
    return fig


def _traffic_panel(ax: Any, groups: list[tuple[Run, str, list[tuple[str, Traffic | None]]]], *, single: bool,
                   top: list[str], ops: list[str], op_colour: dict[str, str]) -> float:
    """One row of traffic.png: a group of bars per run; returns the tallest bar (passes)."""
    x, xpos, ticks, used, top_height = 0.0, [], [], set(), 0.0
    for run, name, run_entries in groups:
        start = x
        for cache, t in run_entries:
            xpos.append(x)
            ticks.append(cache)
            top_height = max(top_height, _stacked_bar(ax, x, t, top, ops, op_colour, used))
            x += 1
        if not single:
            has = any(t for _, t in run_entries)
            label = run_title(run, name) + ("" if has else "\n(no counted traffic in this run)")
            ax.annotate(label, ((start + x - 1) / 2, 0), xycoords=("data", "axes fraction"), xytext=(0, -28),
                        textcoords="offset points", ha="center", va="top", fontsize=8)
        x += 0.8
    if single:
        ax.set_title(run_title(*groups[0][:2]), fontsize=10)
    ax.set_xticks(xpos)
    ax.set_xticklabels(ticks)
    ax.set_ylabel("counted passes (bytes moved / KV bytes)")
    bpts = {finite(t.bytes_per_token) for _, _, run_entries in groups for _, t in run_entries if t is not None}
    bpts -= {None}
    if len(bpts) == 1:
        bpt = bpts.pop()
        sec = ax.secondary_yaxis("right", functions=(lambda p: p * bpt, lambda b: b / bpt))
        sec.set_ylabel("bytes per token per step")
    ax.grid(axis="y", alpha=0.3)
    return top_height


def _stacked_bar(ax: Any, x: float, t: Traffic | None, top: list[str], ops: list[str], op_colour: dict[str, str],
                 used: set[str]) -> float:
    """One class's counted passes at ``x``, stacked by op (ops past ``top`` merged); returns the bar's height."""
    if t is None:
        ax.text(x, 0.02, "no counted\ntraffic", ha="center", va="bottom", fontsize=7, color="0.4",
                transform=ax.get_xaxis_transform())
        return 0.0
    segments: dict[str, float] = {}
    for op, v in t.by_op.items():
        key = op if op in top else "other ops"
        segments[key] = segments.get(key, 0.0) + (finite(v) or 0.0)
    if not segments:
        segments = {NO_BREAKDOWN: finite(t.passes) or 0.0}
    pos = neg = 0.0
    for op in [o for o in ops if o in segments] + [o for o in segments if o not in ops]:
        v = segments[op]
        ax.bar(x, v, 0.7, bottom=pos if v >= 0 else neg, color=op_colour.get(op, "#999999"),
               label=op if op not in used else None, edgecolor="white", linewidth=0.5)
        used.add(op)
        if v >= 0:
            pos += v
        else:
            neg += v
    total = finite(t.passes)
    ax.text(x, max(pos, 0), f"{pos + neg if total is None else total:.2f}", ha="center", va="bottom", fontsize=8)
    return pos
