"""The A/B mode of ``scripts/gate_power.py`` (``--ab``): each run is one ``kvcache ab`` of the suite (side A, as it
is) against a B side (:data:`AB_SIDES`: clean, the planted copy twin, or the token-major layout twin, each
registered as ``dynamic``), the B sides rotated from one repetition to the next; the summary counts false alarms of
the clean side by exit status (every gate on) and catches of a twin by the paired timed verdict alone. Writes each
run's JSON and logs, ``runs-ab.json`` and ``gate-power-ab.md`` under ``--out``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gate_power_series import build, rotations, run_series, setup_text  # the script beside this one

from kvcache.analysing import tables
from kvcache.analysing.judge import paired as judge
from kvcache.analysing.records import KV
from kvcache.analysing.records.ab_document import ABRunSection, ABSide, MoreRounds, PairedVerdict, read_ab_section

#: B sides of the A/B mode: name -> (pytest arguments of side B, whether its counted and overhead gates count).
AB_SIDES = {
    "clean": ([], True),  # B the same as A: every gate on, any red is a false alarm
    "copy": (["-p", "kvcache.testing.twin_copy"], False),  # dynamic + one planted full copy: +2.00 counted passes
    "layout": (["-p", "kvcache.testing.twin_layout"], False),  # token-major K/V, transposed views: +0 counted bytes
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
    if getattr(opts, "more_rounds_within", 0):
        cmd += ["--more-rounds-within", str(opts.more_rounds_within)]
    if b_args:
        cmd += ["--b-args", " ".join(b_args)]
    return cmd + ["--", "--kv-model", opts.model, "--kv-contexts", opts.contexts, "--kv-steps", str(opts.steps),
                  "--kv-warmup", str(opts.warmup), "--kv-rounds", str(opts.rounds), "--kv-ledger-steps",
                  str(opts.ledger_steps), "--kv-threads", opts.threads, "--kv-dtype", opts.dtype,
                  "--kv-caches", "dynamic",
                  "--kv-seed", str(seed)]


def ab_runs(opts: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Every A/B run in order, the B sides rotated from one repetition to the next."""
    runs = []
    for i, side in rotations(ab_sides(opts.b_sides), opts.runs):
        name = f"ab-{side}-{i + 1}"
        runs.append({"name": name, "side": side, "repetition": i + 1, "json": f"{name}.json",
                     "cmd": ab_command(opts, side, out / f"{name}.json", out / name, i)})
    return runs


def measure_ab(opts: argparse.Namespace, out: Path) -> None:
    """Runs the series; with ``opts.resume`` the runs the manifest under ``out`` already holds are kept and only the
    rest run (a series stopped part-way, or one extended with a larger ``--runs``)."""
    manifest = out / AB_MANIFEST
    finished = json.loads(manifest.read_text()) if manifest.exists() else []
    if opts.resume:
        mixed = {bool(entry.get("competing")) for entry in finished} - {bool(opts.competing)}
        if mixed:
            raise SystemExit(f"--resume: the runs under {out} were run {'without' if opts.competing else 'with'} "
                             "--competing; resume them as they were run")
        names = {entry["name"] for entry in finished}
        runs = [run for run in ab_runs(opts, out) if run["name"] not in names]
    else:
        for entry in finished:
            (out / entry["json"]).unlink(missing_ok=True)
        manifest.unlink(missing_ok=True)
        finished, runs = [], ab_runs(opts, out)
    run_series(runs, out, AB_MANIFEST, opts.competing, "A/B run", finished=finished)


@dataclass
class ABRun:
    """One ``kvcache ab --json`` document as the A/B summary reads it: the paired verdicts of ``dynamic``
    (``ab.dynamic``, the ledger's ops as ``ledger.<op>``), the sides (``ab_run.sides``) and side B's ``kv`` section;
    all empty when the run wrote none."""

    verdicts: dict[str, PairedVerdict] = field(default_factory=dict)
    sides: dict[str, ABSide] = field(default_factory=dict)
    side_b: KV | None = None
    paired_drift: float | None = None
    more_rounds: MoreRounds | None = None  # ab_run.more_rounds: only with --more-rounds-within

    @classmethod
    def load(cls, path: Path) -> ABRun:
        try:
            doc = json.loads(path.read_text())
            verdicts = read_ab_section(doc["ab"])
            run = ABRunSection.from_json(doc["ab_run"], f"{path}: ab_run")
            return cls(verdicts["dynamic"], run.sides, KV.from_json(doc["kv"], f"{path}: kv"),
                       run.paired_drift.get("dynamic"), run.more_rounds)
        except (OSError, ValueError, KeyError, TypeError):  # a run that stopped before writing its JSON
            return cls()

    def status(self, measure: str) -> str:
        """The paired verdict of ``dynamic``: ``timed``, ``intercept``, ``counted``, ``overhead``, or ``ledger`` (the
        worst op's status, with the op)."""
        if measure != "ledger":
            return self.verdicts[measure].status if measure in self.verdicts else "missing"
        order = {"regression": 0, "inconclusive": 1, "improvement": 2, "pass": 3}
        ops = sorted(((name.removeprefix("ledger."), v.status) for name, v in self.verdicts.items()
                      if name.startswith("ledger.")), key=lambda op: order.get(op[1], 4))
        return f"{ops[0][1]} ({ops[0][0]})" if ops else "missing"

    def ratio_cell(self, measure: str) -> str:
        return judge.ratio_text(self.verdicts[measure]) if measure in self.verdicts else tables.MISSING

    def more_rounds_cell(self) -> str:
        """The rounds taken beyond the first session's, in how many extensions and seconds, and whether it gave up."""
        more = self.more_rounds
        if more is None:
            return tables.MISSING
        extra = more.rounds - more.first_rounds
        if not more.extensions:
            return "gave up, none" if more.gave_up else "none"
        text = f"+{extra} ({len(more.extensions)}×, {more.seconds:.0f} s)"
        return f"gave up, {text}" if more.gave_up else text

    def drift_cells(self) -> str:
        """Each side's own drift and the paired drift (how far B/A moved), ``A / B (paired)``."""
        drifts = [self.sides[s].drift if s in self.sides else None for s in "ab"]
        cells = [tables.MISSING if d is None else f"{d:+.1%}" for d in (*drifts, self.paired_drift)]
        return f"{cells[0]} / {cells[1]} ({cells[2]})"


def ab_caught(run: ABRun, side: str, code: int | None) -> bool:
    """Whether the run went red: for ``clean`` the build's exit status (every gate on); for a twin the paired
    timed verdict of the whole step (counted and overhead gates off)."""
    if AB_SIDES[side][1]:
        return code == 1
    return run.status("timed") == "regression"


def summarize_ab(out: Path) -> str:
    runs = json.loads((out / AB_MANIFEST).read_text())
    read = {r["name"]: ABRun.load(out / r["json"]) for r in runs}
    first_run = next((run for run in read.values() if run.side_b is not None), None)
    first = first_run.side_b if first_run is not None else None
    if first is not None and first_run is not None and first_run.more_rounds is not None:
        # the rounds of the first session: the pooled ones are the "more rounds" column's
        first = replace(first, settings=replace(
            first.settings, rounds=first_run.more_rounds.first_rounds))
    device = (first.environment.device_name or "?") if first is not None else "?"
    lines = [f"# Timed A/B gate power on {device}", "",
             setup_text(first, runs, "profiled ledger steps, class dynamic; one `kvcache ab` a run (A: the suite as "
                        "it is; B: clean, the planted copy twin, or the token-major layout twin, each registered as "
                        "dynamic)"), ""]
    rows = []
    more = any(run.more_rounds is not None for run in read.values())  # a series run with --more-rounds-within
    for r in runs:
        run = read[r["name"]]
        rows.append([str(r["repetition"]), r["side"], build(r.get("exit")), run.status("timed"),
                     run.ratio_cell("timed"), run.status("intercept"), run.status("ledger"), run.status("counted"),
                     run.drift_cells(), *([run.more_rounds_cell()] if more else []),
                     "yes" if ab_caught(run, r["side"], r.get("exit")) else "no"])
    lines += tables.markdown(tables.Table(["run", "B side", "exit", "timed A/B", "B/A slope [95% CI]", "intercept A/B",
                                           "ledger A/B (worst op)", "counted", "drift A / B (paired)",
                                           *(["more rounds"] if more else []), "red"], rows))
    lines.append("")
    for side in dict.fromkeys(r["side"] for r in runs):
        mine = [r for r in runs if r["side"] == side]
        red = sum(ab_caught(read[r["name"]], side, r.get("exit")) for r in mine)
        what = ("false alarms (exit 1, every gate on)" if AB_SIDES[side][1] else
                "caught by the timed A/B verdict (counted and overhead gates off)")
        lines.append(f"- {side}: {red}/{len(mine)} {what}")
    return "\n".join(lines)


