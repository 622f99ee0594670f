"""The terminal summary of a run's ``kv`` section, read from its records (:class:`~kvcache.analysing.records.KV`):
plain-text tables and lines (analysing wing, no torch). Times in ms, bandwidths in GB/s (1e9 bytes/s, read +
write), sizes in bytes unless a header says MB (1e6 bytes), passes = bytes moved per logical KV byte, contexts in
tokens. Verdicts are a table of statuses, each reason said once as a numbered note under it
(:func:`verdict_table`)."""

from __future__ import annotations

from typing import Any

from kvcache.analysing import decoding, tables
from kvcache.analysing.counted_notes import counted_notes
from kvcache.analysing.estimates import finite, median
from kvcache.analysing.judge import gate, judges, measure_table
from kvcache.analysing.ledger import ADDS_UP, PROFILED_STEP
from kvcache.analysing.records import (
    KV,
    Crossovers,
    Drift,
    Fit,
    FitFailure,
    GpuPrediction,
    Memory,
    UnmeasuredDrift,
    Verdict,
    identity,
)
from kvcache.analysing.tables import MISSING, Table, num

FIT_HEADER = ["cache", "intercept ms [CI]", "eff GB/s", "timed passes [CI]", "R²", "counted", "timed/counted",
              "crossover tok"]
OVERHEAD_HEADER = ["cache", "ops/step", "data ops/step", "ops/layer", "fixed MB", "weight passes"]
POINT_HEADER = ["cache", "context", "rounds", "median ms", "achieved GB/s", "of copy"]
LEDGER_HEADER = ["cache", "op", "counted", "timed [CI]", "ms/step at largest context", "ledger verdict"]
#: The verdict table's columns, in this order (the summarised verdicts of the measure table); a verdict a later
#: judge adds follows them.
SUMMARY_MEASURES = tuple(v.name for v in measure_table.VERDICTS if v.summarised)
#: The summarised measures the tables and lines above the verdicts show; any other is a row of the figures table.
SHOWN_APART = ("timed", "counted", "intercept", "r2", "ops", "weight_passes", "allocated", "peak", "held", "gpu",
               "backend", "ledger", "syncs", "periodic", "per_token", "prefill", "prefill_extra")  # the last five:
# the notes under a class's counted line (counted_notes) and the decoding lines (decoding.summary_lines)


def measured_verdicts(kv: KV) -> dict[str, dict[str, Verdict]]:
    """Verdicts of the classes with at least one measure measured (skipped classes are listed as skips)."""
    return {cache: verdicts for cache, verdicts in kv.verdict.items()
            if any(v.status != "not-measured" for v in verdicts.values())}


def table_verdicts(kv: KV) -> dict[str, dict[str, Verdict]]:
    """The verdict table's classes: those measured (:func:`measured_verdicts`) and the skipped classes the baseline
    holds figures for (:func:`kvcache.analysing.judge.gate.unmeasured_baselined`: a row not-measured with the skip
    reason, so that a baselined class cannot drop out of the gate unseen)."""
    return {cache: verdicts for cache, verdicts in kv.verdict.items()
            if any(v.status != "not-measured" or gate.unmeasured_baselined(v) for v in verdicts.values())}


def verdict_table(verdicts: dict[str, dict[str, Verdict]]) -> tuple[Table, tables.Notes]:
    """One row per class, one column per measure (:data:`SUMMARY_MEASURES`): each cell the status (pass, regression,
    inconclusive, no-baseline, not-measured) and the number of its reason, ``no-baseline [2]``; and the reasons,
    each said once however many cells share it, as ``[n] reason`` (:class:`~kvcache.analysing.tables.Notes`)."""
    seen = dict.fromkeys(m for measures in verdicts.values() for m in measures)
    measures = [m for m in SUMMARY_MEASURES if m in seen] + [m for m in seen if m not in SUMMARY_MEASURES]
    notes = tables.Notes()
    rows = [[cache, *(notes.cell(v[m].status, v[m].reason) if m in v else MISSING for m in measures)]
            for cache, v in verdicts.items()]
    return Table(["cache", *(f"{m} verdict" for m in measures)], rows), notes


def fit_rows(kv: KV) -> list[list[str]]:
    """Per measured class (and per class whose fit failed, with why): the timed line's intercept and effective
    bandwidth, timed passes with their interval, R², counted passes, their ratio and the timed crossover."""
    measured = measured_verdicts(kv)
    failed = [c for c, f in kv.fit.items() if isinstance(f, FitFailure) and c not in measured]
    rows = []
    for cache in [*measured, *failed]:  # a class whose fit failed is listed with why, whatever its verdict
        fit, traffic = kv.fit.get(cache), kv.traffic.get(cache)
        counted = traffic.passes if traffic else None
        if not isinstance(fit, Fit):
            timed = f"{MISSING} ({fit.error})" if isinstance(fit, FitFailure) else MISSING
            rows.append([cache, MISSING, MISSING, timed, MISSING, num(counted), MISSING, MISSING])
            continue
        ratio = fit.passes / counted if finite(fit.passes) and finite(counted) else None
        poor = " poor fit" if judges.poor_fit(fit.r2, judges.min_r2_of(kv.settings)) else ""
        rows.append([cache, tables.figure(fit.intercept_ms, fit.intercept_ci), num(fit.effective_gbps, ".1f"),
                     tables.figure(fit.passes, fit.passes_ci), num(fit.r2, ".3f") + poor, num(counted), num(ratio),
                     num(fit.crossover_tokens, ",.0f")])
    return rows


def poor_fit_lines(kv: KV) -> list[str]:
    """One line per class whose timed fit is poor (:func:`kvcache.analysing.judge.judges.poor_fit`: R² below
    ``--kv-min-r2``), with or without a baseline: its timed figures are not to be quoted; one per class whose points
    give no timed passes per generated token (``per_token_problem``: they gained different tokens per step)."""
    min_r2 = judges.min_r2_of(kv.settings)
    fits = [(cache, fit) for cache, fit in kv.fit.items() if isinstance(fit, Fit)]
    return [f"timed {cache}: {problem}: its timed passes and intercept are not to be quoted"
            for cache, fit in fits for problem in [judges.poor_fit(fit.r2, min_r2)] if problem] + [
        f"timed {cache}: {fit.per_token_problem}" for cache, fit in fits if fit.per_token_problem]


def overhead_rows(kv: KV) -> list[list[str]]:
    """Counted overhead per class: ATen ops per step (all, and those moving data), per layer, fixed bytes (MB =
    1e6 bytes, read + written, not growing with context) and weight passes."""
    rows = []
    for cache, t in kv.traffic.items():
        if t.ops_per_step is None:
            continue
        per_layer = t.ops_per_step / t.layers if t.layers else None
        fixed_mb = t.fixed_bytes / 1e6 if t.fixed_bytes is not None else None
        rows.append([cache, str(t.ops_per_step), num(t.data_ops_per_step, ".0f"), num(per_layer, ".1f"),
                     num(fixed_mb, ".1f"), num(t.weight_passes, ".3f")])
    return rows


def ledger_status(verdict: Verdict | None, op: str) -> str:
    """The status of ``op``'s part of a class's ledger verdict; MISSING where the op was not judged."""
    if verdict is None or not verdict.parts or op not in verdict.parts:
        return MISSING
    return verdict.parts[op].status


def ledger_table_rows(kv: KV) -> list[list[str]]:
    """Per class and op of the ledger: counted passes (from ``kv.traffic``), timed passes with their interval,
    ms per step at the largest profiled context, and the op's part of the ledger verdict."""
    rows = []
    for cache, ops in kv.ledger.items():
        traffic, verdicts = kv.traffic.get(cache), kv.verdict.get(cache)
        counted = traffic.by_op if traffic else {}
        verdict = verdicts.get("ledger") if verdicts else None
        for op, row in ops.items():
            rows.append([cache, op, num(counted.get(op)), tables.figure(row.timed, row.timed_ci), num(row.ms),
                         ledger_status(verdict, op)])
    return rows


def instrument_lines(kv: KV) -> list[str]:
    """Per class with plain steps in its ledger points: its profiled step against them, per context (what the
    instrument did to the step), and whether that is within :data:`~kvcache.analysing.ledger.ADDS_UP`."""
    out = []
    for cache, ops in kv.ledger.items():
        row = ops.get(PROFILED_STEP)
        gaps = row.over_plain if row is not None else None
        if not gaps:
            continue
        tokens = {c: f"{int(c):,}" if c.isdigit() else c for c in gaps}  # a file's keys: shown as they are
        beyond = [tokens[c] for c, g in gaps.items() if not abs(g) <= ADDS_UP]
        verdict = (f"within ±{ADDS_UP:.0%} at every context" if not beyond else
                   f"beyond ±{ADDS_UP:.0%} at {', '.join(beyond)} tokens: there the op figures describe a step the "
                   "instrument changed")
        out.append(f"ledger {cache}: profiled step against the plain steps between them, per context: "
                   + ", ".join(f"{tokens[c]} {g:+.1%}" for c, g in gaps.items()) + f" ({verdict})")
    return out


def point_rows(kv: KV) -> list[list[str]]:
    """Per (cache, context): median over rounds of the median step (ms) and of the achieved bandwidth (GB/s) and
    its share of the copy bandwidth."""
    groups: dict[tuple[str, int], list[Any]] = {}
    for p in kv.points:
        groups.setdefault((p.cache, p.context), []).append(p)
    rows = []
    for (cache, context), pts in sorted(groups.items()):
        medians = [p.median_ms for p in pts if finite(p.median_ms) is not None]
        achieved = [p.achieved_gbps for p in pts if p.achieved_gbps]
        fraction = [p.achieved_fraction for p in pts if p.achieved_fraction]
        flag = " (beyond trained context)" if pts[0].beyond_trained_context else ""
        rows.append([cache, f"{context}{flag}", str(len(pts)), num(median(medians) if medians else None),
                     num(median(achieved) if achieved else None, ".1f"),
                     num(100 * median(fraction), ".0f") + "%" if fraction else MISSING])
    return rows


def crossover_lines(crossovers: Crossovers | None) -> list[str]:
    """``kv.crossovers`` in words, contexts in tokens: where the cache holds as many bytes as the weights, and
    per class where a step's cache traffic (from the timed and the counted passes) equals one read of the weights,
    and where the bytes it holds (measured) do."""
    if crossovers is None:
        return []
    out = [f"crossover: the cache holds as many bytes as the weights at "
           f"{num(crossovers.cache_holds_weights_tokens, ',.0f')} tokens"]
    out += [f"crossover {cache}: a step's cache traffic equals one read of the weights at "
            f"{num(c.timed_tokens, ',.0f')} tokens timed, {num(c.counted_tokens, ',.0f')} counted"
            + (f"; the bytes it holds (measured) equal the weights at {num(c.held_tokens, ',.0f')} tokens"
               if c.held_tokens is not None else "")
            for cache, c in crossovers.by_cache.items()]
    return out


def drift_line(drift: Drift | UnmeasuredDrift | None) -> list[str]:
    """The first timed point measured again at the end (ms), its change against the allowed fraction, or why it
    was not checked."""
    if isinstance(drift, UnmeasuredDrift):
        return [f"drift: not checked ({drift.reason})"]
    if drift is None:
        return []
    state = "ok" if drift.ok else "TOO LARGE: timed verdicts are inconclusive"
    return [f"drift: {drift.cache} at {drift.context} tokens {num(drift.first_ms)} -> {num(drift.last_ms)} ms "
            f"({num(drift.fraction, '+.1%')}, allowed ±{num(drift.max_fraction, '.0%')}): {state}"]


#: The line above the ``backends``/``gpus`` lines: they are about a CUDA GPU, whatever device the run had.
BACKENDS_NOTE = ("SDPA on a CUDA GPU (predicted from torch's backend rules, on any device; each backend's step counted "
                 "here): passes per backend, and per GPU class (--kv-gpus) the backend torch would select")


def backend_lines(kv: KV) -> list[str]:
    """Per SDPA class, the counted passes under each SDPA backend a CUDA GPU runs (``backends <cache>: math 25.26 ·
    flash 3.00 · ...``) and, with --kv-gpus, per GPU class the backend torch's rules select and its passes, with the
    reasons the backends ahead of it were rejected (``gpus dynamic: a100 3.00 (flash) · t4 25.3 (math: flash needs
    sm80 or newer; ...)``)."""
    out = []
    for cache, t in kv.traffic.items():
        if t.backends:
            shown = " · ".join(f"{b} {num(e.passes, '.2f')}" if e.passes is not None
                               else f"{b} — ({e.error or 'not counted'})" for b, e in t.backends.items())
            out.append(f"backends {cache}: {shown}")
        if t.gpus:
            errors = {e.error for e in t.gpus.values() if e.backend is None}
            if len(errors) == 1 and all(e.backend is None for e in t.gpus.values()):
                out.append(f"gpus {cache}: {', '.join(t.gpus)} — {errors.pop() or 'not predicted'}")
            else:
                out.append(f"gpus {cache}: " + " · ".join(gpu_text(gpu, e) for gpu, e in t.gpus.items()))
    return out


def gpu_text(gpu: str, entry: GpuPrediction) -> str:
    """``t4 25.26 (math: flash needs sm80 or newer; efficient takes float16, float32)``; ``t4 — (why not)``."""
    if entry.backend is None:
        return f"{gpu} — ({entry.error or 'not predicted'})"
    rejected = "; ".join(short_reason(b, why) for b, why in entry.rejected.items())
    return f"{gpu} {num(entry.passes, '.2f')} ({entry.backend}{': ' + rejected if rejected else ''})"


def short_reason(backend: str, why: str) -> str:
    """A few words of torch's reason for a summary line: ``flash needs sm80 or newer``, ``efficient takes float16,
    float32``, ``flash takes no mask``; else its first 60 characters."""
    lowered = why.lower()
    if "gpu architectures in the range [" in lowered:
        return f"{backend} needs {why.split('[')[1].split(',')[0]} or newer"
    if "of dtype: {" in lowered:
        return f"{backend} takes {why.split('{')[1].split('}')[0]}"
    if "the same num_heads" in lowered:
        return f"{backend} needs as many K/V heads as query heads"
    if "attn_mask" in lowered:
        return f"{backend} takes no mask"
    if "got query.size(-1)" in lowered:
        return f"{backend}: head dim {why.split('Query.size(-1): ')[1].split(',')[0]}"
    return f"{backend}: {why[:60]}"


def compiled_lines(kv: KV) -> list[str]:
    """``--kv-compile``: per class the compiled step counted unfused and fused (the gated figure), kernels and graphs
    per step, and the timed points' compilation (seconds compiling, recompiles inside the timed steps)."""
    out = []
    for cache, t in kv.traffic.items():
        c = t.compiled
        if c is None:
            continue
        if c.error:
            out.append(f"compiled {cache} ({c.mode}): not counted: {c.error}")
            continue
        unfused = (f"{num(c.unfused.passes, '.3f')} passes = {tables.by_op(c.unfused.by_op)}" if c.unfused is not None
                   else MISSING)
        fused = c.fused
        fused_text = (f"{fused.passes:.3f} passes = {tables.by_op(fused.by_kernel)}"
                      if fused is not None and finite(fused.passes) is not None
                      else f"{MISSING} ({fused.error if fused is not None else 'no fused count'})")
        out.append(f"compiled {cache} ({c.mode}, runs as {c.runs_as}): counted unfused {unfused}; fused (gated) "
                   f"{fused_text}; {c.kernels_per_step} kernels and {c.graphs_per_step} graph(s) per step")
    points: dict[str, list[Any]] = {}
    for p in kv.points:
        if p.compiled is not None:
            points.setdefault(p.cache, []).append(p.compiled)
    for cache, infos in points.items():
        problems = sorted({i.problem for i in infos if i.problem})
        calls = sorted({i.graph_calls_per_step for i in infos}, key=lambda n: (n is None, n))
        out.append(f"compile {cache}: {sum(i.compile_s or 0 for i in infos):.1f} s compiling in untimed "
                   f"warm-ups (first point {num(infos[0].compile_s, '.1f')} s), "
                   f"{sum(i.graphs_compiled or 0 for i in infos)} graph(s) compiled; recompiles during timed "
                   f"steps {sum(i.recompiles or 0 for i in infos)}; compiled graph calls per step "
                   f"{', '.join(num(n, '.0f') for n in calls)}" + (f"; {'; '.join(problems)}" if problems else ""))
    return out


def attention_copies(m: Memory) -> str:
    """``" + 1.50 for the attention's own K/V copies"``: what the memory check adds to a class's declared factor
    where its attention implementation expands K/V (``kv.memory.<cache>.attention_factor``); "" where it does not."""
    return f", + {m.attention_factor:.2f} for the attention's own K/V copies" if m.attention_factor else ""


def peak_needs(m: Memory) -> str:
    """``"1.02 cache sizes"``: the cache sizes the step's peak needs, in the unit the declared factor counts (on a
    left-padded batch the allocated KV bytes: ``"0.80 cache sizes per allocated KV byte"``)."""
    per = m.per_allocated
    if per is not None and per.peak_factor is not None:
        return f"{num(per.peak_factor, '.2f')} cache sizes per allocated KV byte"
    return f"{num(m.peak_factor, '.2f')} cache sizes"


def memory_lines(kv: KV) -> list[str]:
    """Per class, counted memory (``kv.memory``): bytes a step allocates, its peak above what was live before it and
    the bytes live after it, each per KV byte (slopes, like passes), what allocates, and a declared ``memory_factor``
    the measured peak exceeds."""
    out = []
    for cache, m in kv.memory.items():
        per = m.per_allocated
        per_text = (f" (per allocated KV byte: allocated {num(per.allocated_passes, '.3f')}, peak "
                    f"{num(per.peak_passes, '.3f')}, held {num(per.held_passes, '.3f')})") if per else ""
        out.append(f"memory {cache}: allocated {num(m.allocated_passes, '.3f')}, peak {num(m.peak_passes, '.3f')}, "
                   f"held {num(m.held_passes, '.3f')} per KV byte{per_text}; allocates: "
                   f"{tables.by_op(m.allocated_by_op)}; peak needs {peak_needs(m)} (declares "
                   f"{num(m.declared_factor, 'g')}{attention_copies(m)})")
        if m.factor_problem:
            out.append(f"memory {cache}: MEMORY FACTOR TOO SMALL: {m.factor_problem}")
        if m.beyond is not None:
            out.append(f"memory {cache}: past every sliding window ({', '.join(map(str, m.beyond.contexts or []))}"
                       f" tokens) the bytes held grew by {num(m.beyond.held_growth_bytes, ',.0f')} B")
        if m.kinds is not None:
            kinds = "; ".join(f"{kind} ({k.layers} layers) allocated {num(k.allocated_passes, '.3f')}, "
                              f"held {num(k.held_passes, '.3f')}" for kind, k in m.kinds.items())
            out.append(f"memory {cache} per layer kind (per KV byte of that kind): {kinds}")
    return out


def unshown_measures() -> list[measure_table.Measure]:
    """The summarised measures no table above shows (:data:`SHOWN_APART`): one the table gained before any output of
    its own."""
    return [m for m in measure_table.selected("summarised") if m.name not in SHOWN_APART and not m.per_key]


def figure_table(kv: KV) -> tuple[list[str], list[list[str]]]:
    """The header and, per class, the figures of :func:`unshown_measures` that some class of ``kv`` has: one column
    each, a measure no class has left out."""
    caches = list(dict.fromkeys([*kv.traffic, *kv.fit, *kv.memory]))
    values = {m: [measure_table.value_of(kv, m, cache) for cache in caches] for m in unshown_measures()}
    shown = [m for m, column in values.items() if any(v is not None for v in column)]
    rows = [[cache, *(measure_table.figure_text(m, values[m][i]) for m in shown)] for i, cache in enumerate(caches)
            if any(values[m][i] is not None for m in shown)]
    return ["cache", *(m.label for m in shown)], rows


def noted_table(header: list[str], rows: list[list[str]], note: str) -> list[str]:
    """A blank line, the table and its note in brackets; nothing when there are no rows."""
    return ["", *tables.text(Table(header, rows)), f"  ({note})"] if rows else []


def lines(kv: KV) -> list[str]:
    """The summary printed at the end of a session, one line each (:func:`kvcache.analysing.tables.terminal_text`)."""
    env, model, settings, default = kv.environment, kv.model, kv.settings, identity.EXTRA_FIELDS
    out = [f"device {env.device_name}; transformers {env.transformers}, torch {env.torch}; "
           f"model {model.name} ({model.dtype}, {model.bytes_per_token} B/token of KV, {model.weight_bytes} B of "
           "weights)"]
    driver, batch = (default[name] if getattr(settings, name) is None else getattr(settings, name)
                     for name in ("driver", "batch"))
    if (driver, batch) != (default["driver"], default["batch"]):
        ragged = ", ragged (left-padded; passes per live KV byte)" if settings.ragged else ""
        out.append(f"driver {driver}; batch {batch}{ragged}")
    start, end = (kv.copy.start_gbps, kv.copy.end_gbps) if kv.copy else (None, None)
    out.append(f"copy bandwidth (read + write): start {num(start, '.1f')} GB/s, end {num(end, '.1f')} GB/s, "
               f"median of all {num(kv.copy_gbps, '.1f')} GB/s")
    if kv.verdict:
        out += noted_table(FIT_HEADER, fit_rows(kv), "effective GB/s = KV bytes per extra second of step time; passes "
                           "= copy GB/s / effective GB/s; counted = bytes read + written per KV byte, logical")
    out += poor_fit_lines(kv)
    out += crossover_lines(kv.crossovers)
    out += drift_line(kv.drift)
    for cache, t in kv.traffic.items():
        ragged = finite(t.allocated_passes) is not None and t.batch is not None and t.batch.ragged
        per_allocated = f" ({t.allocated_passes:.3f} per allocated KV byte)" if ragged else ""
        out.append(f"counted {cache}: {num(t.passes, '.3f')} passes{per_allocated} = {tables.by_op(t.by_op)}")
        out += counted_notes(cache, t)
    out += decoding.summary_lines(kv.traffic, kv.memory)
    backends = backend_lines(kv)
    if backends:
        out += [BACKENDS_NOTE, *backends]
    out += memory_lines(kv)
    out += noted_table(OVERHEAD_HEADER, overhead_rows(kv),
                       "ops: ATen ops from the model's forward call to its return, one step; fixed: bytes a step moves "
                       "that do not grow with context; weight passes = fixed / weight bytes, 1 = each weight read once")
    out += noted_table(LEDGER_HEADER, ledger_table_rows(kv),
                       "ledger: each op's time per profiled step against KV bytes, as passes; unattributed = the "
                       "step's time outside ATen ops; the profiled step is timed op by op (CPU: a dispatch-mode clock; "
                       "CUDA: torch.profiler), apart from the timed rounds; the plain step: steps between the "
                       "profiled ones, no instrument")
    out += noted_table(*figure_table(kv), "figures of the measure table, in their units")
    out += instrument_lines(kv)
    out += [f"ledger {cache}: {error}" for cache, error in kv.ledger_errors.items()]
    out += compiled_lines(kv)
    out += [f"probe {cache}: q {p.query} k {p.key} mask {p.mask}; {p.attention}; K/V expansions {p.expansions}"
            for cache, p in kv.probe.items()]
    out += noted_table(POINT_HEADER, point_rows(kv),
                       "achieved = counted bytes of the whole step / median step time; of copy = its share of the copy"
                       " bandwidth")
    out += [f"skipped {s.cache}{f' at {s.context}' if s.context else ''}: {s.reason}" for s in kv.skipped]
    measured = table_verdicts(kv)
    if measured:
        table, notes = verdict_table(measured)
        out += ["", *tables.text(table), *(f"  {note}" for note in notes.lines())]
    return [tables.terminal_text(line) for line in out]  # a run's strings shown, never obeyed by the terminal
