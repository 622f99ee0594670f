"""Timed against counted passes per class, dtype and thread count, with the per-op ledger beside the timed step: the
study behind the recommended timed configuration on CPU. Runs the suite once per (dtype, threads), one after the
other (timings: nothing else should run meanwhile), keeps each run file in --out and prints one table from them
(its columns: docs/results.md, "Where a CPU step is memory-bound")::

    .venv/bin/python scripts/timed_study.py --dtypes bfloat16,float32 --threads 1,2 --out .timed-study [--table-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "-q"]


def run_name(dtype: str, threads: str) -> str:
    return f"{dtype}-t{threads}.json"


def measure(out: Path, dtypes: list[str], threads: list[str], caches: str, extra: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for dtype in dtypes:
        for n in threads:
            path = out / run_name(dtype, n)
            started = time.monotonic()
            cmd = PYTEST + ["--kv-caches", caches, "--kv-dtype", dtype, "--kv-threads", n,
                            "--benchmark-json", str(path), *extra]
            print("$", " ".join(cmd[1:]), flush=True)
            with open(out / f"{path.stem}.log", "w") as log:
                subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
            print(f"  {time.monotonic() - started:.0f} s", flush=True)


def context_gaps(kv: dict, cache: str, steps: str = "step_s") -> list[tuple[int, float]]:
    """Per context: the ledger's median profiled step (``steps="plain_s"``: plain step) over the timed rounds'
    median step, minus 1."""
    timed: dict[int, list[float]] = {}
    for p in kv.get("points", []):
        if p.get("cache") == cache and not p.get("remeasured"):
            timed.setdefault(p["context"], []).extend(p.get("samples_ms", []))
    gaps = []
    for p in kv.get("ledger_points", []):
        if p["cache"] == cache and timed.get(p["context"]) and p.get(steps):
            ledger_ms = statistics.median(p[steps]) * 1e3
            gaps.append((p["context"], ledger_ms / statistics.median(timed[p["context"]]) - 1))
    return sorted(gaps)


def table(out: Path) -> None:
    print("| dtype | threads | class | timed passes [95% CI] | counted | timed/counted | ledger step (timed passes) "
          "| ledger vs plain steps between, per context | ledger vs timed rounds, per context "
          "| plain steps between vs timed rounds, per context | most of the ledger step (timed / counted passes) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in sorted(out.glob("*.json")):
        kv = json.loads(path.read_text())["kv"]
        s = kv["settings"]
        for cache, fit in kv.get("fit", {}).items():
            counted = kv["traffic"].get(cache, {}).get("passes")
            rows = kv.get("ledger", {}).get(cache, {})
            step = rows.get("(profiled step)", {}).get("timed")
            by_op = kv["traffic"].get(cache, {}).get("by_op", {})
            ops = sorted(((r["timed"], op) for op, r in rows.items() if not op.startswith("(")), reverse=True)[:2]
            top = ", ".join(f"`{op}` {t:.2f} / {by_op.get(op, 0):.2f}" for t, op in ops)
            gaps, drift = (", ".join(f"{c // 1024}k {g:+.0%}" for c, g in context_gaps(kv, cache, steps)) or "—"
                           for steps in ("step_s", "plain_s"))
            over_plain = rows.get("(profiled step)", {}).get("over_plain") or {}
            between = ", ".join(f"{int(c) // 1024}k {g:+.0%}" for c, g in over_plain.items()) or "—"
            ci = fit.get("passes_ci") or [float("nan")] * 2
            ratio = fit["passes"] / counted if counted else float("nan")
            print(f"| {s['dtype']} | {s['threads']} | {cache} | {fit['passes']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] "
                  f"| {counted:.2f} | {ratio:.2f} | {step if step is None else round(step, 2)} | {between} | {gaps} "
                  f"| {drift} | {top} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--caches", default="dynamic,static,inplace")
    parser.add_argument("--out", default=".timed-study")
    parser.add_argument("--table-only", action="store_true")
    args, extra = parser.parse_known_args()
    out = Path(args.out)
    if not args.table_only:
        measure(out, args.dtypes.split(","), args.threads.split(","), args.caches, extra)
    table(out)


if __name__ == "__main__":
    main()
