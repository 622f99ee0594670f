"""What both modes of ``scripts/gate_power.py`` share (the timed mode there, the A/B mode in ``gate_power_ab.py``):
running a series of commands, each with its log, the order of the runs, and the summary's build and setup text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvcache.analysing import tables
from kvcache.analysing.records import KV, Environment, RunSettings

ROOT = Path(__file__).resolve().parent.parent
COMPETITOR = "while True: pass"  # one CPU-bound process beside the suite (--competing)


def run(cmd: list[str], log: Path) -> int:
    with log.open("w") as fh:
        return subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode


def run_series(runs: list[dict], out: Path, manifest: str, competing: bool, label: str,
               finished: list[dict] = ()) -> list[dict]:
    """Run each entry's command in turn (its log beside the manifest), with a CPU-bound competitor beside them when
    ``competing``; the manifest (``finished`` first: runs kept from before) is rewritten after every run, so a
    stopped series keeps the runs it finished."""
    done = list(finished)
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


def rotations(names: list[str], repetitions: int) -> list[tuple[int, str]]:
    """``(repetition, name)`` of every run in order: each repetition runs every name once, their order rotated by one
    from one repetition to the next (repetitions counted from 0)."""
    return [(i, name) for i in range(repetitions) for name in names[i % len(names):] + names[:i % len(names)]]


def build(code: int | None) -> str:
    """``green (0)``, ``red (1)`` (the gate failed the build), ``error (3)`` (any other exit status)."""
    if code is None:
        return f"{tables.MISSING} (not run)"
    word = {0: "green", 1: "red"}.get(code, "error")
    return f"{word} ({code})"


def setup_text(kv: KV | None, runs: list[dict[str, Any]], ledger: str) -> str:
    """What a series ran on (the first run's settings and environment) and what ran beside it."""
    s, env = (kv.settings, kv.environment) if kv is not None else (RunSettings(), Environment())

    def shown(value: Any) -> str:
        return "?" if value is None else str(value)

    beside = "one CPU-bound process beside it" if any(r.get("competing") for r in runs) else "nothing beside it"
    return (f"Model {shown(s.model)}, contexts {', '.join(map(str, s.contexts))}, {shown(s.rounds)} rounds of "
            f"{shown(s.steps)} timed steps a point, {shown(s.ledger_steps)} {ledger}, {beside}; transformers "
            f"{shown(env.transformers)}, torch {shown(env.torch)}.")
