"""What the report says about each run, as a :class:`~kvcache.analysing.report.documents.Doc`: headline facts,
the fit table (timed and counted passes, crossovers, verdicts), drift, counted traffic, the attention probe and
skipped points. Every missing part of a run is named, never fatal."""

from __future__ import annotations

from pathlib import Path

from kvcache.analysing.records import Point, Run
from kvcache.analysing.report.data import (
    MISSING,
    crossovers,
    dtype,
    finite,
    fit_line,
    fit_problem,
    fmt,
    fmt_count,
    mapping,
    missing_points,
    no_figure,
    points_by_cache,
    run_caches,
    run_names,
    shape_text,
    skip_reasons,
    trained_context,
)
from kvcache.analysing.report.documents import Doc


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
        caches = run_caches(run)
        doc.heading(2, name)
        doc.facts(headline(run))
        fit_section(doc, run, caches, points_by_cache(run))
        doc.para(f"Drift: {drift_text(run)}")
        traffic_section(doc, run, caches)
        overhead_section(doc, run, caches)
        memory_section(doc, run, caches)
        ledger_section(doc, run, caches)
        probe_section(doc, run, caches)
        skipped_section(doc, run)
    return doc


def headline(run: Run) -> list[tuple[str, str]]:
    """Run, machine, libraries, model, dtype, copy bandwidth and points, as (name, text) facts."""
    kv = run.kv
    env, model, settings, copy = (mapping(kv.get(k)) for k in ("environment", "model", "settings", "copy"))
    cpu = run.machine_info.get("cpu")
    cpu_brand = mapping(cpu).get("brand_raw") or mapping(cpu).get("brand") or (cpu if isinstance(cpu, str) else None)
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
        model_text += f"KV {fmt_count(model.get('bytes_per_token'))} bytes/token; "
        weights = finite(model.get("weight_bytes"))
        model_text += f"weights {fmt(None if weights is None else weights / 1e6, 1)} MB; "
        trained = trained_context(run)
        model_text += f"trained context {trained:,} tokens)" if trained else "trained context unknown)"
    else:
        model_text = f"{settings.get('model') or '?'} (no model description in this run)"
    if copy or kv.get("copy_gbps") is not None:
        copy_text = (f"start {fmt(copy.get('start_gbps'))} GB/s, end {fmt(copy.get('end_gbps'))} GB/s, "
                     f"session median {fmt(kv.get('copy_gbps'))} GB/s")
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
        ("dtype", dtype(run)),
        ("Copy bandwidth", copy_text),
        ("Points", points_text),
    ]


def _ci_label(kv: dict) -> str:
    fits = mapping(kv.get("fit"))
    conf = finite(mapping(kv.get("settings")).get("confidence"))
    if conf is None:
        confs = {finite(mapping(f).get("confidence")) for f in fits.values()} - {None}
        conf = confs.pop() if len(confs) == 1 else None
    return f"{conf * 100:.0f}% CI" if conf is not None and conf <= 1 else "CI"


def fit_section(doc: Doc, run: Run, caches: list[str], groups: dict[str, list[Point]]) -> None:
    """One row per class: intercept, effective bandwidth, timed passes [CI], R², counted passes, their ratio,
    the timed and counted crossovers and the verdicts; then where the cache holds as many bytes as the weights."""
    kv = run.kv
    fits, traffic, verdicts = mapping(kv.get("fit")), mapping(kv.get("traffic")), mapping(kv.get("verdict"))
    crossing = crossovers(kv)
    copy_gbps = finite(kv.get("copy_gbps"))
    rows = []
    for cache in caches:
        fit, counted, verdict = mapping(fits.get(cache)), mapping(traffic.get(cache)), mapping(verdicts.get(cache))
        crossing_of = mapping(crossing.get(cache))
        timed = finite(fit.get("passes"))
        effective = finite(fit.get("effective_gbps"))
        if timed is None and copy_gbps and effective:
            timed = copy_gbps / effective
        ci = fit.get("passes_ci")
        ci_text = f" [{fmt(ci[0])}, {fmt(ci[1])}]" if isinstance(ci, (list, tuple)) and len(ci) == 2 else ""
        counted_passes = finite(counted.get("passes"))
        ratio = timed / counted_passes if counted_passes and timed is not None else None
        counted_crossover = fmt_count(crossing_of.get("counted_tokens"))
        if verdict:
            verdict_text = "; ".join(f"{m} {v.get('status', '?')}: {v.get('reason', '')}".rstrip(": ")
                                     for m, v in verdict.items() if isinstance(v, dict))
        else:
            verdict_text = "no verdict"
        if not fit:
            line = fit_line(run, cache, groups.get(cache, []))
            note = "no fit (chart line refit from points)" if line else "no fit"
            rows.append([cache, note, MISSING, MISSING, MISSING, fmt(counted_passes), MISSING, MISSING,
                         counted_crossover, verdict_text])
            continue
        problem = fit_problem(run, cache, groups.get(cache, []))
        if problem is not None:
            rows.append([cache, MISSING, MISSING, no_figure(problem), MISSING, fmt(counted_passes), MISSING, MISSING,
                         counted_crossover, verdict_text])
            continue
        rows.append([cache, fmt(fit.get("intercept_ms")), fmt(fit.get("effective_gbps")), fmt(timed) + ci_text,
                     fmt(fit.get("r2"), 3), fmt(counted_passes), fmt(ratio), fmt_count(crossing_of.get("timed_tokens")),
                     counted_crossover, verdict_text])
    doc.heading(3, "Fit")
    if not caches:
        doc.note("no cache classes in this run")
        return
    doc.table(["cache", "intercept ms", "effective GB/s", f"timed passes [{_ci_label(kv)}]", "R²", "counted passes",
               "timed/counted", "crossover tokens (timed)", "crossover tokens (counted)", "verdict"], rows)
    holds = finite(crossing.get("cache_holds_weights_tokens"))
    if holds is None:
        doc.note("no weight or KV size in this run: no crossovers")
    else:
        doc.para(f"The cache holds as many bytes as the weights at {holds:,.0f} tokens (weight bytes / KV bytes per "
                 "token). Crossover: the context at which one step's cache traffic equals reading the weights once, "
                 "weight bytes / (passes × KV bytes per token), from the timed and from the counted passes.")
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


def drift_text(run: Run) -> str:
    """The first point measured again at the end: its change and whether it stayed within the limit."""
    drift = run.kv.get("drift")
    if not isinstance(drift, dict) or not drift:
        return "no drift check in this run"
    if "reason" in drift and "fraction" not in drift:
        return f"not checked ({drift['reason']})"
    fraction, max_fraction = finite(drift.get("fraction")), finite(drift.get("max_fraction"))
    change = MISSING if fraction is None else f"{fraction * 100:+.1f}%"
    limit = "" if max_fraction is None else f" (limit ±{max_fraction * 100:.1f}%)"
    ok = drift.get("ok")
    status = "ok" if ok is True else "DRIFTED" if ok is False else "unknown"
    return (f"{drift.get('cache', '?')} at {fmt_count(drift.get('context'))} tokens: "
            f"first {fmt(drift.get('first_ms'))} ms, last {fmt(drift.get('last_ms'))} ms, "
            f"change {change}{limit} — {status}")


def traffic_section(doc: Doc, run: Run, caches: list[str]) -> None:
    """Counted passes per class, bytes per cached token per step, and the passes of each op."""
    traffic = mapping(run.kv.get("traffic"))
    doc.heading(3, "Counted traffic")
    if not traffic:
        doc.note("no counted traffic in this run")
        return
    rows = []
    for cache in caches:
        t = mapping(traffic.get(cache))
        if not t:
            rows.append([cache, "no counted traffic", MISSING, MISSING])
            continue
        passes, bpt = finite(t.get("passes")), finite(t.get("bytes_per_token"))
        per_token = passes * bpt if passes is not None and bpt is not None else None
        ops = sorted(mapping(t.get("by_op")).items(), key=lambda item: -(finite(item[1]) or 0.0))
        ops_text = "; ".join(f"{op} {fmt(v)}" for op, v in ops) or "no per-op breakdown"
        rows.append([cache, fmt(passes), fmt_count(per_token), ops_text])
    doc.table(["cache", "counted passes", "bytes per token per step", "passes by op"], rows)


def overhead_section(doc: Doc, run: Run, caches: list[str]) -> None:
    """Counted overhead per class: ATen ops per step (all, moving data, per layer), the bytes a step moves that
    do not grow with context, weight passes, and the overhead and intercept verdicts."""
    traffic, verdicts = mapping(run.kv.get("traffic")), mapping(run.kv.get("verdict"))
    rows = []
    for cache in caches:
        t, v = mapping(traffic.get(cache)), mapping(verdicts.get(cache))
        ops, layers, fixed = finite(t.get("ops_per_step")), finite(t.get("layers")), finite(t.get("fixed_bytes"))
        if ops is None:
            continue
        rows.append([cache, fmt_count(ops), fmt_count(finite(t.get("data_ops_per_step"))),
                     fmt(ops / layers if layers else None), fmt(fixed / 1e6 if fixed is not None else None),
                     fmt(finite(t.get("weight_passes")), 3),
                     *(str(mapping(v.get(m)).get("status", MISSING)) for m in ("overhead", "intercept"))])
    if not rows:
        return
    doc.heading(3, "Per-step overhead")
    doc.para("ATen ops dispatched from the model's forward call to its return in one decode step (all of them, and "
             "those that move data); fixed MB: bytes a step reads + writes that do not grow with context (the counted "
             "line's intercept); weight passes: fixed bytes / weight bytes (1 = each weight read once per step). The "
             "intercept verdict judges the timed intercept (ms per step with an empty cache) by its interval.")
    doc.table(["cache", "ops/step", "data ops/step", "ops/layer", "fixed MB", "weight passes", "overhead verdict",
               "intercept verdict"], rows)


def memory_section(doc: Doc, run: Run, caches: list[str]) -> None:
    """Counted memory per class (``kv.memory``): allocated, peak and held passes, the cache sizes the peak needs beside
    the declared memory factor, what allocates, and the memory verdict."""
    memory, verdicts = mapping(run.kv.get("memory")), mapping(run.kv.get("verdict"))
    rows = []
    for cache in caches:
        m = mapping(memory.get(cache))
        if not m:
            continue
        ops = "; ".join(f"{op} {fmt(finite(v))}" for op, v in mapping(m.get("allocated_by_op")).items()) or MISSING
        factor = f"{fmt(finite(m.get('peak_factor')))} (declares {fmt(finite(m.get('declared_factor')))})"
        if m.get("factor_problem"):
            factor += f": {m['factor_problem']}"
        rows.append([cache, fmt(finite(m.get("allocated_passes")), 3), fmt(finite(m.get("peak_passes")), 3),
                     fmt(finite(m.get("held_passes")), 3), factor, ops,
                     str(mapping(mapping(verdicts.get(cache)).get("memory")).get("status", MISSING))])
    if not rows:
        return
    doc.heading(3, "Memory per decode step")
    doc.para("Bytes per KV byte (slopes between the counted contexts, like passes): allocated by one decode step, its "
             "high-water mark above what was live before it (peak), live after it (held: 1 = the cache holds its K/V "
             "once; above 1, something keeps more). Peak needs: bytes live at the step's peak per KV byte, the cache "
             "sizes a point needs, beside the class's declared memory_factor. Measured from the storages each op "
             "makes and frees (memory.png: held and peak against context).")
    doc.table(["cache", "allocated", "peak", "held", "peak needs (declared)", "allocated by op", "memory verdict"],
              rows)


def ledger_section(doc: Doc, run: Run, caches: list[str]) -> None:
    """The per-op timed ledger: per class and op, counted passes beside timed passes and their interval."""
    ledger, traffic = mapping(run.kv.get("ledger")), mapping(run.kv.get("traffic"))
    errors = mapping(run.kv.get("ledger_errors"))
    if not ledger and not errors:
        return
    doc.heading(3, "Per-op timed ledger")
    doc.para("Each op's time per profiled step (profiler rounds of their own, after the timed rounds), fitted "
             "against KV bytes like the whole step and read as passes; counted passes of the same op beside it. "
             "(unattributed): the step's time outside ATen ops; (profiled step): the whole step under the profiler.")
    rows = []
    for cache in caches:
        by_op = mapping(mapping(traffic.get(cache)).get("by_op"))
        for op, row in mapping(ledger.get(cache)).items():
            row = mapping(row)
            ci = row.get("timed_ci") or [None, None]
            interval = (f"[{fmt(finite(ci[0]))}, {fmt(finite(ci[1]))}]" if None not in ci else MISSING)
            rows.append([cache, op, fmt(finite(by_op.get(op))) if op in by_op else MISSING,
                         fmt(finite(row.get("timed"))), interval, fmt(finite(row.get("ms")))])
        if cache in errors:
            rows.append([cache, str(errors[cache]), MISSING, MISSING, MISSING, MISSING])
    doc.table(["cache", "op", "counted passes", "timed passes", "interval", "ms per step (largest context)"], rows)


def probe_section(doc: Doc, run: Run, caches: list[str]) -> None:
    """What attention received in one probed step: shapes, how GQA ran, K/V expansions."""
    probe = mapping(run.kv.get("probe"))
    doc.heading(3, "Attention probe")
    if not probe:
        doc.note("no attention probe in this run")
        return
    rows = []
    for cache in caches:
        p = mapping(probe.get(cache))
        if not p:
            rows.append([cache, "no probe", *[MISSING] * 7])
            continue
        rows.append([cache, *(shape_text(p.get(k)) for k in ("query", "key", "value", "mask")),
                     *(str(p.get(k, "?")) for k in ("attention", "expansions", "enable_gqa", "calls"))])
    doc.table(["cache", "query", "key", "value", "mask", "attention", "expansions", "enable_gqa", "calls"], rows)


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
