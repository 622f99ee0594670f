"""What the report says about each run, as a :class:`~kvcache.analysing.report.documents.Doc`: headline facts, the
verdicts (statuses, each reason once as a numbered note), the fit table (timed and counted passes, crossovers),
drift, counted traffic, overhead, memory, the per-op ledger, the attention probe and skipped points. Every missing
part of a run is named, never fatal. Read from the run's records (:attr:`kvcache.analysing.records.Run.record`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from kvcache.analysing import tables
from kvcache.analysing.estimates import finite
from kvcache.analysing.judge import judges
from kvcache.analysing.records import KV, Fit, Memory, Point, Probe, Run, Traffic, UnmeasuredDrift
from kvcache.analysing.report.data import (
    dtype,
    fit_line,
    fit_problem,
    missing_points,
    no_figure_cell,
    points_by_cache,
    run_caches,
    run_crossovers,
    run_names,
    shape_text,
    skip_reasons,
    trained_context,
)
from kvcache.analysing.report.documents import Doc
from kvcache.analysing.summary import attention_copies, instrument_lines, poor_fit_lines, verdict_table
from kvcache.analysing.tables import MISSING, num

TITLE = "KV-cache passes report"
ClassRecord = TypeVar("ClassRecord")


def build_doc(runs: list[Run]) -> Doc:
    """The report's title, then the headline and tables of each run."""
    doc = Doc(TITLE)
    doc.para(f"{len(runs)} run(s). Passes = copy bandwidth / effective bandwidth of the latency-vs-KV-bytes line "
             "(timed) or bytes each op of one decode step reads + writes per byte of KV cache (counted). "
             "Times in ms, GB/s = 1e9 bytes/s, MB = 1e6 bytes, contexts in tokens.")
    if not runs:
        doc.note("no runs")
    for run, name in zip(runs, run_names(runs)):
        kv, caches = run.record, run_caches(run)
        doc.heading(2, name)
        doc.facts(headline(run, kv))
        verdict_section(doc, kv)
        fit_section(doc, run, kv, caches, points_by_cache(run))
        doc.para(f"Drift: {drift_text(kv)}")
        class_table(doc, "Counted traffic", caches, kv.traffic, "counted traffic", "no counted traffic",
                    ["cache", "counted passes", "bytes per token per step", "passes by op"], traffic_cells)
        backends_section(doc, kv, caches)
        overhead_section(doc, kv, caches)
        memory_section(doc, kv, caches)
        ledger_section(doc, kv, caches)
        class_table(doc, "Attention probe", caches, kv.probe, "attention probe", "no probe",
                    ["cache", "query", "key", "value", "mask", "attention", "expansions", "enable_gqa", "calls"],
                    probe_cells)
        skipped_section(doc, run)
    return doc


def headline(run: Run, kv: KV) -> list[tuple[str, str]]:
    """Run, machine, libraries, model, dtype, copy bandwidth and points, as (name, text) facts."""
    env, model, settings = kv.environment, kv.model, kv.settings
    cpu = run.machine_info.get("cpu")
    cpu_brand = (cpu.get("brand_raw") or cpu.get("brand")) if isinstance(cpu, dict) else cpu if isinstance(cpu, str) \
        else None
    machine = f"{env.device_name or '?'} (device type {env.device_type or '?'}"
    machine += f", {env.platform})" if env.platform else ")"
    if cpu_brand:
        machine += f"; CPU {cpu_brand}"
    if run.machine_info.get("node"):
        machine += f"; node {run.machine_info['node']}"
    libs = f"transformers {env.transformers or '?'}, torch {env.torch or '?'}, python {env.python or '?'}"
    if model.to_json():  # a run with a model description
        geometry = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in (
            ("layers", model.layers), ("heads", model.heads), ("kv_heads", model.kv_heads),
            ("head_dim", model.head_dim)) if v is not None)
        weights = finite(model.weight_bytes)
        trained = trained_context(kv)
        model_text = (f"{model.name or settings.model or '?'} ({geometry}; "
                      f"KV {num(model.bytes_per_token, ',.0f')} bytes/token; "
                      f"weights {num(None if weights is None else weights / 1e6, '.1f')} MB; "
                      + (f"trained context {trained:,} tokens)" if trained else "trained context unknown)"))
    else:
        model_text = f"{settings.model or '?'} (no model description in this run)"
    if kv.copy is not None or kv.copy_gbps is not None:
        start, end = (kv.copy.start_gbps, kv.copy.end_gbps) if kv.copy is not None else (None, None)
        copy_text = f"start {num(start)} GB/s, end {num(end)} GB/s, session median {num(kv.copy_gbps)} GB/s"
    else:
        copy_text = "no copy bandwidth in this run"
    contexts = sorted({p.context for p in run.points})
    rounds = sorted({p.round for p in run.points})
    points_text = (f"{len(run.points)} timed points; contexts {', '.join(f'{c:,}' for c in contexts)} tokens; "
                   f"{len(rounds)} round(s); {'?' if settings.steps is None else settings.steps} steps per point"
                   if run.points else "no timed points in this run")
    return [
        ("Run", Path(run.path).name + (f", {run.datetime}" if run.datetime else "")),
        ("Machine", machine),
        ("Libraries", libs),
        ("Model", model_text),
        ("dtype", dtype(kv)),
        ("Copy bandwidth", copy_text),
        ("Points", points_text),
    ]


def verdict_section(doc: Doc, kv: KV) -> None:
    """The judge's status of each class and measure, each reason said once as a numbered note under the table."""
    doc.heading(3, "Verdicts")
    if not kv.verdict:
        doc.note("no verdict in this run")
        return
    table, notes = verdict_table(kv.verdict)
    doc.table(table.header, table.rows)
    doc.footnotes(notes.texts)


def _ci_label(kv: KV) -> str:
    conf = finite(kv.settings.confidence)
    if conf is None:
        confs = {finite(f.confidence) for f in kv.fit.values() if isinstance(f, Fit)} - {None}
        conf = confs.pop() if len(confs) == 1 else None
    return f"{conf * 100:.0f}% CI" if conf is not None and conf <= 1 else "CI"


def fit_section(doc: Doc, run: Run, kv: KV, caches: list[str], groups: dict[str, list[Point]]) -> None:
    """One row per class: intercept, effective bandwidth, timed passes [CI], R², counted passes, their ratio and
    the timed and counted crossovers; then where the cache holds as many bytes as the weights."""
    crossing = run_crossovers(kv)
    rows = []
    for cache in caches:
        fit, traffic, crossing_of = kv.fit.get(cache), kv.traffic.get(cache), crossing.by_cache.get(cache)
        counted = traffic.passes if traffic is not None else None
        timed_crossover, counted_crossover = ((num(crossing_of.timed_tokens, ",.0f"),
                                               num(crossing_of.counted_tokens, ",.0f"))
                                              if crossing_of is not None else (MISSING, MISSING))
        if fit is None:
            note = "no fit (chart line refit from points)" if fit_line(run, cache, groups.get(cache, [])) else "no fit"
            rows.append([cache, note, MISSING, MISSING, MISSING, num(counted), MISSING, MISSING, counted_crossover])
            continue
        problem = fit_problem(run, cache, groups.get(cache, []))
        if problem is not None or not isinstance(fit, Fit):
            rows.append([cache, MISSING, MISSING, no_figure_cell(problem or fit.error), MISSING, num(counted), MISSING,
                         MISSING, counted_crossover])
            continue
        timed = finite(fit.passes)
        if timed is None and finite(kv.copy_gbps) and finite(fit.effective_gbps):
            timed = kv.copy_gbps / fit.effective_gbps
        ratio = timed / counted if finite(counted) and timed is not None else None
        poor = judges.poor_fit(fit.r2, judges.min_r2_of(kv.settings))  # with a baseline or without
        rows.append([cache, num(fit.intercept_ms), num(fit.effective_gbps), tables.figure(timed, fit.passes_ci),
                     num(fit.r2, ".3f") + (" poor fit" if poor else ""), num(counted), num(ratio), timed_crossover,
                     counted_crossover])
    doc.heading(3, "Fit")
    if not caches:
        doc.note("no cache classes in this run")
        return
    doc.table(["cache", "intercept ms", "effective GB/s", f"timed passes [{_ci_label(kv)}]", "R²", "counted passes",
               "timed/counted", "crossover tokens (timed)", "crossover tokens (counted)"], rows)
    for line in poor_fit_lines(kv):
        doc.note(line)
    holds = finite(crossing.cache_holds_weights_tokens)
    if holds is None:
        doc.note("no weight or KV size in this run: no crossovers")
    else:
        doc.para(f"The cache holds as many bytes as the weights at {holds:,.0f} tokens (weight bytes / KV bytes per "
                 "token). Crossover: the context at which one step's cache traffic equals reading the weights once, "
                 "weight bytes / (passes × KV bytes per token), from the timed and from the counted passes.")
    for part, what in ((kv.fit, "fit"), (kv.traffic, "counted traffic")):
        if not part:
            doc.note(f"no {what} in this run")
        elif missing := [c for c in caches if c not in part]:
            doc.note(f"no {what} for {', '.join(missing)} in this run")


def drift_text(kv: KV) -> str:
    """The first point measured again at the end: its change and whether it stayed within the limit."""
    drift = kv.drift
    if drift is None:
        return "no drift check in this run"
    if isinstance(drift, UnmeasuredDrift):
        return f"not checked ({drift.reason})"
    fraction, max_fraction = finite(drift.fraction), finite(drift.max_fraction)
    change = MISSING if fraction is None else f"{fraction * 100:+.1f}%"
    limit = "" if max_fraction is None else f" (limit ±{max_fraction * 100:.1f}%)"
    status = "ok" if drift.ok is True else "DRIFTED" if drift.ok is False else "unknown"
    return (f"{drift.cache or '?'} at {num(drift.context, ',.0f')} tokens: first {num(drift.first_ms)} ms, "
            f"last {num(drift.last_ms)} ms, change {change}{limit} — {status}")


def class_table(doc: Doc, title: str, caches: list[str], parts: Mapping[str, ClassRecord], what: str, none: str,
                header: list[str], cells: Callable[[ClassRecord], list[str]]) -> None:
    """A section of one row per class: the ``cells`` of its part, or ``none`` where the class has no part; a note
    instead of the table when the run has no ``what`` at all."""
    doc.heading(3, title)
    if not parts:
        doc.note(f"no {what} in this run")
        return
    blank = [none, *[MISSING] * (len(header) - 2)]
    doc.table(header, [[cache, *(cells(parts[cache]) if cache in parts else blank)] for cache in caches])


def traffic_cells(t: Traffic) -> list[str]:
    """Counted passes, bytes per cached token per step, and the passes of each op."""
    passes, per_token = finite(t.passes), finite(t.bytes_per_token)
    per_step = passes * per_token if passes is not None and per_token is not None else None
    return [num(passes), num(per_step, ",.0f"), tables.by_op(t.by_op)]


def optional_section(doc: Doc, title: str, text: str, header: list[str], rows: list[list[str]]) -> None:
    """A section (heading, what it shows, table) only when it has rows: a part few runs have."""
    if rows:
        doc.heading(3, title)
        doc.para(text)
        doc.table(header, rows)


def backends_section(doc: Doc, kv: KV, caches: list[str]) -> None:
    """Per SDPA class and backend a CUDA GPU runs, the counted passes of the step under it; with --kv-gpus, per GPU
    class the backend torch's own rules select, the reasons the backends ahead of it were rejected (torch's words),
    and the passes under it (only for runs that have them)."""
    rows = []
    for cache in caches:
        t = kv.traffic.get(cache)
        for backend, entry in ((t.backends or {}).items() if t is not None else ()):
            rows.append([cache, backend, num(finite(entry.passes)),
                         tables.by_op(entry.by_op) if entry.passes is not None else entry.error or ""])
    optional_section(doc, "SDPA backends", "The step counted with every scaled_dot_product_attention call run as torch "
                     "runs it on CUDA under each backend (kvcache.measuring.counting.backends): counted passes and "
                     "per op.",
                     ["cache", "backend", "counted passes", "passes by op (or why not)"], rows)
    rows = []
    for cache in caches:
        t = kv.traffic.get(cache)
        for gpu, entry in ((t.gpus or {}).items() if t is not None else ()):
            rejected = "; ".join(f"{b}: {why}" for b, why in entry.rejected.items())
            rows.append([cache, gpu, entry.backend or MISSING, num(finite(entry.passes)),
                         rejected or entry.error or MISSING])
    optional_section(doc, "GPU classes", "The backend torch's own rules (torch 2.13's select_sdp_backend, transcribed: "
                     "docs/gpu-backends.md) select for the step's SDPA calls on each GPU class, and the counted passes "
                     "under it; the reasons are torch's debug warnings for every backend ahead of it.",
                     ["cache", "GPU class", "backend", "counted passes", "rejected before it"], rows)


def overhead_section(doc: Doc, kv: KV, caches: list[str]) -> None:
    """Counted overhead per class: ATen ops per step (all, moving data, per layer), the bytes a step moves that
    do not grow with context and weight passes (their verdicts, with the intercept's, are in the verdict table)."""
    def cells(t: Traffic) -> list[str]:
        per_layer = t.ops_per_step / t.layers if t.ops_per_step is not None and finite(t.layers) else None
        fixed_mb = t.fixed_bytes / 1e6 if finite(t.fixed_bytes) is not None else None
        return [num(t.ops_per_step, ",.0f"), num(t.data_ops_per_step, ",.0f"), num(per_layer), num(fixed_mb),
                num(t.weight_passes, ".3f")]

    optional_section(
        doc, "Per-step overhead",
        "ATen ops dispatched from the model's forward call to its return in one decode step (all of them, and those "
        "that move data); fixed MB: bytes a step reads + writes that do not grow with context (the counted line's "
        "intercept); weight passes: fixed bytes / weight bytes (1 = each weight read once per step). The intercept "
        "verdict (under Verdicts) judges the timed intercept (ms per step with an empty cache) by its interval.",
        ["cache", "ops/step", "data ops/step", "ops/layer", "fixed MB", "weight passes"],
        [[cache, *cells(kv.traffic[cache])] for cache in caches
         if cache in kv.traffic and finite(kv.traffic[cache].ops_per_step) is not None])


def memory_section(doc: Doc, kv: KV, caches: list[str]) -> None:
    """Counted memory per class (``kv.memory``): allocated, peak and held passes, the cache sizes the peak needs beside
    the declared memory factor, and what allocates."""
    def cells(m: Memory) -> list[str]:
        per = m.per_allocated  # a left-padded batch: the factor counts allocated KV bytes
        needs = (f"{num(per.peak_factor)} per allocated KV byte" if per is not None and per.peak_factor is not None
                 else num(m.peak_factor))
        factor = f"{needs} (declares {num(m.declared_factor)}{attention_copies(m)})"
        return [num(m.allocated_passes, ".3f"), num(m.peak_passes, ".3f"), num(m.held_passes, ".3f"),
                factor + (f": {m.factor_problem}" if m.factor_problem else ""), tables.by_op(m.allocated_by_op)]

    optional_section(
        doc, "Memory per decode step",
        "Bytes per KV byte (slopes between the counted contexts, like passes): allocated by one decode step, its "
        "high-water mark above what was live before it (peak), live after it (held: 1 = the cache holds its K/V once; "
        "above 1, something keeps more). Peak needs: bytes live at the step's peak per KV byte, the cache sizes a "
        "point needs, beside the class's declared memory_factor. Measured from the storages each op makes and frees "
        "(memory.png: held and peak against context).",
        ["cache", "allocated", "peak", "held", "peak needs (declared)", "allocated by op"],
        [[cache, *cells(kv.memory[cache])] for cache in caches if cache in kv.memory])


def ledger_section(doc: Doc, kv: KV, caches: list[str]) -> None:
    """The per-op timed ledger: per class and op, counted passes beside timed passes and their interval."""
    if not kv.ledger and not kv.ledger_errors:
        return
    doc.heading(3, "Per-op timed ledger")
    doc.para("Each op's time per profiled step (rounds of their own, after the timed rounds), fitted "
             "against KV bytes like the whole step and read as passes; counted passes of the same op beside it. "
             "(unattributed): the step's time outside ATen ops; (profiled step): the whole step, timed op by op; "
             "(plain step): the steps taken between the profiled ones on the same points, with no instrument.")
    rows = []
    for cache in caches:
        traffic = kv.traffic.get(cache)
        counted = traffic.by_op if traffic is not None else {}
        if cache in kv.ledger:
            rows += [[cache, op, num(counted.get(op)), num(row.timed), tables.interval_text(row.timed_ci) or MISSING,
                      num(row.ms)] for op, row in kv.ledger[cache].items()]
        if cache in kv.ledger_errors:
            rows.append([cache, str(kv.ledger_errors[cache]), MISSING, MISSING, MISSING, MISSING])
    doc.table(["cache", "op", "counted passes", "timed passes", "interval", "ms per step (largest context)"], rows)
    for line in instrument_lines(kv):
        doc.para(line)


def probe_cells(p: Probe) -> list[str]:
    """What attention received in one probed step: shapes, how GQA ran, K/V expansions, calls."""
    return [*(shape_text(shape) for shape in (p.query, p.key, p.value, p.mask)),
            *("?" if v is None else str(v) for v in (p.attention, p.expansions, p.enable_gqa, p.calls))]


def skipped_section(doc: Doc, run: Run) -> None:
    """Points the run skipped (with the recorded reason) or lacks without one."""
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
