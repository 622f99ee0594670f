"""Benchmark JSON for tests of the analysing wing: a real recorded run, and synthetic runs whose truth is known.

- :func:`recorded_run`: a real ``pytest benchmarks`` run on ``tiny`` (``tests/data/tiny-run.json``; how it was
  made is in ``tests/data/README.md``), its ``kv`` section computed afresh by the real session-end analysis from
  the run's own records. Use it wherever a test is about what the plugin writes (report, compare).
- :func:`make_run`: a synthetic run in the plugin's layout (this schema, :data:`kvcache.analysing.records.SCHEMA`)
  whose step times come from a known line, step = intercept + passes * kv_bytes / copy_bandwidth (+ noise), so the
  true passes of every class is known by construction. Its ``kv.fit`` is that known line, written down, not
  computed; :func:`analysed` computes it. ``kv.points`` is left out unless asked for (``points=True``): when present
  it, not ``benchmarks``, is what a run's points are read from, and tests drop points by editing ``benchmarks``.
- :func:`schema_2`, :func:`schema_1`: a run as the plugin of an older schema wrote it, for the tests that files of
  every schema still load.

Nothing here imports torch: the analysing wing's tests run where torch is not installed.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from statistics import median
from typing import Any

from kvcache.analysing import analysis, bandwidth
from kvcache.analysing.judge import judges
from kvcache.analysing.records import KV, SCHEMA, Environment, RunSettings

BYTES_PER_TOKEN = 23_040
WEIGHT_BYTES = 269_030_016
DATA = Path(__file__).resolve().parent / "data"
RECORDED_RUN = DATA / "tiny-run.json"
NATIVE_GQA = "native gqa (enable_gqa)"  # the probe's word for attention reading 3 KV heads for 9 query heads
PLANTED_OP = "clone"  # the op a planted extra copy shows as (what the twin-planted class counts)


def make_run(
    caches: dict[str, float] | None = None,
    counted: dict[str, float] | None = None,
    *,
    contexts: tuple[int, ...] = (512, 1024, 2048, 4096, 8192),
    rounds: int = 1,
    steps: int = 20,
    copy_gbps: float = 20.0,
    intercept_ms: float = 30.0,
    noise: float = 0.01,
    transformers: str = "5.24.0",
    device_name: str = "cpu: test machine",
    device_type: str = "cpu",
    seed: int = 0,
    points: bool = False,
    memory: bool = False,
) -> dict[str, Any]:
    """A run dict; ``caches`` maps class -> true timed passes, ``counted`` class -> counted passes; ``memory``: with
    counted memory (``kv.memory``) for every counted class, as the plugin writes it."""
    from kvcache.analysing.records import identity
    from kvcache.analysing.settings import Settings

    caches = {"dynamic": 3.0, "static": 1.0} if caches is None else caches
    counted = dict(caches) if counted is None else counted
    rng = random.Random(seed)
    benchmarks = []
    for r in range(rounds):
        for cache, passes in caches.items():
            for ctx in contexts:
                kv_bytes = BYTES_PER_TOKEN * ctx
                true_s = intercept_ms / 1e3 + passes * kv_bytes / (copy_gbps * 1e9)
                data = [true_s * (1 + rng.gauss(0, noise)) for _ in range(steps)]
                benchmarks.append(_benchmark(cache, ctx, r, data, kv_bytes, counted.get(cache, 0) * kv_bytes, copy_gbps,
                                             transformers=transformers, device_type=device_type,
                                             device_name=device_name, steps=steps))
    fit = {
        cache: {
            "intercept_ms": intercept_ms,
            "effective_gbps": copy_gbps / passes,
            "passes": passes,
            "passes_ci": [passes * 0.95, passes * 1.05],
            "r2": 0.99,
            "n_points": len(contexts) * rounds,
            "contexts": list(contexts),
        }
        for cache, passes in caches.items()
    }
    traffic = {cache: _traffic(passes) for cache, passes in counted.items()}
    settings = Settings(model="smollm2-135m", device=device_type, caches=tuple(caches), contexts=tuple(contexts),
                        rounds=rounds, steps=steps)
    settings = identity.recorded_settings(settings).to_json()
    environment = {"device_type": device_type, "device_name": device_name, "transformers": transformers,
                   "torch": "2.13.0+cpu", "python": "3.11.7", "platform": "Linux", "threads": 2}
    kv = {
        "schema": SCHEMA,
        "settings": settings,
        "environment": environment,
        "model": {"name": "smollm2-135m", "layers": 30, "heads": 9, "kv_heads": 3, "head_dim": 64,
                  "hidden": 576, "vocab": 49152, "max_position_embeddings": 8192, "dtype": "bfloat16",
                  "bytes_per_token": BYTES_PER_TOKEN, "weight_bytes": WEIGHT_BYTES, "parameters": WEIGHT_BYTES // 2},
        "copy_gbps": copy_gbps,
        "copy": {"start_gbps": copy_gbps, "end_gbps": copy_gbps,
                 "measurements": [{"label": label, "gbps": copy_gbps, "nbytes": 1 << 30,
                                   "samples_gbps": [copy_gbps] * 5} for label in ("start", "end")]},
        "fit": fit,
        "drift": {"cache": next(iter(caches), None), "context": contexts[0], "first_ms": intercept_ms,
                  "last_ms": intercept_ms, "fraction": 0.0, "max_fraction": 0.1, "ok": True,
                  "effect": "none: within the limit"},
        "traffic": traffic,
        "memory": {cache: _memory(passes) for cache, passes in counted.items()} if memory else {},
        "probe": {cache: {"query": [1, 9, 1, 64], "key": [1, 3, 1024, 64], "value": [1, 3, 1024, 64],
                          "mask": None, "enable_gqa": True, "attention": NATIVE_GQA, "expansions": 0, "calls": 30,
                          "modes": {NATIVE_GQA: 30}}
                  for cache in caches},
        "skipped": [],
        "session": {"interrupted": False, "exit": "ok", "failed": []},
        "ledger": {}, "ledger_points": [], "ledger_errors": {}, "speed": None,
    }
    kv["identity"] = identity.of(Environment.from_json(environment), RunSettings.from_json(settings)).to_json()
    record = KV.from_json(kv)
    kv["crossovers"] = bandwidth.crossovers(record.model, record.fit, record.traffic, {}).to_json()
    record.verdict = analysis.run_verdicts(record, None)  # the real judge of this fit and traffic, against no baseline
    kv["verdict"] = record.to_json()["verdict"]
    if points:
        kv["points"] = [points_entry(b, copy_gbps) for b in benchmarks]
    return {"machine_info": {"node": "test", "cpu": {"brand_raw": "test cpu"}}, "commit_info": {},
            "benchmarks": benchmarks, "datetime": "2026-11-29T00:00:00", "version": "5.3.1", "kv": kv}


def _benchmark(cache: str, ctx: int, r: int, data: list[float], kv_bytes: float, counted_bytes: float,
               copy_gbps: float, *, transformers: str, device_type: str, device_name: str, steps: int) -> dict:
    """One timed benchmark entry as pytest-benchmark writes it, with the plugin's ``extra_info``."""
    data_sorted = sorted(data)
    med = data_sorted[len(data) // 2]
    achieved = counted_bytes / med / 1e9 if counted_bytes else None
    return {
        "group": f"decode {cache}",
        "name": f"test_decode[{cache}-{ctx}-r{r}]",
        "fullname": f"benchmarks/test_decode.py::test_decode[{cache}-{ctx}-r{r}]",
        "params": {"cache": cache, "context": ctx, "round": r, "attention": "sdpa"},
        "param": f"{cache}-{ctx}-r{r}",
        "extra_info": {
            "kind": "timed", "cache": cache, "context": ctx, "round": r, "kv_bytes": kv_bytes,
            "bytes_per_token": BYTES_PER_TOKEN, "driver": "loop", "batch": 1, "ragged": False,
            "device": device_type, "device_name": device_name, "dtype": "bfloat16", "model": "smollm2-135m",
            "fill": "synthetic", "warmup": 5, "steps": steps,
            "transformers": transformers, "torch": "2.13.0+cpu", "beyond_trained_context": ctx > 8192,
            "step_start_ns": [1_000_000 * i for i in range(steps)], "counted_bytes": counted_bytes,
            "achieved_gbps": achieved,
        },
        "options": {},
        "stats": {"min": data_sorted[0], "max": data_sorted[-1], "mean": sum(data) / len(data), "median": med,
                  "rounds": steps, "data": data},
    }


def _memory(passes: float) -> dict[str, Any]:
    """``kv.memory.<cache>`` of a class with ``passes`` counted passes: it holds its K/V once, and allocates what it
    copies (a DynamicCache's ``cat``: passes - 1 over read + write) one layer at a time (30 layers)."""
    allocated = max(passes - 1.0, 0.0) / 2
    return {"allocated_passes": allocated, "peak_passes": allocated / 60, "held_passes": 1.0,
            "peak_factor": 1.0 + allocated / 60, "allocated_by_op": {"cat": allocated} if allocated else {},
            "peak_by_op": {}, "contexts": [256, 512], "source": "storages", "declared_factor": 2.0}


def _traffic(passes: float) -> dict[str, Any]:
    """``kv.traffic.<cache>`` of a class counting ``passes``: attention reads the cache once, ``cat`` the rest."""
    by_op = {"cat": passes - 1, "scaled_dot_product_attention": 1.0} if passes > 1 else \
        {"scaled_dot_product_attention": passes}
    per_token = {256: 256 * BYTES_PER_TOKEN * passes, 512: 512 * BYTES_PER_TOKEN * passes}
    fixed = int(WEIGHT_BYTES * 1.01)
    return {"passes": passes, "by_op": by_op, "contexts": [256, 512], "bytes_per_token": BYTES_PER_TOKEN,
            "step_bytes": {str(c): {"read": int(b / 2) + fixed, "written": int(b / 2)} for c, b in per_token.items()},
            "calls": {op: 30 for op in by_op}, "ops_per_step": 1680, "data_ops_per_step": 1290,
            "host_syncs_per_step": 0, "host_syncs": {},
            "fixed_bytes": fixed, "weight_bytes": WEIGHT_BYTES, "weight_passes": fixed / WEIGHT_BYTES, "layers": 30,
            "kv_bytes": {str(c): (c + 3) * BYTES_PER_TOKEN for c in per_token},
            "stored_bytes": {str(c): (c + 3) * BYTES_PER_TOKEN for c in per_token}, "stored_passes": passes}


def points_entry(bench: dict[str, Any], copy_gbps: float) -> dict[str, Any]:
    """``kv.points`` entry of a timed benchmark (what the plugin writes there from the same step times)."""
    info, data = bench["extra_info"], bench["stats"]["data"]
    return {"cache": info["cache"], "context": info["context"], "round": info["round"], "median_ms": median(data) * 1e3,
            "samples_ms": [s * 1e3 for s in data], "kv_bytes": info["kv_bytes"], "counted_bytes": info["counted_bytes"],
            "achieved_gbps": info["achieved_gbps"],
            "achieved_fraction": bandwidth.achieved_fraction(info["achieved_gbps"], copy_gbps),
            "beyond_trained_context": info["beyond_trained_context"], "name": bench["name"]}


def write_run(path: Path, run: dict[str, Any]) -> Path:
    path.write_text(json.dumps(run, indent=1))
    return path


def without(run: dict[str, Any], *keys: str) -> dict[str, Any]:
    """A deep copy of ``run`` with the named ``kv`` keys removed (a run missing parts)."""
    out = copy.deepcopy(run)
    for key in keys:
        out["kv"].pop(key, None)
    return out


# --- the real analysis of a run's own records ----------------------------------------------------------------

def records_of(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The records a session would have produced for ``run``, as the objects that travel to the controller
    (:func:`kvcache.analysing.records.measured.to_wire`): its context, copy measurements, timed and drift points (every
    step's seconds: from ``kv.points`` where the run has them, the suite's own timing, else from pytest-benchmark's
    ``stats.data``), traffic, skips, the ledger's profiled steps and failed classes."""
    kv = run["kv"]
    records: list[dict[str, Any]] = [{"type": "context", "model": kv.get("model") or {},
                                      "environment": kv.get("environment") or {}}]
    records += [{"type": "copy", **m} for m in (kv.get("copy") or {}).get("measurements", [])]
    own = {(p["cache"], p["context"], p["round"]): p["samples_ms"] for p in kv.get("points") or []}
    for bench in run["benchmarks"]:
        info = bench["extra_info"]
        if info.get("kind") not in ("timed", "drift"):
            continue
        samples_ms = own.get((info["cache"], info["context"], info["round"])) if info["kind"] == "timed" else None
        samples_s = [s / 1e3 for s in samples_ms] if samples_ms else list(bench["stats"]["data"])
        records.append({"type": "point", **info, "samples_s": samples_s, "name": bench["name"]})
    probes = kv.get("probe") or {}
    memory = kv.get("memory") or {}
    records += [{"type": "traffic", "cache": c, "traffic": t, "probe": probes.get(c),
                 **({"memory": memory[c]} if c in memory else {})}
                for c, t in (kv.get("traffic") or {}).items()]
    records += [{"type": "skip", **s} for s in kv.get("skipped") or []]
    records += [{"type": "ledger", **p} for p in kv.get("ledger_points") or []]
    records += [{"type": "failed", "cache": c} for c in (kv.get("session") or {}).get("failed", [])]
    return records


def analysed(run: dict[str, Any], *, resamples: int | None = 200, baseline: dict[str, Any] | None = None) -> \
        dict[str, Any]:
    """``run`` with its ``kv`` section computed afresh from its records (:func:`records_of`) by the session-end
    analysis, as the plugin would write it: fits, drift, verdicts and points from the data, not a made-up
    ``kv.fit``. ``resamples`` (bootstrap resamples; None keeps the run's own setting) and ``baseline`` (a
    baseline file's contents; none by default) are the analysis's."""
    from kvcache.analysing.analysis import analyse
    from kvcache.analysing.records import RunSettings
    from kvcache.analysing.records.file_formats import BaselineFile
    from kvcache.analysing.records.identity import recorded_settings
    from kvcache.analysing.records.measured import from_wire
    from kvcache.analysing.settings import Settings

    kv = run["kv"]
    settings = {**recorded_settings(Settings()).to_json(), **(kv.get("settings") or {})}
    if resamples is not None:
        settings["resamples"] = resamples
    session = {k: v for k, v in (kv.get("session") or {"interrupted": False, "exit": "ok"}).items() if k != "failed"}
    out = copy.deepcopy(run)
    records = [from_wire(json.dumps(message)) for message in records_of(run)]  # as the transport delivers them
    if baseline is not None and not isinstance(baseline, BaselineFile):
        baseline = BaselineFile.from_json(baseline, "baseline")
    out["kv"] = analyse(records, RunSettings.from_json(settings, "kv.settings"), baseline or None, session).to_json()
    return out


def recorded_run(*, transformers: str | None = None, device_name: str | None = None,
                 counted: dict[str, float] | None = None, resamples: int | None = None,
                 baseline: dict[str, Any] | None = None) -> dict[str, Any]:
    """The recorded real run (``tests/data/tiny-run.json``: classes dynamic and static, contexts 512, 2048 and
    8192, 2 rounds of 5 steps) re-analysed by the real analysis (:func:`analysed`; ``resamples`` None: the run's
    own 2000).

    To make a second run that differs in one known way: ``transformers`` and ``device_name`` relabel the run;
    ``counted`` (class -> counted passes) plants a change in counted traffic, a rise as an extra ``clone`` op
    (what a planted copy counts as), a fall as every op scaled down.
    """
    run = json.loads(RECORDED_RUN.read_text())
    kv = run["kv"]
    if transformers is not None:
        kv["environment"]["transformers"] = transformers
        for bench in run["benchmarks"]:
            bench["extra_info"]["transformers"] = transformers
    if device_name is not None:
        kv["environment"]["device_name"] = device_name
        for bench in run["benchmarks"]:
            bench["extra_info"]["device_name"] = device_name
        run["machine_info"].setdefault("kv_environment", {})["device_name"] = device_name
    for cache, passes in (counted or {}).items():
        kv["traffic"][cache] = planted(kv["traffic"][cache], passes)
    return analysed(run, resamples=resamples, baseline=baseline)


def planted(traffic: dict[str, Any], passes: float) -> dict[str, Any]:
    """``kv.traffic.<cache>`` changed to count ``passes``: a rise shows as an extra ``clone`` op, a fall as every
    op scaled down; passes per stored byte change in proportion."""
    out = copy.deepcopy(traffic)
    rise = passes - traffic["passes"]
    if rise > 0:
        out["by_op"][PLANTED_OP] = round(out["by_op"].get(PLANTED_OP, 0.0) + rise, 4)
    else:
        out["by_op"] = {op: round(value * passes / traffic["passes"], 4) for op, value in out["by_op"].items()}
    out["passes"] = passes
    if isinstance(traffic.get("stored_passes"), (int, float)):  # the same bytes moved, per byte stored too
        out["stored_passes"] = traffic["stored_passes"] * passes / traffic["passes"]
    return out


def schema_2(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` as a file written by the plugin of schema 2: a ledger verdict's parts keyed by a label that says a new
    op (``"clone (new)"``) or a renamed one (``"concat (was cat)"``), instead of by the op with ``new`` / ``was``."""
    out = copy.deepcopy(run)
    kv = out["kv"]
    kv["schema"] = 2
    for measures in kv.get("verdict", {}).values():
        ledger = measures.get("ledger")
        if not isinstance(ledger, dict) or not isinstance(ledger.get("parts"), dict):
            continue
        parts = {}
        for op, part in ledger["parts"].items():
            part = dict(part)
            new, was = part.pop("new", False), part.pop("was", None)
            parts[f"{op} (new)" if new else f"{op} (was {was})" if was else op] = part
        ledger["parts"] = parts
    return out


def schema_1(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` as a file written by the plugin of schema 1: one combined verdict per class with its measures
    (``measured`` for ``value``), and none of the sections schema 2 added."""
    out = schema_2(run)
    kv = out["kv"]
    for key in ("identity", "session", "points", "crossovers"):
        kv.pop(key, None)
    kv["schema"] = 1
    for cache, measures in kv["verdict"].items():
        old = {m: {"status": v["status"], "reason": v["reason"], "measured": v.get("value"),
                   "allowed": v.get("allowed")} for m, v in measures.items()}
        status = max((v["status"] for v in old.values()), key=lambda s: judges.PRIORITY[s])
        kv["verdict"][cache] = {"status": status, "reason": "; ".join(v["reason"] for v in old.values()), **old}
    return out
