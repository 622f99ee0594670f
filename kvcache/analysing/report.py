"""``kvcache report``: charts and a Markdown/HTML report of one or more benchmark runs.

Writes into ``--out DIR``: ``latency.png`` (median step time in ms against context in tokens, with
IQR error bars, the fitted line and the model's trained context), ``traffic.png`` (counted passes per
cache class, stacked by operation), ``report.md`` (headline and tables, ready for a GitHub job
summary) and ``report.html`` (one self-contained file: interactive chart and the same tables).

Units: times in ms, bandwidths in GB/s (1e9 bytes/s, read + write), sizes in MB (1e6 bytes),
context in tokens, passes = bytes moved per byte of KV cache. Needs numpy; the PNGs need matplotlib
(imported lazily). Never imports torch. Missing parts of a run are named in the output, never fatal.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from kvcache.analysing import fit as fitting
from kvcache.analysing.records import Point, RecordError, Run, jsonable, load_run
from kvcache.analysing.stats import median

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
DASHES = ["", "6 4", "2 3", "8 3 2 3"]
MARKERS = ["o", "s", "^", "D"]
TOP_OPS = 7  # traffic.png shows this many largest ops; the rest are stacked as "other ops"
TRAINED_REACH = 1.5  # draw the trained context if it lies within this factor of the largest measured context


class ReportError(RuntimeError):
    """A report that cannot be written (no matplotlib, unwritable directory); the message is one line."""


# ----------------------------------------------------------------------------------------------- helpers


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _num(value: Any) -> float | None:
    """A finite float, or None (missing, NaN, inf, not a number)."""
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _fmt(value: Any, digits: int = 2) -> str:
    x = _num(value)
    return "—" if x is None else f"{x:.{digits}f}"


def _fmt_int(value: Any) -> str:
    x = _num(value)
    return "—" if x is None else f"{x:,.0f}"


def _shape(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return "×".join(str(v) for v in value) if value else "scalar"
    return str(value)


def run_names(runs: list[Run]) -> list[str]:
    """Display name of each run: its label, plus the file name where labels repeat."""
    labels = [r.label for r in runs]
    return [f"{lab} ({Path(r.path).name})" if labels.count(lab) > 1 else lab for lab, r in zip(labels, runs)]


def all_caches(runs: list[Run]) -> list[str]:
    """Cache classes of all runs, in first-seen order (fixes each class's colour)."""
    seen: dict[str, None] = {}
    for run in runs:
        for cache in _run_caches(run):
            seen.setdefault(cache)
    return list(seen)


def _run_caches(run: Run) -> list[str]:
    caches = run.caches()
    for cache in _dict(run.kv.get("settings")).get("caches") or []:
        if str(cache) not in caches:
            caches.append(str(cache))
    return caches


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


def trained_context(run: Run) -> int | None:
    """The model's trained context in tokens (kv.model.max_position_embeddings), if known."""
    x = _num(_dict(run.kv.get("model")).get("max_position_embeddings"))
    return int(x) if x else None


def skip_reasons(run: Run) -> dict[tuple[str, int | None], str]:
    """kv.skipped as {(cache, context or None for the whole class): reason}."""
    out: dict[tuple[str, int | None], str] = {}
    for item in run.kv.get("skipped") or []:
        item = _dict(item)
        ctx = _num(item.get("context"))
        out[(str(item.get("cache", "?")), None if ctx is None else int(ctx))] = str(item.get("reason") or "no reason")
    return out


def missing_points(run: Run) -> list[tuple[str, int, str]]:
    """(cache, context, why) for each context measured by some class of the run but not by this one."""
    groups = points_by_cache(run)
    contexts = sorted({p.context for p in run.points})
    reasons = skip_reasons(run)
    out = []
    for cache in _run_caches(run):
        have = {p.context for p in groups.get(cache, [])}
        for ctx in contexts:
            if ctx not in have:
                why = reasons.get((cache, ctx)) or reasons.get((cache, None))
                out.append((cache, ctx, f"skipped: {why}" if why else "not measured (no skip reason recorded)"))
    return out


def fit_problem(run: Run, cache: str, points: list[Point]) -> str | None:
    """Why a class has no passes figure and no fitted line, or None: the reason kv.fit records (runs written
    before fits were checked are held to the same rules, :func:`kvcache.analysing.fit.record_problem`); with no kv.fit
    for the class, why its points give no line (fewer than MIN_CONTEXTS contexts, a slope not positive)."""
    fit = _dict(_dict(run.kv.get("fit")).get(cache))
    if fit:
        return fitting.record_problem(fit)
    contexts = {p.context for p in points}
    if len(contexts) < fitting.MIN_CONTEXTS:
        return fitting.too_few_contexts(len(contexts))
    try:
        fitting.check_finite(points)
        medians = [point_stats(p)["median_ms"] / fitting.MS_PER_S for p in points]
        fitting.check_slope(fitting.least_squares([p.kv_bytes for p in points], medians).slope)
    except fitting.FitError as exc:
        return str(exc)
    return None


def fit_line(run: Run, cache: str, points: list[Point]) -> dict[str, Any] | None:
    """Intercept (ms) and slope (ms per KV byte) of a class's line: from kv.fit, else refit from its points.

    Slope = 1 / (effective_gbps * 1e6) ms per byte. Returns None when neither is possible or the fit gives no
    passes figure (:func:`fit_problem`): no line is drawn from a fit that cannot be judged.
    """
    if fit_problem(run, cache, points) is not None:
        return None
    fit = _dict(_dict(run.kv.get("fit")).get(cache))
    intercept, eff = _num(fit.get("intercept_ms")), _num(fit.get("effective_gbps"))
    if intercept is not None and eff is not None and eff > 0:
        return {"intercept_ms": intercept, "ms_per_byte": 1.0 / (eff * 1e6), "source": "kv.fit"}
    if fit or len({p.context for p in points}) < fitting.MIN_CONTEXTS:
        return None
    line = fitting.least_squares([p.kv_bytes for p in points], [point_stats(p)["median_ms"] for p in points])
    return {"intercept_ms": line.intercept, "ms_per_byte": line.slope, "source": "refit from points"}


def no_figure(reason: str) -> str:
    """A table cell in place of the timed passes: why there is no figure."""
    return f"— ({reason})" if fitting.NO_FIGURE in reason else f"— ({fitting.NO_FIGURE}: {reason})"


def _per_context(points: list[Point]) -> list[dict[str, Any]]:
    """Per context: median over rounds of the point medians (ms), mean KV and counted bytes (MB)."""
    by_ctx: dict[int, list[Point]] = {}
    for p in points:
        by_ctx.setdefault(p.context, []).append(p)
    out = []
    for ctx in sorted(by_ctx):
        ps = by_ctx[ctx]
        counted = [float(p.counted_bytes) for p in ps if _num(p.counted_bytes) is not None]
        out.append({
            "context": ctx,
            "median_ms": median(point_stats(p)["median_ms"] for p in ps),
            "kv_bytes": sum(p.kv_bytes for p in ps) / len(ps),
            "kv_mb": sum(p.kv_bytes for p in ps) / len(ps) / 1e6,
            "counted_mb": sum(counted) / len(counted) / 1e6 if counted else None,
            "rounds": len(ps),
        })
    return out


# ----------------------------------------------------------------------------------------------- document


class Doc:
    """Headings, paragraphs, bullet facts and tables, rendered both as Markdown and as HTML."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any]] = []

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def note(self, text: str) -> None:
        self.blocks.append(("note", text))

    def facts(self, items: list[tuple[str, str]]) -> None:
        self.blocks.append(("facts", items))

    def table(self, headers: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", (headers, rows)))

    def markdown(self) -> str:
        out: list[str] = []
        for kind, body in self.blocks:
            if kind == "h":
                out += ["#" * body[0] + " " + body[1], ""]
            elif kind == "p":
                out += [body, ""]
            elif kind == "note":
                out += [f"_{body}_", ""]
            elif kind == "facts":
                out += [f"- **{k}**: {v}" for k, v in body] + [""]
            elif kind == "table":
                headers, rows = body

                def cell(s: str) -> str:
                    return str(s).replace("|", "\\|").replace("\n", " ")

                out.append("| " + " | ".join(cell(h) for h in headers) + " |")
                out.append("|" + "|".join("---" for _ in headers) + "|")
                out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
                out.append("")
        return "\n".join(out).rstrip() + "\n"

    def html(self) -> str:
        e = html.escape
        out: list[str] = []
        for kind, body in self.blocks:
            if kind == "h":
                level = min(body[0] + 1, 6)  # the page's own <h1> sits above
                out.append(f"<h{level}>{e(body[1])}</h{level}>")
            elif kind == "p":
                out.append(f"<p>{e(body)}</p>")
            elif kind == "note":
                out.append(f'<p class="note">{e(body)}</p>')
            elif kind == "facts":
                out.append('<ul class="facts">' + "".join(f"<li><strong>{e(k)}</strong>: {e(v)}</li>" for k, v in body)
                           + "</ul>")
            elif kind == "table":
                headers, rows = body
                head = "".join(f"<th>{e(h)}</th>" for h in headers)
                rows_html = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in rows)
                out.append(f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead>'
                           f"<tbody>{rows_html}</tbody></table></div>")
        return "\n".join(out)


def _headline(run: Run, name: str) -> list[tuple[str, str]]:
    kv = run.kv
    env, model, settings, copy = (_dict(kv.get(k)) for k in ("environment", "model", "settings", "copy"))
    cpu = run.machine_info.get("cpu")
    cpu_brand = _dict(cpu).get("brand_raw") or _dict(cpu).get("brand") or (cpu if isinstance(cpu, str) else None)
    machine = f"{env.get('device_name') or '?'} (device type {env.get('device_type') or '?'}"
    machine += f", {env['platform']})" if env.get("platform") else ")"
    if cpu_brand:
        machine += f"; CPU {cpu_brand}"
    if run.machine_info.get("node"):
        machine += f"; node {run.machine_info['node']}"
    libs = ", ".join(f"{lib} {env.get(lib) or '?'}" for lib in ("transformers", "torch", "python"))
    if model:
        geometry = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in model.items()
                             if k in ("layers", "heads", "kv_heads", "head_dim") and v is not None)
        model_text = f"{model.get('name') or settings.get('model') or '?'} ({geometry}; "
        model_text += f"KV {_fmt_int(model.get('bytes_per_token'))} bytes/token; "
        weights = _num(model.get("weight_bytes"))
        model_text += f"weights {_fmt(None if weights is None else weights / 1e6, 1)} MB; "
        trained = trained_context(run)
        model_text += f"trained context {trained:,} tokens)" if trained else "trained context unknown)"
    else:
        model_text = f"{settings.get('model') or '?'} (no model description in this run)"
    if copy or kv.get("copy_gbps") is not None:
        copy_text = (f"start {_fmt(copy.get('start_gbps'))} GB/s, end {_fmt(copy.get('end_gbps'))} GB/s, "
                     f"session median {_fmt(kv.get('copy_gbps'))} GB/s")
    else:
        copy_text = "no copy bandwidth in this run"
    contexts = sorted({p.context for p in run.points})
    rounds = sorted({p.round for p in run.points})
    points_text = (f"{len(run.points)} timed points; contexts {', '.join(f'{c:,}' for c in contexts)} tokens; "
                   f"{len(rounds)} round(s); {settings.get('steps', '?')} steps per point"
                   if run.points else "no timed points in this run")
    return [
        ("Run", Path(run.path).name + (f", {run.datetime}" if run.datetime else "")),
        ("Machine", machine),
        ("Libraries", libs),
        ("Model", model_text),
        ("dtype", str(settings.get("dtype") or model.get("dtype") or "?")),
        ("Copy bandwidth", copy_text),
        ("Points", points_text),
    ]


def _fit_section(doc: Doc, run: Run, caches: list[str], groups: dict[str, list[Point]]) -> None:
    kv = run.kv
    fits, traffic, verdicts = _dict(kv.get("fit")), _dict(kv.get("traffic")), _dict(kv.get("verdict"))
    copy_gbps = _num(kv.get("copy_gbps"))
    conf = _num(_dict(kv.get("settings")).get("confidence"))
    if conf is None:
        confs = {_num(_dict(f).get("confidence")) for f in fits.values()} - {None}
        conf = confs.pop() if len(confs) == 1 else None
    ci_label = f"{conf * 100:.0f}% CI" if conf is not None and conf <= 1 else "CI"
    rows = []
    for cache in caches:
        fit, counted, verdict = _dict(fits.get(cache)), _dict(traffic.get(cache)), _dict(verdicts.get(cache))
        timed = _num(fit.get("passes"))
        if timed is None and copy_gbps and _num(fit.get("effective_gbps")):
            timed = copy_gbps / _num(fit.get("effective_gbps"))  # type: ignore[operator]
        ci = fit.get("passes_ci")
        ci_text = f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if isinstance(ci, (list, tuple)) and len(ci) == 2 else ""
        counted_passes = _num(counted.get("passes"))
        ratio = timed / counted_passes if counted_passes and timed is not None else None
        if verdict:
            verdict_text = "; ".join(f"{m} {v.get('status', '?')}: {v.get('reason', '')}".rstrip(": ")
                                     for m, v in verdict.items() if isinstance(v, dict))
        else:
            verdict_text = "no verdict"
        if not fit:
            line = fit_line(run, cache, groups.get(cache, []))
            note = "no fit (chart line refit from points)" if line else "no fit"
            rows.append([cache, note, "—", "—", "—", _fmt(counted_passes), "—", "—", verdict_text])
            continue
        problem = fit_problem(run, cache, groups.get(cache, []))
        if problem is not None:
            rows.append([cache, "—", "—", no_figure(problem), "—", _fmt(counted_passes), "—", "—", verdict_text])
            continue
        rows.append([cache, _fmt(fit.get("intercept_ms")), _fmt(fit.get("effective_gbps")),
                     _fmt(timed) + ci_text, _fmt(fit.get("r2"), 3), _fmt(counted_passes), _fmt(ratio),
                     _fmt_int(fit.get("crossover_tokens")), verdict_text])
    doc.heading(3, "Fit")
    if not caches:
        doc.note("no cache classes in this run")
        return
    doc.table(["cache", "intercept ms", "effective GB/s", f"timed passes [{ci_label}]", "R²", "counted passes",
               "timed/counted", "crossover tokens", "verdict"], rows)
    if not fits:
        doc.note("no fit in this run")
    elif missing := [c for c in caches if c not in fits]:
        doc.note(f"no fit for {', '.join(missing)} in this run")
    if not traffic:
        doc.note("no counted traffic in this run")
    elif missing := [c for c in caches if c not in traffic]:
        doc.note(f"no counted traffic for {', '.join(missing)} in this run")
    if not verdicts:
        doc.note("no verdict in this run")


def _drift_text(run: Run) -> str:
    drift = run.kv.get("drift")
    if not isinstance(drift, dict) or not drift:
        return "no drift check in this run"
    if "reason" in drift and "fraction" not in drift:
        return f"not checked ({drift['reason']})"
    fraction, max_fraction = _num(drift.get("fraction")), _num(drift.get("max_fraction"))
    change = "—" if fraction is None else f"{fraction * 100:+.1f}%"
    limit = "" if max_fraction is None else f" (limit ±{max_fraction * 100:.1f}%)"
    ok = drift.get("ok")
    status = "ok" if ok is True else "DRIFTED" if ok is False else "unknown"
    return (f"{drift.get('cache', '?')} at {_fmt_int(drift.get('context'))} tokens: "
            f"first {_fmt(drift.get('first_ms'))} ms, last {_fmt(drift.get('last_ms'))} ms, "
            f"change {change}{limit} — {status}")


def _traffic_section(doc: Doc, run: Run, caches: list[str]) -> None:
    traffic = _dict(run.kv.get("traffic"))
    doc.heading(3, "Counted traffic")
    if not traffic:
        doc.note("no counted traffic in this run")
        return
    rows = []
    for cache in caches:
        t = _dict(traffic.get(cache))
        if not t:
            rows.append([cache, "no counted traffic", "—", "—"])
            continue
        passes, bpt = _num(t.get("passes")), _num(t.get("bytes_per_token"))
        per_token = passes * bpt if passes is not None and bpt is not None else None
        ops = sorted(_dict(t.get("by_op")).items(), key=lambda kv: -(_num(kv[1]) or 0.0))
        ops_text = "; ".join(f"{op} {_fmt(v)}" for op, v in ops) or "no per-op breakdown"
        rows.append([cache, _fmt(passes), _fmt_int(per_token), ops_text])
    doc.table(["cache", "counted passes", "bytes per token per step", "passes by op"], rows)


def _probe_section(doc: Doc, run: Run, caches: list[str]) -> None:
    probe = _dict(run.kv.get("probe"))
    doc.heading(3, "Attention probe")
    if not probe:
        doc.note("no attention probe in this run")
        return
    rows = []
    for cache in caches:
        p = _dict(probe.get(cache))
        if not p:
            rows.append([cache, "no probe", "—", "—", "—", "—", "—", "—", "—"])
            continue
        rows.append([cache, _shape(p.get("query")), _shape(p.get("key")), _shape(p.get("value")), _shape(p.get("mask")),
                     str(p.get("attention", "?")), str(p.get("expansions", "?")), str(p.get("enable_gqa", "?")),
                     str(p.get("calls", "?"))])
    doc.table(["cache", "query", "key", "value", "mask", "attention", "expansions", "enable_gqa", "calls"], rows)


def _skipped_section(doc: Doc, run: Run) -> None:
    doc.heading(3, "Skipped points")
    rows = []
    recorded = skip_reasons(run)
    for (cache, ctx), reason in recorded.items():
        rows.append([cache, "whole class" if ctx is None else f"{ctx:,}", reason])
    for cache, ctx, why in missing_points(run):
        if (cache, ctx) not in recorded and (cache, None) not in recorded:
            rows.append([cache, f"{ctx:,}", why])
    if not run.points:
        doc.note("no timed points in this run")
    if rows:
        doc.table(["cache", "context (tokens)", "reason"], rows)
    elif run.points:
        doc.para("none")


def build_doc(runs: list[Run]) -> Doc:
    """The report's headline and tables for each run."""
    doc = Doc()
    doc.heading(1, "KV-cache passes report")
    doc.para(f"{len(runs)} run(s). Passes = copy bandwidth / effective bandwidth of the latency-vs-KV-bytes line "
             "(timed) or bytes each op of one decode step reads + writes per byte of KV cache (counted). "
             "Times in ms, GB/s = 1e9 bytes/s, MB = 1e6 bytes, contexts in tokens.")
    if not runs:
        doc.note("no runs")
    for run, name in zip(runs, run_names(runs)):
        caches = _run_caches(run)
        groups = points_by_cache(run)
        doc.heading(2, name)
        doc.facts(_headline(run, name))
        _fit_section(doc, run, caches, groups)
        doc.para(f"Drift: {_drift_text(run)}")
        _traffic_section(doc, run, caches)
        _probe_section(doc, run, caches)
        _skipped_section(doc, run)
    return doc


# ----------------------------------------------------------------------------------------------- PNGs


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ReportError("matplotlib is not installed (pip install 'kvcache-passes[report]'); "
                          "cannot write latency.png and traffic.png") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency(runs: list[Run], path: Path) -> Path:
    """latency.png: median step time (ms) against context (tokens), one panel per run."""
    plt = _pyplot()
    colours = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(all_caches(runs))}
    n = max(len(runs), 1)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.8 * nrows), squeeze=False)
    for ax in axes.flat[len(runs):]:
        ax.set_axis_off()
    if not runs:
        axes[0][0].text(0.5, 0.5, "no runs", ha="center", va="center", transform=axes[0][0].transAxes)
    for ax, run, name in zip(axes.flat, runs, run_names(runs)):
        groups = points_by_cache(run)
        notes = []
        for cache in _run_caches(run):
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
            per_ctx = _per_context(pts)
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
        trained = trained_context(run)
        max_ctx = max((p.context for p in run.points), default=0)
        if trained and (not max_ctx or trained <= TRAINED_REACH * max_ctx):
            ax.axvline(trained, color="0.35", ls="--", lw=1, label=f"trained context ({trained:,})")
        elif trained:
            notes.append(f"trained context {trained:,} tokens is beyond the chart")
        if notes:
            text = "\n".join(notes[:5]) + (f"\n… and {len(notes) - 5} more" if len(notes) > 5 else "")
            ax.text(0.99, 0.02, text, ha="right", va="bottom", fontsize=7, color="0.3", transform=ax.transAxes)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("median step time (ms)")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_traffic(runs: list[Run], path: Path) -> Path:
    """traffic.png: counted passes per cache class, stacked by op; one group of bars per run."""
    plt = _pyplot()
    bars: list[tuple[int, str, dict[str, Any] | None]] = []  # (run index, cache, traffic entry)
    for i, run in enumerate(runs):
        traffic = _dict(run.kv.get("traffic"))
        for cache in _run_caches(run):
            bars.append((i, cache, _dict(traffic.get(cache)) or None))
    totals: dict[str, float] = {}
    for _, _, t in bars:
        for op, v in _dict(t and t.get("by_op")).items():
            totals[op] = totals.get(op, 0.0) + abs(_num(v) or 0.0)
    top = sorted(totals, key=lambda op: -totals[op])[:TOP_OPS]
    ops = top + (["other ops"] if len(totals) > len(top) else [])
    op_colour = {op: PALETTE[i % len(PALETTE)] for i, op in enumerate(ops)}
    op_colour["total (no per-op breakdown)"] = "#999999"

    fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * len(bars) + 2.5 * len(runs)), 5.2))
    if not any(t for _, _, t in bars):
        what = "this run" if len(runs) == 1 else "these runs"
        ax.text(0.5, 0.5, f"no counted traffic in {what}", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        xpos, labels, x = [], [], 0.0
        group_centres: list[tuple[float, int]] = []
        last_run = None
        start = 0.0
        for i, cache, _ in bars:
            if last_run is not None and i != last_run:
                group_centres.append(((start + x - 1) / 2, last_run))
                x += 0.8
                start = x
            if last_run is None:
                start = x
            last_run = i
            xpos.append(x)
            labels.append(cache)
            x += 1
        if last_run is not None:
            group_centres.append(((start + x - 1) / 2, last_run))
        used: set[str] = set()
        top_height = 0.0
        for xp, (_, _, t) in zip(xpos, bars):
            if not t:
                ax.text(xp, 0.02, "no counted\ntraffic", ha="center", va="bottom", fontsize=7, color="0.4",
                        transform=ax.get_xaxis_transform())
                continue
            by_op = {op: _num(v) or 0.0 for op, v in _dict(t.get("by_op")).items()}
            segments: dict[str, float] = {}
            for op, v in by_op.items():
                key = op if op in top else "other ops"
                segments[key] = segments.get(key, 0.0) + v
            if not segments:
                segments = {"total (no per-op breakdown)": _num(t.get("passes")) or 0.0}
            pos = neg = 0.0
            for op in [o for o in ops if o in segments] + [o for o in segments if o not in ops]:
                v = segments[op]
                bottom = pos if v >= 0 else neg
                ax.bar(xp, v, 0.7, bottom=bottom, color=op_colour.get(op, "#999999"),
                       label=op if op not in used else None, edgecolor="white", linewidth=0.5)
                used.add(op)
                if v >= 0:
                    pos += v
                else:
                    neg += v
            total = _num(t.get("passes"))
            total = pos + neg if total is None else total
            ax.text(xp, max(pos, 0), f"{total:.2f}", ha="center", va="bottom", fontsize=8)
            top_height = max(top_height, pos)
        ax.set_xlim(xpos[0] - 0.7, xpos[-1] + 0.7)
        ax.set_xticks(xpos)
        ax.set_xticklabels(labels)
        names = run_names(runs)
        if len(runs) > 1:
            for centre, i in group_centres:
                has = any(t for j, _, t in bars if j == i)
                label = names[i] + ("" if has else "\n(no counted traffic in this run)")
                ax.annotate(label, (centre, 0), xycoords=("data", "axes fraction"), xytext=(0, -28),
                            textcoords="offset points", ha="center", va="top", fontsize=8)
        else:
            ax.set_title(names[0], fontsize=10)
        ax.set_ylabel("counted passes (bytes moved / KV bytes)")
        ax.set_ylim(top=top_height * 1.15 if top_height > 0 else 1)
        bpts = {_num(_dict(t).get("bytes_per_token")) for _, _, t in bars if t} - {None}
        if len(bpts) == 1:
            bpt = bpts.pop()
            sec = ax.secondary_yaxis("right", functions=(lambda p: p * bpt, lambda b: b / bpt))
            sec.set_ylabel("bytes per token per step")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2 if len(runs) > 1 else -0.08),
                  ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------- HTML


def chart_data(runs: list[Run]) -> dict[str, Any]:
    """What the HTML chart draws: one series per (run, cache class), contexts in tokens, times in ms, sizes in MB."""
    colours = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(all_caches(runs))}
    names = run_names(runs)
    series = []
    contexts: set[int] = set()
    trained: dict[int, None] = {}
    for ri, (run, name) in enumerate(zip(runs, names)):
        groups = points_by_cache(run)
        reasons = skip_reasons(run)
        tc = trained_context(run)
        if tc:
            trained.setdefault(tc)
        for cache in _run_caches(run):
            pts = groups.get(cache, [])
            contexts.update(p.context for p in pts)
            points = []
            for p in pts:
                s = point_stats(p)
                counted = _num(p.counted_bytes)
                points.append({"context": p.context, "round": p.round, **s, "kv_mb": p.kv_bytes / 1e6,
                               "counted_mb": None if counted is None else counted / 1e6,
                               "beyond": p.beyond_trained_context})
            skipped = {str(ctx): why for (c, ctx), why in reasons.items() if c == cache and ctx is not None}
            series.append({
                "id": f"s{len(series)}", "cache": cache, "run": name,
                "label": cache if len(runs) == 1 else f"{cache} — {name}",
                "colour": colours[cache], "dash": DASHES[ri % len(DASHES)], "points": points,
                "medians": [{k: v for k, v in c.items() if k != "kv_bytes"} for c in _per_context(pts)],
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


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1180px;
 padding:0 16px;color:#1b1f24}
h1{font-size:22px;margin:0 0 6px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d0d7de}
h3{font-size:15px;margin:18px 0 6px}h4{font-size:14px}
.chart-box{border:1px solid #d0d7de;border-radius:6px;padding:12px 14px;margin:14px 0}
.chart{position:relative}.chart svg{display:block;width:100%;height:auto}
.axis text{font-size:11px;fill:#57606a}.axis line,.axis path{stroke:#8c959f}.grid line{stroke:#eaeef2}
.series path{fill:none;stroke-width:2}.series circle{stroke:#fff;stroke-width:1;cursor:pointer}
.series circle:hover{stroke:#000}.trained{stroke:#57606a;stroke-dasharray:6 4;stroke-width:1.2}
.trained-label{font-size:11px;fill:#57606a}.chart-box h2{margin-top:4px}
.cursor{stroke:#0969da;stroke-width:1;stroke-dasharray:3 3}.empty{font-size:16px;fill:#57606a}
.tooltip{position:absolute;pointer-events:none;background:#1b1f24;color:#fff;font-size:12px;padding:6px 8px;
 border-radius:4px;white-space:nowrap;display:none;z-index:2}
.legend{display:flex;flex-wrap:wrap;gap:6px 14px;margin:6px 0}
.legend button{border:1px solid #d0d7de;background:#fff;border-radius:4px;padding:2px 8px;cursor:pointer;font:inherit}
.legend button.off{opacity:.4}.swatch{vertical-align:middle;margin-right:6px}
.slider-row{display:flex;align-items:center;gap:10px;margin-top:10px}#context-slider{flex:1;max-width:520px}
table{border-collapse:collapse;margin:6px 0;font-size:13px}th,td{border:1px solid #d0d7de;padding:3px 8px;
 text-align:left;vertical-align:top}th{background:#f6f8fa}.table-wrap{overflow-x:auto}
.note{font-style:italic;color:#57606a;margin:4px 0}.facts{padding-left:20px}
"""

JS = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var chart = document.getElementById("latency-chart");
  var slider = document.getElementById("context-slider");
  var sliderValue = document.getElementById("slider-value");
  var readout = document.getElementById("slider-readout");
  var legend = document.getElementById("chart-legend");
  var W = 900, H = 420, M = {l: 64, r: 20, t: 16, b: 48};
  function fmt(v, d) { return (v === null || v === undefined || !isFinite(v)) ? "\u2014" : Number(v).toFixed(d); }
  function el(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function ticks(max, n) {
    if (!(max > 0)) return [0];
    var raw = max / n, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
    var step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p, out = [];
    for (var i = 0; i * step <= max * 1.0001; i++) out.push(i * step);
    return out;
  }
  var X = function (c) { return M.l + c / data.xmax * (W - M.l - M.r); };
  var Y = function (v) { return H - M.b - v / data.ymax * (H - M.t - M.b); };
  var svg = el("svg", {viewBox: "0 0 " + W + " " + H, "aria-label": "median step time against context"}, chart);
  var grid = el("g", {"class": "grid"}, svg), axes = el("g", {"class": "axis"}, svg);
  ticks(data.ymax, 6).forEach(function (v) {
    el("line", {x1: M.l, x2: W - M.r, y1: Y(v), y2: Y(v)}, grid);
    el("text", {x: M.l - 6, y: Y(v) + 4, "text-anchor": "end"}, axes, v >= 10 ? v.toFixed(0) : String(+v.toFixed(2)));
  });
  ticks(data.xmax, 8).forEach(function (c) {
    el("line", {x1: X(c), x2: X(c), y1: M.t, y2: H - M.b}, grid);
    el("text", {x: X(c), y: H - M.b + 16, "text-anchor": "middle"}, axes, c.toLocaleString("en-US"));
  });
  el("line", {x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b}, axes);
  el("line", {x1: M.l, x2: M.l, y1: M.t, y2: H - M.b}, axes);
  el("text", {x: (M.l + W - M.r) / 2, y: H - 10, "text-anchor": "middle"}, axes, "context (tokens)");
  el("text", {x: 14, y: (M.t + H - M.b) / 2, "text-anchor": "middle",
              transform: "rotate(-90 14 " + (M.t + H - M.b) / 2 + ")"}, axes, "median step time (ms)");
  data.trained.forEach(function (t) {
    el("line", {"class": "trained", x1: X(t), x2: X(t), y1: M.t, y2: H - M.b}, svg);
    el("text", {x: X(t) - 4, y: M.t + 12, "text-anchor": "end", "class": "trained-label"}, svg,
       "trained context " + t.toLocaleString("en-US"));
  });
  if (!data.contexts.length) {
    el("text", {x: (M.l + W - M.r) / 2, y: (M.t + H - M.b) / 2, "text-anchor": "middle", "class": "empty"}, svg,
       "no timed points in this run");
  }
  var cursor = el("line", {"class": "cursor", x1: 0, x2: 0, y1: M.t, y2: H - M.b, visibility: "hidden"}, svg);
  var tip = document.createElement("div");
  tip.className = "tooltip";
  tip.id = "chart-tooltip";
  chart.appendChild(tip);
  function showTip(evt, s, p) {
    var lines = [s.label, "context " + p.context.toLocaleString("en-US") + " tokens, round " + p.round,
                 "median " + fmt(p.median_ms, 2) + " ms (IQR " + fmt(p.q25_ms, 2) + "\u2013" + fmt(p.q75_ms, 2) + ")",
                 "KV cache " + fmt(p.kv_mb, 2) + " MB"];
    if (p.counted_mb !== null && p.counted_mb !== undefined) lines.push("counted " + fmt(p.counted_mb, 2) + " MB");
    if (p.beyond) lines.push("beyond the trained context");
    tip.textContent = "";
    lines.forEach(function (line) { var d = document.createElement("div"); d.textContent = line; tip.appendChild(d); });
    var r = chart.getBoundingClientRect();
    var x = (evt.clientX || r.left + r.width / 2) - r.left + 12, y = (evt.clientY || r.top + r.height / 2) - r.top + 12;
    tip.style.left = Math.min(x, Math.max(0, r.width - 260)) + "px";
    tip.style.top = y + "px";
    tip.style.display = "block";
  }
  function hideTip() { tip.style.display = "none"; }
  data.series.forEach(function (s) {
    var g = el("g", {"class": "series", "data-series": s.id}, svg);
    if (s.medians.length > 1) {
      var d = s.medians.map(function (m, i) {
        return (i ? "L" : "M") + X(m.context).toFixed(1) + " " + Y(m.median_ms).toFixed(1);
      });
      el("path", {d: d.join(" "), stroke: s.colour, "stroke-dasharray": s.dash}, g);
    }
    s.points.forEach(function (p) {
      if (p.q25_ms !== null && p.q75_ms !== null) {
        el("line", {x1: X(p.context), x2: X(p.context), y1: Y(p.q25_ms), y2: Y(p.q75_ms), stroke: s.colour,
                    "stroke-width": 1.5}, g);
      }
      var c = el("circle", {"class": "pt", cx: X(p.context), cy: Y(p.median_ms), r: 5, fill: s.colour}, g);
      c.addEventListener("mouseenter", function (evt) { showTip(evt, s, p); });
      c.addEventListener("mousemove", function (evt) { showTip(evt, s, p); });
      c.addEventListener("mouseleave", hideTip);
    });
    var b = document.createElement("button");
    b.type = "button";
    b.title = "show or hide this series";
    var sw = el("svg", {"class": "swatch", width: 24, height: 8, viewBox: "0 0 24 8"}, b);
    el("line", {x1: 0, x2: 24, y1: 4, y2: 4, stroke: s.colour, "stroke-width": 3, "stroke-dasharray": s.dash}, sw);
    b.appendChild(document.createTextNode(s.label + (s.points.length ? "" : " (no timed points)")));
    b.addEventListener("click", function () {
      var off = b.classList.toggle("off");
      g.style.display = off ? "none" : "";
    });
    legend.appendChild(b);
  });
  function update() {
    readout.textContent = "";
    if (!data.contexts.length) { readout.textContent = "no measured contexts in this run"; return; }
    var ctx = data.contexts[Math.max(0, Math.min(data.contexts.length - 1, +slider.value))];
    sliderValue.textContent = ctx.toLocaleString("en-US") + " tokens";
    cursor.setAttribute("x1", X(ctx));
    cursor.setAttribute("x2", X(ctx));
    cursor.setAttribute("visibility", "visible");
    var table = document.createElement("table"), head = table.createTHead().insertRow();
    ["context " + ctx.toLocaleString("en-US") + " tokens", "median ms", "KV MB", "counted MB", "rounds"].forEach(
      function (h) { var th = document.createElement("th"); th.textContent = h; head.appendChild(th); });
    var body = table.createTBody();
    data.series.forEach(function (s) {
      var row = body.insertRow(), m = null;
      s.medians.forEach(function (x) { if (x.context === ctx) m = x; });
      var why = s.skipped[String(ctx)] || s.skipped_class;
      var cells = m ? [s.label, fmt(m.median_ms, 2), fmt(m.kv_mb, 2), fmt(m.counted_mb, 2), String(m.rounds)]
        : [s.label, why ? "skipped: " + why : "not measured at this context", "\u2014", "\u2014", "\u2014"];
      cells.forEach(function (text) { row.insertCell().textContent = text; });
    });
    readout.appendChild(table);
  }
  slider.addEventListener("input", update);
  slider.addEventListener("change", update);
  update();
  if (location.hash === "#selftest") {
    var result = {chart: !!chart, svg: chart.querySelectorAll("svg").length,
                  points: chart.querySelectorAll("circle.pt").length,
                  lines: chart.querySelectorAll(".series path").length,
                  trained: chart.querySelectorAll("line.trained").length,
                  contexts: data.contexts.length, before: readout.textContent};
    slider.value = String(+slider.value === 0 ? data.contexts.length - 1 : 0);
    slider.dispatchEvent(new Event("input", {bubbles: true}));
    result.after = readout.textContent;
    result.changed = result.before !== result.after;
    var first = chart.querySelector("circle.pt");
    if (first) {
      first.dispatchEvent(new MouseEvent("mouseenter", {clientX: 100, clientY: 100}));
      result.tooltip = tip.textContent;
      hideTip();
    }
    result.errors = window.__kvErrors || [];
    var pre = document.createElement("pre");
    pre.id = "selftest";
    pre.textContent = JSON.stringify(result);
    document.body.appendChild(pre);
  }
})();
"""

ERRORS_JS = ("window.__kvErrors=[];window.addEventListener('error',function(e){window.__kvErrors.push(String("
             "e.message||e.type));});(function(){var o=console.error;console.error=function(){window.__kvErrors.push("
             "Array.prototype.map.call(arguments,String).join(' '));return o.apply(console,arguments);};})();")


def render_html(runs: list[Run], doc: Doc) -> str:
    """report.html: self-contained (inline CSS, JS and data; no network)."""
    data = chart_data(runs)
    n = len(data["contexts"])
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    beyond = ""
    if data["trained_beyond"]:
        beyond = (f'<p class="note">trained context {", ".join(f"{t:,}" for t in data["trained_beyond"])} tokens '
                  "lies beyond the measured contexts (not drawn)</p>")
    disabled = "" if n else " disabled"
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>KV-cache passes report</title>
<script>{ERRORS_JS}</script>
<style>{CSS}</style>
</head>
<body>
<h1>KV-cache passes report</h1>
<section class="chart-box">
<h2>Median step time against context</h2>
<p class="note">Points: median of each (context, round) with its IQR; lines join the per-context medians.
Dashed vertical line: the model's trained context. Hover a point for its values; click a legend entry to hide it.</p>
<div id="latency-chart" class="chart"></div>
<div id="chart-legend" class="legend"></div>
{beyond}
<div class="slider-row"><label for="context-slider">Context</label>
<input type="range" id="context-slider" min="0" max="{max(n - 1, 0)}" step="1" value="{max(n - 1, 0)}"{disabled}>
<span id="slider-value"></span></div>
<div id="slider-readout" aria-live="polite"></div>
</section>
{doc.html()}
<script type="application/json" id="report-data">{payload}</script>
<script>{JS}</script>
</body>
</html>
"""


# ----------------------------------------------------------------------------------------------- entry points


def render(runs: list[Run], out_dir: Path) -> list[Path]:
    """Write report.md, report.html, latency.png and traffic.png into ``out_dir``; return their paths.

    The Markdown and HTML are written first, so they exist even when matplotlib is missing (ReportError).
    """
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        doc = build_doc(runs)
        md = out_dir / "report.md"
        md.write_text(doc.markdown(), encoding="utf-8")
        page = out_dir / "report.html"
        page.write_text(render_html(runs, doc), encoding="utf-8")
        written = [md, page]
        written.append(plot_latency(runs, out_dir / "latency.png"))
        written.append(plot_traffic(runs, out_dir / "traffic.png"))
    except OSError as exc:
        raise ReportError(f"{exc.filename or out_dir}: cannot write ({exc.strerror or exc})") from None
    return written


def main(argv: list[str]) -> int:
    """``kvcache report RUN.json [RUN.json ...] --out DIR``; exit 2 on unreadable input or output."""
    parser = argparse.ArgumentParser(prog="kvcache report", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN.json", help="pytest-benchmark JSON written with the kv plugin")
    parser.add_argument("--out", type=Path, default=Path("report"), help="output directory (default: report)")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(path) for path in args.runs]
        paths = render(runs, args.out)
    except (RecordError, ReportError) as exc:
        print(f"kvcache report: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0
