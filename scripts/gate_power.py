"""How well the timed gate tells a regression from noise, measured on this machine.

A test-only cache class with one planted extra full copy of K/V per step (``twin-planted``: +2 passes)
is judged against the baseline of its clean twin (``twin-clean``), over several repeated runs:

1. one calibration run of ``twin-clean`` records the baseline (``--kv-update-baseline``);
2. ``--runs`` runs of both classes, interleaved over several rounds (the suite's default): how often the
   planted regression is caught, and how often the clean class is wrongly flagged;
3. ``--runs`` single-round ascending runs (the old way): the spread of timed passes to compare with.

Writes every run's JSON and ``gate-power.md`` (the table) under ``--out``. Time nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pytest_run(out: Path, args: list[str], log: Path) -> dict:
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-m", "timed", "-p", "no:cacheprovider", "-q",
           "--benchmark-json", str(out), *args]
    with log.open("w") as fh:
        subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, check=False)
    return json.loads(out.read_text())["kv"]


def row(kv: dict, cache: str) -> tuple[float | None, list | None, str]:
    fit = kv.get("fit", {}).get(cache) or {}
    verdict = (kv.get("verdict", {}).get(cache) or {}).get("timed", {})
    return fit.get("passes"), fit.get("passes_ci"), verdict.get("status", "-")


def spread(values: list[float]) -> str:
    vals = [v for v in values if v is not None and v > 0]
    return f"{max(vals) / min(vals):.2f}" if len(vals) == len(values) and vals else "n/a (a run gave passes <= 0)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--contexts", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=".gate-power")
    ap.add_argument("--skip-ascending", action="store_true", help="leave out the single-round ascending runs")
    opts = ap.parse_args(argv)
    out = (ROOT / opts.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    baseline = out / "baseline.json"
    baseline.unlink(missing_ok=True)
    common = ["--kv-model", opts.model, "--kv-contexts", opts.contexts, "--kv-steps", str(opts.steps),
              "--kv-warmup", str(opts.warmup), "--kv-baseline", str(baseline)]
    started = time.time()

    print("calibrating: twin-clean baseline ...", flush=True)
    kv = pytest_run(out / "calibration.json", [*common, "--kv-caches", "twin-clean", "--kv-rounds", str(opts.rounds),
                                               "--kv-update-baseline"], out / "calibration.log")
    doc = json.loads(baseline.read_text())
    for entries in doc["devices"].values():
        if "twin-clean" in entries:
            entries["twin-planted"] = dict(entries["twin-clean"])  # the planted class must meet the clean baseline
    baseline.write_text(json.dumps(doc, indent=2))
    clean_base = row(kv, "twin-clean")[0]

    results: dict[str, list[dict]] = {"interleaved": [], "ascending": []}
    modes = [("interleaved", ["--kv-rounds", str(opts.rounds), "--kv-order", "interleaved"])]
    if not opts.skip_ascending:
        modes.append(("ascending", ["--kv-rounds", "1", "--kv-order", "ascending"]))
    for mode, extra in modes:
        for i in range(opts.runs):
            print(f"{mode} run {i + 1}/{opts.runs} ...", flush=True)
            kv = pytest_run(out / f"{mode}-{i + 1}.json",
                            [*common, "--kv-caches", "twin-clean,twin-planted", "--kv-no-gate", "--kv-seed", str(i),
                             *extra], out / f"{mode}-{i + 1}.log")
            results[mode].append({"clean": row(kv, "twin-clean"), "planted": row(kv, "twin-planted"),
                                  "copy_gbps": kv.get("copy_gbps"), "drift": (kv.get("drift") or {}).get("fraction")})

    lines = [f"# Timed gate power on {kv['environment']['device_name']}",
             "",
             f"model {opts.model}, contexts {opts.contexts}, {opts.steps} timed steps a point; baseline: twin-clean "
             f"{clean_base:.2f} passes from one calibration run; allowed = baseline × 1.25; "
             f"transformers {kv['environment']['transformers']}, torch {kv['environment']['torch']}.", ""]
    for mode, runs in results.items():
        if not runs:
            continue
        label = f"{opts.rounds} rounds, interleaved" if mode == "interleaved" else "1 round, ascending"
        lines += [f"## {label}", "", "| run | copy GB/s | drift | clean passes [95% CI] | clean verdict "
                  "| planted passes [95% CI] | planted verdict |", "|---|---|---|---|---|---|---|"]
        for i, r in enumerate(runs, 1):
            cells = []
            for key in ("clean", "planted"):
                passes, ci, status = r[key]
                cells += [f"{passes:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if passes is not None and ci else "-", status]
            drift = f"{r['drift']:+.1%}" if r["drift"] is not None else "-"
            lines.append(f"| {i} | {r['copy_gbps']:.1f} | {drift} | " + " | ".join(cells) + " |")
        clean_spread, planted_spread = spread([r["clean"][0] for r in runs]), spread([r["planted"][0] for r in runs])
        caught = sum(r["planted"][2] == "regression" for r in runs)
        planted_pass = sum(r["planted"][2] == "pass" for r in runs)
        false = sum(r["clean"][2] == "regression" for r in runs)
        lines += ["", f"planted regression caught: {caught}/{len(runs)} (passed: {planted_pass}); "
                      f"clean wrongly flagged: {false}/{len(runs)}; spread of timed passes (max/min): "
                      f"clean {clean_spread}, planted {planted_spread}",
                  ""]
    lines.append(f"wall time {time.time() - started:.0f} s")
    text = "\n".join(lines)
    (out / "gate-power.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
