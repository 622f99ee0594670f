"""How well the timed gate tells a regression from noise, judged by the build's exit status on this machine:
test-only classes with a planted regression (``twin-planted``, ``twin-read``) judged, over ``--runs`` separate runs,
against the timed baseline of their clean twin (``twin-clean``), with no counted entry to catch them. Writes every
run's JSON and log, ``runs.json`` and ``gate-power.md`` under ``--out`` (``--summarize-only`` re-reads them);
``--ab``: the A/B mode (``gate_power_ab.py``). The method and the figures: docs/gate.md ("How well the timed gate
tells a regression from noise"). Time nothing else meanwhile."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gate_power_series import ROOT, build, rotations, run, run_series, setup_text  # the script beside this one

from kvcache.analysing import tables
from kvcache.analysing.options import CPU_TIMED, default
from kvcache.analysing.records import KV, Drift, Fit, RecordError, load_run

CLEAN = "twin-clean"
MANIFEST = "runs.json"


def timed_default(flag: str) -> str:
    """The value of ``flag`` in the recommended CPU timed configuration (``options.CPU_TIMED``)."""
    return CPU_TIMED[CPU_TIMED.index(flag) + 1]


def pytest_command(opts: argparse.Namespace, cache: str, json_out: Path, baseline: Path,
                   extra: tuple[str, ...] = ()) -> list[str]:
    """One run of the whole suite (counted, timed, drift) on one class, gate on: the build as CI runs it."""
    return [sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "-q",
            "--benchmark-json", str(json_out), "--kv-model", opts.model, "--kv-contexts", opts.contexts,
            "--kv-steps", str(opts.steps), "--kv-warmup", str(opts.warmup), "--kv-rounds", str(opts.rounds),
            "--kv-ledger-steps", str(opts.ledger_steps), "--kv-threads", opts.threads, "--kv-dtype", opts.dtype,
            "--kv-tolerance", str(opts.tolerance), "--kv-baseline", str(baseline), "--kv-caches", cache, *extra]


def calibration_command(opts: argparse.Namespace, out: Path) -> list[str]:
    return pytest_command(opts, CLEAN, out / "calibration.json", out / "calibration-baseline.json",
                          ("--kv-update-baseline",))


def measured_runs(opts: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Every measured run in order: ``{name, cache, repetition, json, cmd}``; per repetition one run per class,
    the classes' order rotated from one repetition to the next."""
    runs = []
    for i, cache in rotations([CLEAN, *planted_classes(opts.planted)], opts.runs):
        name = f"{cache}-{i + 1}"
        runs.append({"name": name, "cache": cache, "repetition": i + 1, "json": f"{name}.json",
                     "cmd": pytest_command(opts, cache, out / f"{name}.json", out / "baseline.json",
                                           ("--kv-seed", str(i)))})
    return runs


def planted_classes(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or CLEAN in names:
        raise SystemExit(f"--planted {text!r}: give one or more planted classes, other than {CLEAN}")
    return names


def measured_baseline(calibration: dict[str, Any], planted: list[str]) -> dict[str, Any]:
    """The calibration baseline plus, wherever the clean twin has timed passes, an entry per planted class
    holding only those timed passes (no counted passes: the counted gate then has nothing to fail it on)."""
    doc = json.loads(json.dumps(calibration))
    for caches in doc["devices"].values():
        clean = caches.get(CLEAN)
        if clean is None or clean.get("timed_passes") is None:
            continue
        for cache in planted:
            caches[cache] = {k: v for k, v in clean.items() if k != "counted_passes"}
    return doc


CALIBRATION_ATTEMPTS = 8


def measure(opts: argparse.Namespace, out: Path) -> None:
    planted = planted_classes(opts.planted)
    if (out / MANIFEST).exists():  # the previous series' runs
        for entry in json.loads((out / MANIFEST).read_text()):
            (out / entry["json"]).unlink(missing_ok=True)
    for stale in ("calibration.json", "calibration-baseline.json", "baseline.json", MANIFEST):
        (out / stale).unlink(missing_ok=True)
    calibration, code = out / "calibration-baseline.json", 0
    if opts.calibration:  # another series' calibration: the same baseline, no new calibration run
        source = Path(opts.calibration).resolve()
        for name in ("calibration-baseline.json", "calibration.json", "calibration.log"):
            if (source / name).exists():
                (out / name).write_text((source / name).read_text())
    else:
        for attempt in range(1, CALIBRATION_ATTEMPTS + 1):  # a drifted calibration records no timed baseline
            print(f"calibrating: {CLEAN} baseline (attempt {attempt}) ...", flush=True)
            calibration.unlink(missing_ok=True)
            code = run(calibration_command(opts, out), out / "calibration.log")
            if calibration.exists() and any(CLEAN in c and "timed_passes" in c[CLEAN]
                                            for c in json.loads(calibration.read_text())["devices"].values()):
                break
    baseline = measured_baseline(json.loads(calibration.read_text()), planted) if calibration.exists() else None
    if code != 0 or baseline is None or not any(planted[0] in caches for caches in baseline["devices"].values()):
        raise SystemExit(f"calibration run recorded no timed baseline for {CLEAN} (exit {code}); "
                         f"see {out / 'calibration.log'}")
    (out / "baseline.json").write_text(json.dumps(baseline, indent=2, sort_keys=True) + "\n")
    run_series(measured_runs(opts, out), out, MANIFEST, opts.competing, "run")


# --- reading the runs back ------------------------------------------------------------------------------------

def timed_status(kv: KV | None, cache: str, measure: str = "timed") -> str:
    """``kv.verdict.<cache>.<measure>.status`` (timed by default; ``ledger`` for the per-op ledger)."""
    verdicts = kv.verdict.get(cache) if kv is not None else None
    verdict = verdicts.get(measure) if verdicts else None
    return verdict.status if verdict is not None and verdict.status else "missing"


def planted_op_cell(kv: KV | None, cache: str) -> str:
    """The ledger's row of the op a planted class adds (``clone``, ``sum``): timed passes [interval]."""
    rows = kv.ledger.get(cache) if kv is not None else None
    for op in PLANTED_OPS:
        row = rows.get(op) if rows else None
        if row is not None and row.timed is not None:
            return f"{op} {tables.figure(row.timed, row.timed_ci)}"
    return tables.MISSING


PLANTED_OPS = ("clone", "sum")


def passes_cell(kv: KV | None, cache: str) -> str:
    fit = kv.fit.get(cache) if kv is not None else None
    return tables.figure(fit.passes, fit.passes_ci) if isinstance(fit, Fit) else tables.MISSING


def drift_cell(kv: KV | None) -> str:
    drift = kv.drift if kv is not None else None
    if not isinstance(drift, Drift) or drift.fraction is None:
        return tables.MISSING
    return f"{drift.fraction:+.1%}" + (" (beyond)" if drift.ok is False else "")


def load_kv(path: Path) -> KV | None:
    """A run's ``kv`` section as records; None when the run wrote no readable file."""
    try:
        return load_run(path).record
    except RecordError:
        return None


def tally(codes: list[int | None], statuses: list[str]) -> str:
    """``"builds failed 1/5 (timed verdicts: regression 1, pass 2, inconclusive 2)"``."""
    failed = sum(1 for code in codes if code != 0)
    counts = {s: statuses.count(s) for s in dict.fromkeys(statuses)}
    return (f"builds failed {failed}/{len(codes)} (timed verdicts: "
            + ", ".join(f"{s} {n}" for s, n in counts.items()) + ")")


def rejudge(out: Path, r: dict[str, Any]) -> None:
    """Judge a recorded run again with this checkout's judge against the series' baseline file (the analysis is
    a function of the run's records and the baseline): its verdicts and the exit status its build would have now
    (1 on a failure line, else 0). For a series whose runs straddled a change of the judge."""
    from kvcache.analysing import analysis
    from kvcache.analysing.judge import baseline as baselines

    kv = r["kv"]
    if kv is None:
        return
    kv.verdict = analysis.run_verdicts(kv, baselines.load(out / "baseline.json"))
    r["exit"] = 1 if analysis.gate_failures(kv) else 0


def summarize(out: Path, *, again: bool = False) -> str:
    calibration = load_kv(out / "calibration.json")
    fit = calibration.fit.get(CLEAN) if calibration is not None else None
    base = fit.passes if isinstance(fit, Fit) else None
    runs = json.loads((out / MANIFEST).read_text())
    planted = list(dict.fromkeys(r["cache"] for r in runs if r["cache"] != CLEAN))
    tolerance = calibration.settings.tolerance if calibration is not None else None
    for r in runs:
        r["kv"] = load_kv(out / r["json"])
        if r["kv"] is not None:
            recorded = r["kv"].settings.tolerance
            tolerance = tolerance if recorded is None else recorded
        if again:
            rejudge(out, r)
    device = (calibration.environment.device_name or "?") if calibration is not None else "?"
    lines = [f"# Timed gate power on {device}", "",
             setup_text(calibration, runs, "profiled steps per point for the ledger") + f" Baseline: {CLEAN} "
             f"{tables.num(base, missing='?')} timed passes from one calibration run; "
             f"{', '.join(planted) or 'no planted class'} judged against it with no counted baseline. One pytest run "
             f"per class and repetition, gate on, tolerance {tolerance if tolerance is not None else '?'}: the "
             "build's exit status decides.", ""]
    rows = [[str(r["repetition"]), r["cache"], build(r.get("exit")), timed_status(r["kv"], r["cache"]),
             timed_status(r["kv"], r["cache"], "ledger"), drift_cell(r["kv"]), passes_cell(r["kv"], r["cache"]),
             planted_op_cell(r["kv"], r["cache"])] for r in runs]
    lines += tables.markdown(tables.Table(["run", "class", "build (exit)", "timed verdict", "ledger verdict", "drift",
                                           "timed passes [95% CI]", "planted op in the ledger"], rows))
    lines.append("")
    for cache in [CLEAN, *planted]:
        mine = [r for r in runs if r["cache"] == cache]
        label = "clean" if cache == CLEAN else f"planted ({cache})" if len(planted) > 1 else "planted"
        lines.append(f"- {label}: {tally([r.get('exit') for r in mine], [timed_status(r['kv'], cache) for r in mine])}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="repetitions (one run per class each)")
    ap.add_argument("--planted", default="twin-planted,twin-read", help="planted classes, comma-separated")
    ap.add_argument("--model", default=default("--kv-model"), help="--kv-model of every run (the suite's default)")
    ap.add_argument("--contexts", default="1024,4096,16384")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=default("--kv-warmup"), help="--kv-warmup of every run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=default("--kv-tolerance"),
                    help="--kv-tolerance of the measured runs (the suite's default)")
    ap.add_argument("--ledger-steps", type=int, default=default("--kv-ledger-steps"),
                    help="--kv-ledger-steps of every run (the suite's default)")
    ap.add_argument("--threads", default=timed_default("--kv-threads"),
                    help="--kv-threads of every run (default: the recommended CPU timed configuration's)")
    ap.add_argument("--dtype", default=timed_default("--kv-dtype"),
                    help="--kv-dtype of every run (default: the recommended CPU timed configuration's)")
    ap.add_argument("--calibration", help="a folder of an earlier series whose calibration (baseline) to reuse")
    ap.add_argument("--competing", action="store_true",
                    help="keep one CPU-bound process running beside the measured runs (not the calibration)")
    ap.add_argument("--ab", action="store_true", help="A/B mode: each run is one `kvcache ab` of the suite against a "
                    "B side (--b-sides); no calibration, no baseline file")
    ap.add_argument("--b-sides", default="clean,copy,layout", help="A/B mode: B sides, comma-separated (default: all "
                    "of gate_power_ab.AB_SIDES)")
    ap.add_argument("--more-rounds-within", type=float, default=0.0, metavar="MINUTES",
                    help="A/B mode: kvcache ab's --more-rounds-within of every run (default 0: off)")
    ap.add_argument("--resume", action="store_true",
                    help="A/B mode: keep the runs already under --out and run only the missing ones")
    ap.add_argument("--out", default=".gate-power")
    ap.add_argument("--summarize-only", action="store_true", help="re-read the runs under --out")
    ap.add_argument("--rejudge", action="store_true",
                    help="with --summarize-only: judge every run again with this checkout's judge (exit status too)")
    return ap


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    out = (ROOT / opts.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if opts.resume and (not opts.ab or opts.summarize_only):
        raise SystemExit("--resume: only for an A/B series being measured (--ab, without --summarize-only)")
    if opts.ab:
        import gate_power_ab  # the script beside this one

        if not opts.summarize_only:
            gate_power_ab.measure_ab(opts, out)
        text = gate_power_ab.summarize_ab(out)
        if not opts.summarize_only:
            text += f"\n\nwall time {time.time() - started:.0f} s\n"
        (out / "gate-power-ab.md").write_text(text + "\n")
        print(text)
        return 0
    if not opts.summarize_only:
        measure(opts, out)
    text = summarize(out, again=opts.rejudge)
    if opts.rejudge:
        text += "\n\nEvery run re-judged by this checkout's judge against the series' baseline (--rejudge).\n"
    if not opts.summarize_only:
        text += f"\n\nwall time {time.time() - started:.0f} s\n"
    (out / "gate-power.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
