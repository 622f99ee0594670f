"""How well the timed gate tells a regression from noise, measured on this machine.

A test-only cache class with one planted extra full copy of K/V per step (``twin-planted``: +2 counted
passes) is judged against the baseline of its clean twin (``twin-clean``), over repeated runs:

1. one calibration run of ``twin-clean`` records the baseline (``--kv-update-baseline``);
2. ``--runs`` runs of both classes, interleaved over several rounds (the suite's default): how often the
   planted regression is caught, and how often the clean class is wrongly flagged;
3. ``--runs`` single-round ascending runs (the old way): the spread of timed passes to compare with.

Verdicts are taken at several ``--tolerances`` from the same runs (the suite's own judge_timed).
Writes every run's JSON and ``gate-power.md`` under ``--out``; ``--summarize-only`` re-reads them.
Time nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvcache import gate  # noqa: E402
from kvcache.fit import PassesFit  # noqa: E402

MODES = {"interleaved": "rounds interleaved (the default)", "ascending": "1 round, ascending"}


def pytest_run(out: Path, args: list[str], log: Path) -> None:
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-m", "timed", "-p", "no:cacheprovider", "-q",
           "--benchmark-json", str(out), *args]
    with log.open("w") as fh:
        subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, check=False)


def measure(opts: argparse.Namespace, out: Path) -> None:
    baseline = out / "baseline.json"
    baseline.unlink(missing_ok=True)
    common = ["--kv-model", opts.model, "--kv-contexts", opts.contexts, "--kv-steps", str(opts.steps),
              "--kv-warmup", str(opts.warmup), "--kv-baseline", str(baseline), "--kv-no-gate"]
    print("calibrating: twin-clean baseline ...", flush=True)
    pytest_run(out / "calibration.json", [*common, "--kv-caches", "twin-clean", "--kv-rounds", str(opts.rounds)],
               out / "calibration.log")
    modes = {"interleaved": ["--kv-rounds", str(opts.rounds), "--kv-order", "interleaved"],
             "ascending": ["--kv-rounds", "1", "--kv-order", "ascending"]}
    if opts.skip_ascending:
        modes.pop("ascending")
    for mode, extra in modes.items():
        for i in range(opts.runs):
            print(f"{mode} run {i + 1}/{opts.runs} ...", flush=True)
            pytest_run(out / f"{mode}-{i + 1}.json",
                       [*common, "--kv-caches", "twin-clean,twin-planted", "--kv-seed", str(i), *extra],
                       out / f"{mode}-{i + 1}.log")


def passes_fit(fit: dict) -> PassesFit | None:
    if not fit or fit.get("passes") is None:
        return None
    names = {f.name for f in dataclasses.fields(PassesFit)}
    return PassesFit(**{k: v for k, v in fit.items() if k in names})


def verdict(kv: dict, cache: str, allowed: float) -> str:
    drift_ok = (kv.get("drift") or {}).get("ok")
    settings = kv["settings"]
    judged = gate.judge_timed(passes_fit(kv["fit"].get(cache)), allowed=allowed, min_r2=settings["min_r2"],
                              drift_ok=drift_ok, device="this machine")
    return judged.status


def tally(statuses: list[str]) -> str:
    """``"4/5 (pass 0, inconclusive 1)"``: regressions out of runs, then the other verdicts."""
    return (f"{statuses.count('regression')}/{len(statuses)} (pass {statuses.count('pass')}, "
            f"inconclusive {statuses.count('inconclusive')})")


def spread(values: list[float]) -> str:
    return f"{max(values) / min(values):.2f}" if values and min(values) > 0 else "n/a"


def summarize(out: Path, tolerances: list[float]) -> str:
    calibration = json.loads((out / "calibration.json").read_text())["kv"]
    base = calibration["fit"]["twin-clean"]["passes"]
    env = calibration["environment"]
    s = calibration["settings"]
    lines = [f"# Timed gate power on {env['device_name']}", "",
             f"Model {s['model']}, contexts {', '.join(map(str, s['contexts']))}, {s['steps']} timed steps a point; "
             f"transformers {env['transformers']}, torch {env['torch']}. Baseline: twin-clean {base:.2f} timed "
             f"passes from one calibration run; twin-planted (+2 counted passes) is judged against it.", ""]
    for mode, label in MODES.items():
        runs = [json.loads(p.read_text())["kv"] for p in sorted(out.glob(f"{mode}-*.json"))]
        if not runs:
            continue
        rounds = runs[0]["settings"]["rounds"]
        lines += [f"## {rounds} {label}" if mode == "interleaved" else f"## {label}", "",
                  "| run | copy GB/s | drift | clean passes [95% CI] | planted passes [95% CI] | "
                  + " | ".join(f"clean / planted at tol {t:.2f}" for t in tolerances) + " |",
                  "|---" * (5 + len(tolerances)) + "|"]
        for i, kv in enumerate(runs, 1):
            cells = []
            for cache in ("twin-clean", "twin-planted"):
                fit = kv["fit"].get(cache) or {}
                ci = fit.get("passes_ci") or [float("nan")] * 2
                cells.append(f"{fit.get('passes', float('nan')):.2f} [{ci[0]:.2f}, {ci[1]:.2f}]")
            drift = (kv.get("drift") or {}).get("fraction")
            cells += [f"{verdict(kv, 'twin-clean', base * (1 + t))} / {verdict(kv, 'twin-planted', base * (1 + t))}"
                      for t in tolerances]
            lines.append(f"| {i} | {kv['copy_gbps']:.1f} | {drift:+.1%} | " + " | ".join(cells) + " |"
                         if drift is not None else f"| {i} | {kv['copy_gbps']:.1f} | - | " + " | ".join(cells) + " |")
        lines.append("")
        for t in tolerances:
            allowed = base * (1 + t)
            clean = tally([verdict(kv, "twin-clean", allowed) for kv in runs])
            planted = tally([verdict(kv, "twin-planted", allowed) for kv in runs])
            lines.append(f"- tolerance {t:.2f} (allowed {allowed:.2f}): planted caught {planted}; "
                         f"clean wrongly flagged {clean}")
        clean_p = [kv["fit"]["twin-clean"]["passes"] for kv in runs]
        planted_p = [kv["fit"]["twin-planted"]["passes"] for kv in runs]
        lines += [f"- spread of timed passes across runs (max/min): clean {spread(clean_p)}, planted "
                  f"{spread(planted_p)}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--contexts", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tolerances", default="0.25,0.10")
    ap.add_argument("--out", default=".gate-power")
    ap.add_argument("--skip-ascending", action="store_true", help="leave out the single-round ascending runs")
    ap.add_argument("--summarize-only", action="store_true", help="re-read the runs under --out")
    opts = ap.parse_args(argv)
    out = (ROOT / opts.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if not opts.summarize_only:
        measure(opts, out)
    text = summarize(out, [float(t) for t in opts.tolerances.split(",")])
    if not opts.summarize_only:
        text += f"\nwall time {time.time() - started:.0f} s\n"
    (out / "gate-power.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
