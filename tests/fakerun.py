"""Synthetic benchmark JSON in the exact shape the plugin writes, for tests of the analysing wing.

Latencies come from a known line: step = intercept + passes * kv_bytes / copy_bandwidth (+ noise),
so the true passes of every cache class is known by construction.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

BYTES_PER_TOKEN = 23_040
WEIGHT_BYTES = 269_030_016


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
) -> dict[str, Any]:
    """A run dict; ``caches`` maps class -> true timed passes, ``counted`` class -> counted passes."""
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
                data_sorted = sorted(data)
                med = data_sorted[len(data) // 2]
                benchmarks.append(
                    {
                        "group": f"decode {cache}",
                        "name": f"test_decode[{cache}-{ctx}-r{r}]",
                        "fullname": f"benchmarks/test_decode.py::test_decode[{cache}-{ctx}-r{r}]",
                        "params": {"cache": cache, "context": ctx, "round": r},
                        "param": f"{cache}-{ctx}-r{r}",
                        "extra_info": {
                            "kind": "timed",
                            "cache": cache,
                            "context": ctx,
                            "round": r,
                            "kv_bytes": kv_bytes,
                            "bytes_per_token": BYTES_PER_TOKEN,
                            "device": device_type,
                            "dtype": "bfloat16",
                            "transformers": transformers,
                            "torch": "2.13.0+cpu",
                            "beyond_trained_context": ctx > 8192,
                            "step_start_ns": [1_000_000 * i for i in range(steps)],
                            "counted_bytes": counted.get(cache, 0) * kv_bytes,
                        },
                        "options": {},
                        "stats": {
                            "min": data_sorted[0],
                            "max": data_sorted[-1],
                            "mean": sum(data) / len(data),
                            "median": med,
                            "rounds": steps,
                            "data": data,
                        },
                    }
                )
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
    traffic = {
        cache: {
            "passes": passes,
            "by_op": {"aten.cat": passes - 1, "aten._scaled_dot_product_flash_attention_for_cpu": 1.0}
            if passes > 1
            else {"aten._scaled_dot_product_flash_attention_for_cpu": passes},
            "contexts": [256, 512],
            "bytes_per_token": BYTES_PER_TOKEN,
        }
        for cache, passes in counted.items()
    }
    kv = {
        "schema": 1,
        "settings": {"model": "smollm2-135m", "device": device_type, "dtype": "bfloat16", "rounds": rounds,
                     "steps": steps, "contexts": list(contexts), "caches": list(caches), "min_r2": 0.9},
        "environment": {"device_name": device_name, "device_type": device_type, "transformers": transformers,
                        "torch": "2.13.0+cpu", "python": "3.11.7", "platform": "Linux"},
        "model": {"name": "smollm2-135m", "layers": 30, "heads": 9, "kv_heads": 3, "head_dim": 64,
                  "dtype": "bfloat16", "bytes_per_token": BYTES_PER_TOKEN, "weight_bytes": WEIGHT_BYTES,
                  "max_position_embeddings": 8192},
        "copy_gbps": copy_gbps,
        "copy": {"start_gbps": copy_gbps, "end_gbps": copy_gbps,
                 "measurements": [{"label": "start", "gbps": copy_gbps, "samples_gbps": [copy_gbps] * 5}]},
        "fit": fit,
        "drift": {"cache": next(iter(caches), None), "context": contexts[0], "first_ms": intercept_ms,
                  "last_ms": intercept_ms, "fraction": 0.0, "max_fraction": 0.1, "ok": True},
        "traffic": traffic,
        "probe": {cache: {"query": [1, 9, 1, 64], "key": [1, 3, 1024, 64], "value": [1, 3, 1024, 64],
                          "mask": None, "attention": "native-gqa", "expansions": 0, "enable_gqa": True, "calls": 30}
                  for cache in caches},
        "verdict": {cache: {"status": "no-baseline", "reason": "no baseline for this device",
                            "timed": {"status": "no-baseline", "reason": "no baseline for this device"},
                            "counted": {"status": "no-baseline", "reason": "no baseline for this device"}}
                    for cache in caches},
        "skipped": [],
    }
    return {"machine_info": {"node": "test", "cpu": {"brand_raw": "test cpu"}}, "commit_info": {},
            "benchmarks": benchmarks, "datetime": "2026-11-29T00:00:00", "version": "5.3.1", "kv": kv}


def write_run(path: Path, run: dict[str, Any]) -> Path:
    path.write_text(json.dumps(run, indent=1))
    return path


def without(run: dict[str, Any], *keys: str) -> dict[str, Any]:
    """A deep copy of ``run`` with the named ``kv`` keys removed (a run missing parts)."""
    out = copy.deepcopy(run)
    for key in keys:
        out["kv"].pop(key, None)
    return out


def analysed(run: dict[str, Any], *, resamples: int = 200) -> dict[str, Any]:
    """``run`` with its ``kv`` section computed afresh from its benchmarks by the session-end analysis (as the
    plugin would write it): fits, verdicts and points from the data, not the made-up ``kv.fit``."""
    from kvcache.analysing.analysis import analyse
    from kvcache.settings import Settings

    kv = run["kv"]
    records = [{"type": "context", "model": kv["model"], "environment": kv["environment"]}]
    records += [{"type": "copy", **m} for m in kv["copy"]["measurements"]]
    records += [{"type": "point", **b["extra_info"], "samples_s": b["stats"]["data"], "name": b["name"]}
                for b in run["benchmarks"]]
    records += [{"type": "traffic", "cache": c, "traffic": t, "probe": kv["probe"].get(c)}
                for c, t in kv["traffic"].items()]
    settings = Settings(caches=tuple(kv["settings"]["caches"]), resamples=resamples).to_dict()
    out = copy.deepcopy(run)
    out["kv"] = analyse(records, settings, {}, {"interrupted": False, "exit": "ok"})
    return out
