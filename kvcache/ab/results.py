"""The output of ``kvcache ab``: each side's records analysed into its ``kv`` section
(:mod:`kvcache.analysing.analysis`, no torch), B judged against A (:mod:`kvcache.analysing.judge.paired`; counted and
overhead
by compare's judge), the output document (:func:`results`) and the terminal summary (:func:`summary`)."""

from __future__ import annotations

import datetime
import shlex
from dataclasses import dataclass
from typing import Any

from kvcache.ab.schedule import ABSession
from kvcache.ab.sides import Side
from kvcache.analysing.records import KV, Run, Session
from kvcache.analysing.records.ab_document import ABRunSection, ABSide, CopyFigure, ab_section_json
from kvcache.analysing.records.jsonrecord import Record

FORMAT = 1  # the format of the ab_run section


@dataclass
class ABResult:
    """What ``kvcache ab`` found, as records until it is written: each side's ``kv`` section, the paired verdicts
    (``{cache: {measure: verdict}}``, :func:`kvcache.analysing.judge.paired.judge`), the session (``ab_run``) and when
    it was
    judged; :meth:`to_json` is the ``--json`` document (:func:`results`)."""

    kv_a: KV
    kv_b: KV
    verdicts: dict[str, dict[str, Record]]
    run: ABRunSection
    now: str
    measured: bool = True  # False: stopped during start-up (no machine described)

    def to_json(self) -> dict[str, Any]:
        """pytest-benchmark-shaped with side B's ``kv`` section, side A's whole run under ``side_a``, the paired
        verdicts under ``ab`` and the session under ``ab_run``."""
        def machine(kv: KV) -> dict[str, Any]:
            return {"kv_environment": kv.environment.to_json()} if self.measured else {}

        return {"benchmarks": [], "machine_info": machine(self.kv_b), "commit_info": {}, "datetime": self.now,
                "version": None, "kv": self.kv_b.to_json(), "ab": ab_section_json(self.verdicts),
                "ab_run": self.run.to_json(),
                "side_a": {"benchmarks": [], "machine_info": machine(self.kv_a), "datetime": self.now,
                           "kv": self.kv_a.to_json()}}


def side_record(side: Side, interrupted: bool, exit_text: str) -> KV:
    """The side's ``kv`` section, analysed from the records its worker sent back."""
    from kvcache.analysing import analysis
    from kvcache.analysing.records.measured import from_wire

    records = [from_wire(text) for text in side.records]
    return analysis.analyse(records, side.hello.settings, side.hello.baseline,
                            {"interrupted": interrupted, "exit": exit_text, "failed": []})


def run_of(kv: KV, path: str) -> Run:
    """A side as a run (its timed points and ``kv`` section), the way compare reads one from a file."""
    points = [p for p in kv.points if p.samples_s is not None]
    return Run(path=path, points=points, record=kv, machine_info={"kv_environment": kv.environment.to_json()})


def described(side: Side, kv: KV) -> ABSide:
    """``ab_run.sides.<name>``: the side's arguments, releases, log, failure, drift and copy bandwidths."""
    from kvcache.analysing.judge import paired as judge

    copies = [CopyFigure(label=m.label, gbps=m.gbps) for m in (kv.copy.measurements if kv.copy is not None else [])]
    return ABSide(args=side.args, release=side.release, transformers=side.hello.environment.transformers,
                  torch=side.hello.environment.torch, log=str(side.log), failed=side.failure,
                  items_finished=len(side.finished), drift=judge.side_drift(kv), copy=copies, absent=frozenset())


def results(session: ABSession, tolerance: float) -> ABResult:
    """What the session found (:class:`ABResult`): each side analysed, B judged against A."""
    from kvcache.analysing import compare
    from kvcache.analysing.judge import paired as judge

    a, b = session.sides
    broken = [side for side in session.sides if side.failure]
    interrupted = bool(session.interrupted or broken)
    exit_text = (f"interrupted by {session.interrupted}" if session.interrupted else
                 f"side {broken[0].label} failed" if broken else "ok")
    kv_a, kv_b = side_record(a, interrupted, exit_text), side_record(b, interrupted, exit_text)
    run_a, run_b = run_of(kv_a, "A"), run_of(kv_b, "B")
    try:
        counted = compare.judge_against(run_b, run_a, compare.rules_of(run_b))
    except Exception as exc:  # noqa: BLE001 - the paired verdicts stand on their own; say why these are missing
        counted = {}
        session.notes.append(f"counted and overhead not judged: {exc}")
    verdicts = judge.judge(kv_a, kv_b, tolerance=tolerance, counted=counted, seed=kv_b.settings.seed or 0)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    run = ABRunSection(
        format=FORMAT, tolerance=tolerance, interrupted=session.interrupted, failed=[side.name for side in broken],
        items=len(session.items), pairs=[item.rounded() for item in session.pairs],
        sides={side.name: described(side, kv) for side, kv in ((a, kv_a), (b, kv_b))},
        paired_drift={cache: judge.paired_drift(kv_a, kv_b, cache) for cache in verdicts}, notes=session.notes,
        absent=frozenset({"seconds", "phase_seconds"}))
    return ABResult(kv_a, kv_b, verdicts, run, now)


def results_before_start(sides: list[Side], interrupted: str, tolerance: float) -> ABResult:
    """The result of a session stopped during start-up (a release being installed, the workers not yet
    up): nothing measured, each side's ``kv.session`` and ``ab_run`` saying it was interrupted, so that ``--json``
    is written whatever stops the command."""
    from kvcache.analysing.records import SCHEMA

    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    kv = KV.of(schema=SCHEMA, session=Session.of(interrupted=True, exit=f"interrupted by {interrupted}", failed=[]))
    run = ABRunSection(
        format=FORMAT, tolerance=tolerance, interrupted=interrupted, failed=[], items=0, pairs=[],
        sides={side.name: ABSide(args=side.args, release=side.release, log=str(side.log), items_finished=0,
                                 absent=frozenset()) for side in sides},
        paired_drift={}, notes=[f"interrupted by {interrupted} during start-up: nothing was measured"],
        absent=frozenset({"seconds", "phase_seconds"}))
    return ABResult(kv, kv, {}, run, now, measured=False)


def ab_summary(result: ABResult) -> list[str]:
    """The terminal summary of a :func:`results` result: sides, drift and copy bandwidth per side, the verdict
    table, failures."""
    from kvcache.analysing import tables
    from kvcache.analysing.judge import paired as judge

    run = result.run
    lines = ["kvcache ab: B against A, points paired back to back (ABBA)"]
    for name, side in run.sides.items():
        copies = [c.gbps for c in side.copy if c.gbps is not None]
        copy = f"copy {min(copies):.1f}-{max(copies):.1f} GB/s" if copies else f"copy {tables.MISSING}"
        lines.append(f"  {name.upper()}: transformers {side.transformers}, torch {side.torch}"
                     + (f", args {shlex.join(side.args)}" if side.args else "")
                     + f"; drift {tables.MISSING if side.drift is None else format(side.drift, '+.1%')}; {copy}"
                     + (f"; FAILED: {side.failed}" if side.failed else ""))
    moved = {cache: value for cache, value in run.paired_drift.items() if value is not None}
    if moved:
        lines.append("  paired drift (how far B/A moved from first to last measurement): "
                     + ", ".join(f"{cache} {value:+.1%}" for cache, value in moved.items()))
    done = len(run.pairs)
    lines.append(f"  {done}/{run.items} items finished on both sides; tolerance ×{1 + (run.tolerance or 0.0):.2f}")
    table = tables.Table(["class", "measure", "A", "B", "B/A [interval]", "verdict"],
                         judge.summary_rows(result.verdicts))
    lines += ["", *tables.text(table)]
    for cache, measures in result.verdicts.items():
        for measure, v in measures.items():
            if v.status in ("regression", "inconclusive") and not measure.startswith("ledger."):
                lines.append(f"{v.status}: {cache} {measure}: {v.reason}")
    lines += run.notes
    if run.interrupted:
        lines.append(f"interrupted by {run.interrupted}: the {done} finished pairs are kept")
    for name in run.failed:
        lines.append(f"side {name.upper()} failed: {run.sides[name].failed}; the {done} finished pairs are kept")
    return lines
