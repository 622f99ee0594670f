"""The terminal summary of a run's ``kv`` section: plain-text tables (analysing wing, no torch)."""

from __future__ import annotations

from typing import Any

from kvcache.analysing import identity, tables
from kvcache.analysing.gate import status_of
from kvcache.analysing.stats import median
from kvcache.analysing.tables import Table, num

FIT_HEADER = ["cache", "intercept ms [CI]", "eff GB/s", "timed passes [CI]", "R²", "counted", "timed/counted",
              "crossover tok", "timed verdict", "intercept verdict", "counted verdict"]
OVERHEAD_HEADER = ["cache", "ops/step", "data ops/step", "ops/layer", "fixed MB", "weight passes", "overhead verdict"]
POINT_HEADER = ["cache", "context", "rounds", "median ms", "achieved GB/s", "of copy"]
LEDGER_HEADER = ["cache", "op", "counted", "timed [CI]", "ms/step at largest context", "ledger verdict"]


def measured_verdicts(kv: dict[str, Any]) -> dict[str, Any]:
    """Verdicts of the classes that were measured at all (skipped classes are listed as skips)."""
    return {c: v for c, v in kv.get("verdict", {}).items() if status_of(v) != "not-measured"}


def fit_rows(kv: dict[str, Any]) -> list[list[str]]:
    rows = []
    measured = measured_verdicts(kv)
    failed = [c for c, f in (kv.get("fit") or {}).items() if (f or {}).get("error") and c not in measured]
    for cache in [*measured, *failed]:  # a class whose fit failed is listed with why, whatever its verdict
        verdict = measured.get(cache) or {}
        fit = kv.get("fit", {}).get(cache) or {}
        counted = (kv.get("traffic", {}).get(cache) or {}).get("passes")
        timed = fit.get("passes")
        ci = fit.get("passes_ci")
        timed_text = "-" if timed is None else num(timed) + (f" [{num(ci[0])}, {num(ci[1])}]" if ci else "")
        if fit.get("error"):
            timed_text = f"- ({fit['error']})"
        intercept, ici = fit.get("intercept_ms"), fit.get("intercept_ci")
        intercept_text = num(intercept) + (f" [{ici[0]:.2f}, {ici[1]:.2f}]" if intercept is not None and ici
                                            and None not in ici else "")
        rows.append([
            cache, intercept_text, num(fit.get("effective_gbps"), ".1f"), timed_text,
            num(fit.get("r2"), ".3f"), num(counted), num(timed / counted if timed and counted else None),
            num(fit.get("crossover_tokens"), ",.0f"), *(
                (verdict.get(m) or {}).get("status", "-") for m in ("timed", "intercept", "counted")),
        ])
    return rows


def overhead_rows(kv: dict[str, Any]) -> list[list[str]]:
    """Counted overhead per class: ATen ops per step (all, and those moving data), per layer, fixed bytes (MB =
    1e6 bytes, read + written, not growing with context) and weight passes, with the overhead verdict."""
    rows = []
    for cache, t in (kv.get("traffic") or {}).items():
        ops, layers = t.get("ops_per_step"), t.get("layers")
        if ops is None:
            continue
        fixed = t.get("fixed_bytes")
        fixed_mb = fixed / 1e6 if fixed is not None else None
        rows.append([cache, str(ops), num(t.get("data_ops_per_step"), ".0f"),
                     num(ops / layers if layers else None, ".1f"), num(fixed_mb, ".1f"),
                     num(t.get("weight_passes"), ".3f"),
                     ((kv.get("verdict") or {}).get(cache, {}).get("overhead") or {}).get("status", "-")])
    return rows


def ledger_rows(kv: dict[str, Any]) -> list[list[str]]:
    """Per class and op of the ledger: counted passes (from ``kv.traffic``), timed passes with their interval,
    ms per step at the largest profiled context, and the op's part of the ledger verdict."""
    rows = []
    for cache, ops in (kv.get("ledger") or {}).items():
        by_op = (kv.get("traffic", {}).get(cache) or {}).get("by_op") or {}
        parts = (((kv.get("verdict") or {}).get(cache) or {}).get("ledger") or {}).get("parts") or {}
        for op, row in ops.items():
            ci = row.get("timed_ci") or [None, None]
            timed = num(row.get("timed")) + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if None not in ci else "")
            part = next((p for label, p in parts.items() if label.split(" (")[0] == op), {})
            rows.append([cache, op, num(by_op.get(op)), timed, num(row.get("ms")), part.get("status", "-")])
    return rows


def point_rows(kv: dict[str, Any]) -> list[list[str]]:
    """Per (cache, context): median over rounds of the median step and of the achieved bandwidth."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for p in kv.get("points", []):
        groups.setdefault((p["cache"], p["context"]), []).append(p)
    rows = []
    for (cache, context), pts in sorted(groups.items()):
        achieved = [p["achieved_gbps"] for p in pts if p.get("achieved_gbps")]
        fraction = [p["achieved_fraction"] for p in pts if p.get("achieved_fraction")]
        flag = " (beyond trained context)" if pts[0].get("beyond_trained_context") else ""
        rows.append([cache, f"{context}{flag}", str(len(pts)), num(median([p["median_ms"] for p in pts])),
                     num(median(achieved) if achieved else None, ".1f"),
                     num(100 * median(fraction), ".0f") + "%" if fraction else "-"])
    return rows


def crossover_lines(crossovers: dict[str, Any]) -> list[str]:
    """``kv.crossovers`` in words, contexts in tokens: where the cache holds as many bytes as the weights, and
    per class where a step's cache traffic (from the timed and the counted passes) equals one read of the weights."""
    if not crossovers:
        return []
    out = [f"crossover: the cache holds as many bytes as the weights at "
           f"{num(crossovers.get('cache_holds_weights_tokens'), ',.0f')} tokens"]
    out += [f"crossover {cache}: a step's cache traffic equals one read of the weights at "
            f"{num(c.get('timed_tokens'), ',.0f')} tokens timed, {num(c.get('counted_tokens'), ',.0f')} counted"
            + (f"; the bytes it holds (measured) equal the weights at {num(c.get('held_tokens'), ',.0f')} tokens"
               if "held_tokens" in c else "")
            for cache, c in crossovers.items() if isinstance(c, dict)]
    return out


def compiled_lines(kv: dict[str, Any]) -> list[str]:
    """``--kv-compile``: per class the compiled step counted unfused and fused (the gated figure), kernels and graphs
    per step, and the timed points' compilation (seconds compiling, recompiles inside the timed steps)."""
    out = []
    for cache, t in (kv.get("traffic") or {}).items():
        c = (t or {}).get("compiled")
        if not isinstance(c, dict):
            continue
        if c.get("error"):
            out.append(f"compiled {cache} ({c.get('mode')}): not counted: {c['error']}")
            continue
        unfused, fused = c.get("unfused") or {}, c.get("fused") or {}
        by_op = ", ".join(f"{k} {v:.2f}" for k, v in (unfused.get("by_op") or {}).items()) or "-"
        by_kernel = ", ".join(f"{k} {v:.2f}" for k, v in (fused.get("by_kernel") or {}).items()) or "-"
        fused_text = f"{fused['passes']:.3f} passes = {by_kernel}" if fused.get("passes") is not None else \
            f"- ({fused.get('error')})"
        out.append(f"compiled {cache} ({c.get('mode')}, runs as {c.get('runs_as')}): counted unfused "
                   f"{num(unfused.get('passes'), '.3f')} passes = {by_op}; fused (gated) {fused_text}; "
                   f"{c.get('kernels_per_step')} kernels and {c.get('graphs_per_step')} graph(s) per step")
    points: dict[str, list[dict[str, Any]]] = {}
    for p in kv.get("points") or []:
        if isinstance(p.get("compiled"), dict):
            points.setdefault(p["cache"], []).append(p["compiled"])
    for cache, infos in points.items():
        problems = sorted({i["problem"] for i in infos if i.get("problem")})
        calls = sorted({i.get("graph_calls_per_step") for i in infos})
        out.append(f"compile {cache}: {sum(i.get('compile_s') or 0 for i in infos):.1f} s compiling in untimed "
                   f"warm-ups (first point {num(infos[0].get('compile_s'), '.1f')} s), "
                   f"{sum(i.get('graphs_compiled') or 0 for i in infos)} graph(s) compiled; recompiles during timed "
                   f"steps {sum(i.get('recompiles') or 0 for i in infos)}; compiled graph calls per step "
                   f"{', '.join(num(c, '.0f') for c in calls)}" + (f"; {'; '.join(problems)}" if problems else ""))
    return out


def memory_lines(kv: dict[str, Any]) -> list[str]:
    """Per class, counted memory (``kv.memory``): bytes a step allocates, its peak above what was live before it and
    the bytes live after it, each per KV byte (slopes, like passes), what allocates, and a declared ``memory_factor``
    the measured peak exceeds."""
    out = []
    for cache, m in (kv.get("memory") or {}).items():
        if not isinstance(m, dict):
            continue
        by_op = ", ".join(f"{k} {v:.2f}" for k, v in (m.get("allocated_by_op") or {}).items()) or "-"
        per = m.get("per_allocated") or {}
        per_text = (f" (per allocated KV byte: allocated {num(per.get('allocated_passes'), '.3f')}, peak "
                    f"{num(per.get('peak_passes'), '.3f')}, held {num(per.get('held_passes'), '.3f')})") if per else ""
        verdict = ((kv.get("verdict") or {}).get(cache) or {}).get("memory") or {}
        status = f"; {verdict['status']}" if verdict.get("status") else ""
        out.append(f"memory {cache}: allocated {num(m.get('allocated_passes'), '.3f')}, peak "
                   f"{num(m.get('peak_passes'), '.3f')}, held {num(m.get('held_passes'), '.3f')} per KV byte"
                   f"{per_text}; allocates: {by_op}; peak needs {num(m.get('peak_factor'), '.2f')} cache sizes "
                   f"(declares {num(m.get('declared_factor'), 'g')}){status}")
        if m.get("factor_problem"):
            out.append(f"memory {cache}: MEMORY FACTOR TOO SMALL: {m['factor_problem']}")
        beyond = m.get("beyond")
        if isinstance(beyond, dict):
            out.append(f"memory {cache}: past every sliding window ({', '.join(map(str, beyond.get('contexts', [])))} "
                       f"tokens) the bytes held grew by {num(beyond.get('held_growth_bytes'), ',.0f')} B")
    return out


def noted_table(header: list[str], rows: list[list[str]], note: str) -> list[str]:
    """A blank line, the table and its note in brackets; nothing when there are no rows."""
    return ["", *tables.text(Table(header, rows)), f"  ({note})"] if rows else []


def lines(kv: dict[str, Any]) -> list[str]:
    """The summary printed at the end of a session."""
    env, model, copy = kv.get("environment", {}), kv.get("model") or {}, kv.get("copy", {})
    out = [f"device {env.get('device_name')}; transformers {env.get('transformers')}, torch {env.get('torch')}; "
           f"model {model.get('name')} ({model.get('dtype')}, {model.get('bytes_per_token')} B/token of KV, "
           f"{model.get('weight_bytes')} B of weights)"]
    settings, default = kv.get("settings") or {}, identity.EXTRA_FIELDS
    driver, batch = (settings.get(name, default[name]) for name in ("driver", "batch"))
    if (driver, batch) != (default["driver"], default["batch"]):
        ragged = ", ragged (left-padded; passes per live KV byte)" if settings.get("ragged") else ""
        out.append(f"driver {driver}; batch {batch}{ragged}")
    out.append(f"copy bandwidth (read + write): start {num(copy.get('start_gbps'), '.1f')} GB/s, "
               f"end {num(copy.get('end_gbps'), '.1f')} GB/s, median of all {num(kv.get('copy_gbps'), '.1f')} GB/s")
    if kv.get("verdict"):
        out.append("")
        out += tables.text(Table(FIT_HEADER, fit_rows(kv)))
        out.append("  (effective GB/s = KV bytes per extra second of step time; passes = copy GB/s / effective GB/s;"
                   " counted = bytes read + written per KV byte, logical)")
    out += crossover_lines(kv.get("crossovers") or {})
    drift = kv.get("drift") or {}
    if "fraction" in drift:
        state = "ok" if drift["ok"] else "TOO LARGE: timed verdicts are inconclusive"
        out.append(f"drift: {drift['cache']} at {drift['context']} tokens {drift['first_ms']:.2f} -> "
                   f"{drift['last_ms']:.2f} ms ({drift['fraction']:+.1%}, allowed ±{drift['max_fraction']:.0%}): "
                   f"{state}")
    elif drift:
        out.append(f"drift: not checked ({drift.get('reason')})")
    for cache, t in (kv.get("traffic") or {}).items():
        by_op = ", ".join(f"{k} {v:.2f}" for k, v in (t.get("by_op") or {}).items()) or "-"
        allocated = t.get("allocated_passes")
        per_allocated = f" ({allocated:.3f} per allocated KV byte)" if isinstance(allocated, (int, float)) and \
            t.get("batch", {}).get("ragged") else ""
        out.append(f"counted {cache}: {num(t.get('passes'), '.3f')} passes{per_allocated} = {by_op}")
    out += memory_lines(kv)
    out += noted_table(OVERHEAD_HEADER, overhead_rows(kv),
                       "ops: ATen ops from the model's forward call to its return, one step; fixed: bytes a step moves "
                       "that do not grow with context; weight passes = fixed / weight bytes, 1 = each weight read once")
    out += noted_table(LEDGER_HEADER, ledger_rows(kv),
                       "ledger: each op's time per profiled step against KV bytes, as passes; unattributed = the "
                       "step's time outside ATen ops; the profiled step runs under torch.profiler, apart from the "
                       "timed rounds")
    for cache, error in (kv.get("ledger_errors") or {}).items():
        out.append(f"ledger {cache}: {error}")
    out += compiled_lines(kv)
    for cache, p in (kv.get("probe") or {}).items():
        out.append(f"probe {cache}: q {p.get('query')} k {p.get('key')} mask {p.get('mask')}; "
                   f"{p.get('attention')}; K/V expansions {p.get('expansions')}")
    out += noted_table(POINT_HEADER, point_rows(kv),
                       "achieved = counted bytes of the whole step / median step time; of copy = its share of the copy"
                       " bandwidth")
    for s in kv.get("skipped", []):
        where = f" at {s['context']}" if s.get("context") else ""
        out.append(f"skipped {s['cache']}{where}: {s['reason']}")
    for cache, verdict in measured_verdicts(kv).items():
        for measure, v in verdict.items():
            if v.get("status") != "not-measured":
                out.append(f"verdict {cache} {measure}: {v.get('status')}: {v.get('reason')}")
    return out
