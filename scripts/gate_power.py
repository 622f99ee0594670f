"""How well the timed gate tells a regression from noise, judged by the build's exit status on this machine.

Test-only cache classes with a planted regression (``twin-planted``: one extra full copy of K/V per step, +2
counted passes; ``twin-read``: one extra whole-cache read, +1) are judged against the timed baseline (whole
step, intercept and per-op ledger) of their clean twin (``twin-clean``), over repeated runs:

1. one calibration run of ``twin-clean`` records its baseline (``--kv-update-baseline``: timed and counted);
2. the measured runs' baseline file holds that entry for ``twin-clean`` and, for every planted class
   (``--planted``, default ``twin-planted,twin-read``), only the clean twin's *timed* figures: no counted entry, so
   the counted gate (which would catch +2 passes every time) cannot fail it; what is judged is the timed
   gate;
3. ``--runs`` repetitions, each one separate ``pytest benchmarks`` run per class (``--kv-caches <class>``),
   the classes interleaved across repetitions, gate on (no ``--kv-no-gate``) at one ``--tolerance``: the
   exit status is what CI would see, drift included. ``--competing`` keeps one CPU-bound process running
   beside the measured runs.

Per run the table gives the exit status (green 0, red 1), the timed and ledger verdicts from the JSON
(``kv.verdict``), the drift, the timed passes with their interval and the planted op's row of the ledger; the
tally counts failed builds per class. Writes every
run's JSON and log, ``runs.json`` (each run's command and exit status) and ``gate-power.md`` under ``--out``;
``--summarize-only`` re-reads them. Time nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvcache.analysing import tables

ROOT = Path(__file__).resolve().parent.parent
CLEAN = "twin-clean"
MANIFEST = "runs.json"


def pytest_command(opts: argparse.Namespace, cache: str, json_out: Path, baseline: Path,
                   extra: tuple[str, ...] = ()) -> list[str]:
    """One run of the whole suite (counted, timed, drift) on one class, gate on: the build as CI runs it."""
    return [sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "-q",
            "--benchmark-json", str(json_out), "--kv-model", opts.model, "--kv-contexts", opts.contexts,
            "--kv-steps", str(opts.steps), "--kv-warmup", str(opts.warmup), "--kv-rounds", str(opts.rounds),
            "--kv-ledger-steps", str(opts.ledger_steps), "--kv-threads", opts.threads,
            "--kv-tolerance", str(opts.tolerance), "--kv-baseline", str(baseline), "--kv-caches", cache, *extra]


def calibration_command(opts: argparse.Namespace, out: Path) -> list[str]:
    return pytest_command(opts, CLEAN, out / "calibration.json", out / "calibration-baseline.json",
                          ("--kv-update-baseline",))


def measured_runs(opts: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Every measured run in order: ``{name, cache, repetition, json, cmd}``; per repetition one run per class,
    the classes' order rotated from one repetition to the next."""
    classes = [CLEAN, *planted_classes(opts.planted)]
    runs = []
    for i in range(opts.runs):
        k = i % len(classes)
        for cache in classes[k:] + classes[:k]:
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
    for caches in (doc.get("devices") or {}).values():
        clean = caches.get(CLEAN) or {}
        if clean.get("timed_passes") is None:
            continue
        for cache in planted:
            caches[cache] = {k: v for k, v in clean.items() if k != "counted_passes"}
    return doc



def run_series(runs: list[dict], out: Path, manifest: str, competing: bool, label: str) -> list[dict]:
    """Run each entry's command in turn (its log beside the manifest), with a CPU-bound competitor beside them when
    ``competing``; the manifest is rewritten after every run, so a stopped series keeps the runs it finished."""
    done = []
    competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR]) if competing else None
    try:
        for n, entry in enumerate(runs, 1):
            print(f"{label} {n}/{len(runs)}: {entry['name']} ...", flush=True)
            entry["exit"] = run(entry["cmd"], out / f"{entry['name']}.log")
            entry["competing"] = bool(competing)
            done.append(entry)
            (out / manifest).write_text(json.dumps(done, indent=2) + "\n")
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    return done

def run(cmd: list[str], log: Path) -> int:
    with log.open("w") as fh:
        return subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode


CALIBRATION_ATTEMPTS = 8
COMPETITOR = "while True: pass"  # one CPU-bound process beside the suite (--competing)


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
    baseline = measured_baseline(json.loads(calibration.read_text()), planted) if calibration.exists() else {}
    if code != 0 or not any(planted[0] in caches for caches in (baseline.get("devices") or {}).values()):
        raise SystemExit(f"calibration run recorded no timed baseline for {CLEAN} (exit {code}); "
                         f"see {out / 'calibration.log'}")
    (out / "baseline.json").write_text(json.dumps(baseline, indent=2, sort_keys=True) + "\n")
    run_series(measured_runs(opts, out), out, MANIFEST, opts.competing, "run")


# --- reading the runs back ------------------------------------------------------------------------------------

def timed_status(kv: dict[str, Any], cache: str, measure: str = "timed") -> str:
    """``kv.verdict.<cache>.<measure>.status`` (timed by default; ``ledger`` for the per-op ledger)."""
    verdict = ((kv.get("verdict") or {}).get(cache) or {}).get(measure) or {}
    return str(verdict.get("status") or "missing")


def planted_op_cell(kv: dict[str, Any], cache: str) -> str:
    """The ledger's row of the op a planted class adds (``clone``, ``sum``): timed passes [interval]."""
    rows = (kv.get("ledger") or {}).get(cache) or {}
    for op in PLANTED_OPS:
        row = rows.get(op)
        if row and row.get("timed") is not None:
            ci = row.get("timed_ci") or [None, None]
            return f"{op} {row['timed']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if None not in ci else "")
    return "-"


PLANTED_OPS = ("clone", "sum")


def build(code: int | None) -> str:
    """``green (0)``, ``red (1)`` (the gate failed the build), ``error (3)`` (any other exit status)."""
    if code is None:
        return "- (not run)"
    word = {0: "green", 1: "red"}.get(code, "error")
    return f"{word} ({code})"


def passes_cell(kv: dict[str, Any], cache: str) -> str:
    fit = (kv.get("fit") or {}).get(cache) or {}
    passes, ci = fit.get("passes"), fit.get("passes_ci") or (None, None)
    if passes is None:
        return "-"
    return f"{passes:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if None not in ci else "")


def drift_cell(kv: dict[str, Any]) -> str:
    drift = kv.get("drift") or {}
    if drift.get("fraction") is None:
        return "-"
    return f"{drift['fraction']:+.1%}" + (" (beyond)" if drift.get("ok") is False else "")


def load_kv(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text()).get("kv") or {}
    except (OSError, ValueError):
        return {}


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

    if not r["kv"]:
        return
    doc = json.loads((out / "baseline.json").read_text())
    r["kv"]["verdict"] = analysis.judge(r["kv"], doc)
    r["exit"] = 1 if analysis.failures(r["kv"]) else 0


def summarize(out: Path, *, again: bool = False) -> str:
    calibration = load_kv(out / "calibration.json")
    env, s = calibration.get("environment") or {}, calibration.get("settings") or {}
    base = ((calibration.get("fit") or {}).get(CLEAN) or {}).get("passes")
    runs = json.loads((out / MANIFEST).read_text())
    planted = list(dict.fromkeys(r["cache"] for r in runs if r["cache"] != CLEAN))
    tolerance = s.get("tolerance")
    for r in runs:
        r["kv"] = load_kv(out / r["json"])
        tolerance = (r["kv"].get("settings") or {}).get("tolerance", tolerance)
        if again:
            rejudge(out, r)
    base_text = f"{base:.2f}" if base is not None else "?"
    lines = [f"# Timed gate power on {env.get('device_name', '?')}", "",
             f"Model {s.get('model', '?')}, contexts {', '.join(map(str, s.get('contexts', [])))}, "
             f"{s.get('rounds', '?')} rounds of {s.get('steps', '?')} timed steps a point, "
             f"{s.get('ledger_steps', '?')} profiled steps per point for the ledger, "
             f"{'one CPU-bound process beside it' if any(r.get('competing') for r in runs) else 'nothing beside it'}; "
             f"transformers "
             f"{env.get('transformers', '?')}, torch {env.get('torch', '?')}. Baseline: {CLEAN} {base_text} timed "
             f"passes from one calibration run; {', '.join(planted) or 'no planted class'} judged against it with "
             f"no counted baseline. One pytest run per class and repetition, gate on, tolerance "
             f"{tolerance if tolerance is not None else '?'}: the build's exit status decides.", ""]
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


# --- A/B mode (--ab): each run is one `kvcache ab` of the clean suite against a B side ---------------------------

#: B sides of the A/B mode: name -> (pytest arguments of side B, whether its counted and overhead gates count).
AB_SIDES = {
    "clean": ([], True),  # B the same as A: every gate on, any red is a false alarm
    "copy": (["-p", "kvcache.measuring.twin_copy"], False),  # dynamic + one planted full copy: +2.00 counted passes
    "layout": (["-p", "kvcache.measuring.twin_layout"], False),  # token-major K/V, transposed views: +0 counted bytes
}
AB_MANIFEST = "runs-ab.json"


def ab_sides(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in AB_SIDES]
    if not names or unknown:
        raise SystemExit(f"--b-sides {text!r}: choose from {', '.join(AB_SIDES)}")
    return names


def ab_command(opts: argparse.Namespace, side: str, json_out: Path, log_dir: Path, seed: int) -> list[str]:
    """One A/B run: the short sweep on ``dynamic`` (A the suite as it is, B with the side's plug-in), both sides in
    one session, points paired back to back."""
    b_args, _ = AB_SIDES[side]
    cmd = [sys.executable, "-m", "kvcache.cli", "ab", "--json", str(json_out), "--out-dir", str(log_dir),
           "--tolerance", str(opts.tolerance)]
    if b_args:
        cmd += ["--b-args", " ".join(b_args)]
    return cmd + ["--", "--kv-model", opts.model, "--kv-contexts", opts.contexts, "--kv-steps", str(opts.steps),
                  "--kv-warmup", str(opts.warmup), "--kv-rounds", str(opts.rounds), "--kv-ledger-steps",
                  str(opts.ledger_steps), "--kv-threads", opts.threads, "--kv-caches", "dynamic",
                  "--kv-seed", str(seed)]


def ab_runs(opts: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Every A/B run in order, the B sides rotated from one repetition to the next."""
    sides = ab_sides(opts.b_sides)
    runs = []
    for i in range(opts.runs):
        k = i % len(sides)
        for side in sides[k:] + sides[:k]:
            name = f"ab-{side}-{i + 1}"
            runs.append({"name": name, "side": side, "repetition": i + 1, "json": f"{name}.json",
                         "cmd": ab_command(opts, side, out / f"{name}.json", out / name, i)})
    return runs


def measure_ab(opts: argparse.Namespace, out: Path) -> None:
    if (out / AB_MANIFEST).exists():
        for entry in json.loads((out / AB_MANIFEST).read_text()):
            (out / entry["json"]).unlink(missing_ok=True)
        (out / AB_MANIFEST).unlink()
    run_series(ab_runs(opts, out), out, AB_MANIFEST, opts.competing, "A/B run")


def ab_status(doc: dict[str, Any], measure: str) -> str:
    """The paired verdict of ``dynamic``: ``timed``, ``intercept``, ``counted``, ``overhead``, or ``ledger`` (the
    worst op's status, with the op)."""
    entry = (doc.get("ab") or {}).get("dynamic") or {}
    if measure != "ledger":
        return str((entry.get(measure) or {}).get("status") or "missing")
    order = {"regression": 0, "inconclusive": 1, "improvement": 2, "pass": 3}
    ops = sorted((entry.get("ledger") or {}).items(), key=lambda kv: order.get(kv[1].get("status"), 4))
    return f"{ops[0][1].get('status')} ({ops[0][0]})" if ops else "missing"


def ab_caught(doc: dict[str, Any], side: str, code: int | None) -> bool:
    """Whether the run went red: for ``clean`` the build's exit status (every gate on); for a twin the paired
    timed verdict of the whole step (counted and overhead gates off)."""
    if AB_SIDES[side][1]:
        return code == 1
    return ab_status(doc, "timed") == "regression"


def _ratio_cell(doc: dict[str, Any], measure: str) -> str:
    v = ((doc.get("ab") or {}).get("dynamic") or {}).get(measure) or {}
    ratio, ci = v.get("ratio"), v.get("ratio_ci") or [None, None]
    if ratio is None:
        return "-"
    return f"×{ratio:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if None not in ci else "")


def _drift_cells(doc: dict[str, Any]) -> str:
    sides = (doc.get("ab_run") or {}).get("sides") or {}
    return " / ".join("-" if sides.get(s, {}).get("drift") is None else f"{sides[s]['drift']:+.1%}" for s in "ab")


def summarize_ab(out: Path) -> str:
    runs = json.loads((out / AB_MANIFEST).read_text())
    docs = {}
    for r in runs:
        try:
            docs[r["name"]] = json.loads((out / r["json"]).read_text())
        except (OSError, ValueError):
            docs[r["name"]] = {}
    first = next((d for d in docs.values() if d.get("kv")), {})
    env, s = (first.get("kv") or {}).get("environment") or {}, (first.get("kv") or {}).get("settings") or {}
    lines = [f"# Timed A/B gate power on {env.get('device_name', '?')}", "",
             f"Model {s.get('model', '?')}, contexts {', '.join(map(str, s.get('contexts', [])))}, "
             f"{s.get('rounds', '?')} rounds of {s.get('steps', '?')} timed steps a point, "
             f"{s.get('ledger_steps', '?')} profiled ledger steps, class dynamic; one `kvcache ab` a run (A: the suite "
             f"as it is; B: clean, the "
             f"planted copy twin, or the token-major layout twin, each registered as dynamic), "
             f"{'one CPU-bound process beside it' if any(r.get('competing') for r in runs) else 'nothing beside it'}; "
             f"transformers {env.get('transformers', '?')}, torch {env.get('torch', '?')}.", ""]
    rows = []
    for r in runs:
        doc = docs[r["name"]]
        rows.append([str(r["repetition"]), r["side"], build(r.get("exit")), ab_status(doc, "timed"),
                     _ratio_cell(doc, "timed"), ab_status(doc, "intercept"), ab_status(doc, "ledger"),
                     ab_status(doc, "counted"), _drift_cells(doc),
                     "yes" if ab_caught(doc, r["side"], r.get("exit")) else "no"])
    lines += tables.markdown(tables.Table(["run", "B side", "exit", "timed A/B", "B/A slope [95% CI]", "intercept A/B",
                                           "ledger A/B (worst op)", "counted", "drift A / B", "red"], rows))
    lines.append("")
    for side in dict.fromkeys(r["side"] for r in runs):
        mine = [r for r in runs if r["side"] == side]
        red = sum(ab_caught(docs[r["name"]], side, r.get("exit")) for r in mine)
        what = ("false alarms (exit 1, every gate on)" if AB_SIDES[side][1] else
                "caught by the timed A/B verdict (counted and overhead gates off)")
        lines.append(f"- {side}: {red}/{len(mine)} {what}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="repetitions (one run per class each)")
    ap.add_argument("--planted", default="twin-planted,twin-read", help="planted classes, comma-separated")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--contexts", default="1024,4096,16384")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.10, help="--kv-tolerance of the measured runs")
    ap.add_argument("--ledger-steps", type=int, default=8, help="--kv-ledger-steps of every run")
    ap.add_argument("--threads", default="1", help="--kv-threads of every run (default 1, the suite's)")
    ap.add_argument("--calibration", help="a folder of an earlier series whose calibration (baseline) to reuse")
    ap.add_argument("--competing", action="store_true",
                    help="keep one CPU-bound process running beside the measured runs (not the calibration)")
    ap.add_argument("--ab", action="store_true", help="A/B mode: each run is one `kvcache ab` of the suite against a "
                    "B side (--b-sides); no calibration, no baseline file")
    ap.add_argument("--b-sides", default="clean,copy,layout", help=f"A/B mode: B sides, from {', '.join(AB_SIDES)}")
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
    if opts.ab:
        if not opts.summarize_only:
            measure_ab(opts, out)
        text = summarize_ab(out)
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
