"""More rounds when a session is too noisy to decide (``kvcache ab --more-rounds-within MINUTES``): an inconclusive
paired ``timed`` verdict that more rounds can help (:func:`why_more_rounds`) starts a further pair of workers on the
timed items, their records pooled with the first session's (:func:`renumbered`, :func:`pool`) and judged again,
within the budget (:class:`Cost`) and at most :data:`MAX_EXTENSIONS` times. Why pooling stays honest, and why
``timed`` alone: docs/ab.md ("More rounds"). Standard library only."""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcache.ab import clock
from kvcache.ab.results import ABResult
from kvcache.ab.schedule import ABSession, drive, start
from kvcache.ab.sides import ABError, Side
from kvcache.analysing.records.ab_document import ABItem, Extension, MoreRounds, PairedVerdict
from kvcache.analysing.records.measured import from_wire, to_wire
from kvcache.analysing.records.timed import Point

#: The verdicts more rounds are taken for: each class's timed slope (not the intercept, nor the ledger, which has one
#: profiled point a context).
EXTENDED_MEASURES = ("timed",)
#: The items of an extension (``--kv-ab-roles``): each round's timed points and the drift check. No copy bandwidth:
#: the paired verdicts are ratios of seconds (both sides share the machine in the same minutes), and the pool's
#: passes figures use the first session's copy measurements; a copy of 1 GiB took 13-40 s of wall a side beside a
#: CPU-bound process (docs/results.md), more than a round's points.
ROLES = ("point", "drift")
#: The most extensions of one session: each is one more look at the data (and one more chance for noise to cross a
#: bound); the rounds double with each, so three looks reach eight times the first session's rounds.
MAX_EXTENSIONS = 3


def more_log(side: str, k: int) -> str:
    """The name of side ``side``'s log of extension ``k`` (1, 2, ...) in ``--out-dir``: ``a-more-1.log``."""
    return f"{side}-more-{k}.log"


#: Every log the extensions may write into ``--out-dir`` (checked with the session's own before anything runs).
MORE_LOGS = tuple(more_log(side, k) for k in range(1, MAX_EXTENSIONS + 1) for side in ("a", "b"))
#: Why a verdict is inconclusive, as the judge (:mod:`kvcache.analysing.judge.paired`) words it, and whether more
#: rounds help.
STRADDLES, DRIFT, FEW_CONTEXTS = "the interval straddles the bound", "paired drift", "too few paired contexts"
_FEW = "context(s) measured on both sides"


def why_more_rounds(verdict: PairedVerdict) -> str | None:
    """Why more rounds can decide an inconclusive paired verdict (:data:`STRADDLES`, :data:`DRIFT`,
    :data:`FEW_CONTEXTS`), or None: a decided verdict, or one more rounds cannot help (A's or B's figure not above
    zero: the fit does not grow, or the step time is not a line; no bootstrap interval; no context of the class
    paired at all). With an interval, the only problems the judge reports are drift or the straddle itself."""
    if verdict.status != "inconclusive":
        return None
    reason = str(verdict.reason or "")
    ci = verdict.ratio_ci
    if isinstance(ci, list) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci):
        return DRIFT if reason.startswith("drift differs") else STRADDLES
    count, _, rest = reason.partition(" ")
    if count.isdigit() and int(count) > 0 and rest.startswith(_FEW) and "not above zero" not in reason:
        return FEW_CONTEXTS  # some contexts paired, not enough: none at all is a class one side does not run
    return None


def timed_verdicts(verdicts: dict[str, dict[str, Any]]) -> list[tuple[str, str, PairedVerdict]]:
    """``(cache, measure, verdict)`` of every paired timed verdict of an ``ab`` section's verdicts
    (:func:`kvcache.analysing.judge.paired.judge`; :data:`EXTENDED_MEASURES`)."""
    return [(cache, measure, measures[measure]) for cache, measures in verdicts.items()
            for measure in EXTENDED_MEASURES if isinstance(measures.get(measure), PairedVerdict)]


def triggers(ab: dict[str, dict[str, Any]], skipped: set[str] = frozenset()) -> list[str]:
    """``"<cache> <measure> (<why>)"`` of each timed verdict more rounds can help; too few paired contexts only for
    a class no side skipped a point of (a skipped point is skipped again)."""
    out = []
    for cache, measure, verdict in timed_verdicts(ab):
        why = why_more_rounds(verdict)
        if why is not None and not (why == FEW_CONTEXTS and cache in skipped):
            out.append(f"{cache} {measure} ({why})")
    return out


def inconclusive(ab: dict[str, dict[str, Any]]) -> list[str]:
    """``"<cache> <measure>"`` of each timed verdict still inconclusive."""
    return [f"{cache} {measure}" for cache, measure, v in timed_verdicts(ab) if v.status == "inconclusive"]


def skipped_classes(result: ABResult) -> set[str]:
    """The classes either side skipped a point of (``kv.skipped``), from a :func:`kvcache.ab.results.results`
    result."""
    return {str(s.cache) for kv in (result.kv_b, result.kv_a) for s in kv.skipped}


# --- the budget ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cost:
    """What an extension of ``rounds`` rounds is expected to take, in wall seconds: ``fixed_s`` (both workers up,
    the drift check, the workers' end, the judge) plus ``per_round_s`` a round (its timed points)."""

    fixed_s: float
    per_round_s: float

    def of(self, rounds: int) -> float:
        return self.fixed_s + rounds * self.per_round_s

    def rounds_within(self, seconds: float) -> int:
        """The most rounds whose extension fits in ``seconds`` (0 when not even one)."""
        if self.per_round_s <= 0:
            return 0 if seconds < self.fixed_s else 1 << 20
        return max(0, math.floor((seconds - self.fixed_s) / self.per_round_s))

    def at_least(self, other: Cost) -> Cost:
        """The larger of two estimates, field by field (a later measurement can only make the next one dearer)."""
        return Cost(max(self.fixed_s, other.fixed_s), max(self.per_round_s, other.per_round_s))


def cost_of(pairs: list[ABItem], rounds: int, phases: dict[str, float]) -> Cost:
    """The cost of an extension, from a session's pairs (``ab_run.pairs``: role and wall seconds of each item), its
    timed rounds and its phases (``start``, ``finish``, ``judge``): a round is the wall of the session's timed points
    over ``rounds``; fixed are the phases and the drift check (:data:`ROLES`: no copy bandwidth)."""
    def walls(role: str) -> list[float]:
        return [float(p.wall) for p in pairs if p.role == role and p.wall is not None]

    points, drift = walls("point"), walls("drift")
    per_point = sum(points) / len(points) if points else 0.0
    per_round = sum(points) / max(rounds, 1)
    fixed = sum(phases.get(name, 0.0) for name in ("start", "finish", "judge")) + (
        sum(drift) / len(drift) if drift else per_point)
    return Cost(fixed, per_round)


def plan(pooled_rounds: int, cost: Cost, left_s: float, taken: int) -> tuple[int, str | None]:
    """The rounds of the next extension and None, or 0 and why none: the pool's rounds doubled (as many more rounds as
    it holds), fewer when the budget left pays for fewer, none when it pays for not even one or when
    :data:`MAX_EXTENSIONS` were taken."""
    if taken >= MAX_EXTENSIONS:
        return 0, f"{taken} extensions taken, the most ({MAX_EXTENSIONS}: each is one more look at the data)"
    fits = cost.rounds_within(left_s)
    if fits < 1:
        return 0, (f"one more round would take about {cost.of(1):.0f} s, {max(left_s, 0):.0f} s of the budget left")
    return min(max(pooled_rounds, 1), fits), None


# --- the record ---------------------------------------------------------------------------------------------------


# --- pooling ------------------------------------------------------------------------------------------------------


def last_round(sides: list[Side]) -> int:
    """The highest round of any timed point either side recorded (re-measurements included); -1 when none."""
    rounds = [record.round for side in sides for record in map(from_wire, side.records)
              if isinstance(record, Point) and isinstance(record.round, int)]
    return max(rounds, default=-1)


def renumbered(records: list[str], offset: int) -> list[str]:
    """An extension's records (each the JSON text a worker sent) for the pool: each point's round moved by ``offset``
    (after the pool's last); every other record as it came."""
    out = []
    for text in records:
        record = from_wire(text)
        if isinstance(record, Point) and isinstance(record.round, int):
            record.update(round=record.round + offset)
            text = to_wire(record)
        out.append(text)
    return out


def pool(session: ABSession, more: ABSession, offset: int, k: int, rounds: int) -> None:
    """The extension's finished items into ``session``: each side's records (renumbered), finished items, the pairs and
    items; a side that failed in it fails the pool (``side.failure``); ``kv.settings.rounds`` the pool's."""
    for side, other in zip(session.sides, more.sides):
        side.records += renumbered(other.records, offset)
        side.finished += other.finished
        if other.failure and not side.failure:
            side.failure = f"more rounds {k}: {other.failure}"
        side.hello.settings.update(rounds=rounds)
    session.pairs += more.pairs
    session.items = [*session.items, *more.items]  # not in place: the first's are side A's hello's
    session.roles = [*session.roles, *more.roles]


def _settings_problem(session: ABSession, more: ABSession) -> str | None:
    """Why the extension's workers are not the first session's sweep (settings other than the rounds differ)."""
    for side, other in zip(session.sides, more.sides):
        mine = {k: v for k, v in side.hello.settings.to_json().items() if k != "rounds"}
        theirs = {k: v for k, v in other.hello.settings.to_json().items() if k != "rounds"}
        differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if differ:
            return f"side {side.label}'s extension has other settings ({', '.join(differ[:3])})"
    return None


# --- signals between the sessions ---------------------------------------------------------------------------------


def hold_signals(prog: str) -> list[str]:
    """From now on, SIGINT and SIGTERM only note their name (in the list returned) and print a line: the first
    session is over, its results are written whatever comes; a signal noted means no more rounds. Main thread
    only."""
    came: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        return came

    def note(signum: int, frame: object) -> None:
        import os

        came.append(signal.Signals(signum).name)
        os.write(2, f"\n{prog}: {came[-1]}: no more rounds; the results are being written\n".encode())

    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, note)
    return came


# --- the loop -----------------------------------------------------------------------------------------------------


@dataclass
class Extender:
    """What the loop needs from the command: the budget (s), the sides' common options, where to run and log, the
    first session's phases (s), how to print a line, the exception the first signal raises (``interrupted``), the
    signals noted since the first session ended (``held``), and how to judge the pool into a results document."""

    budget_s: float
    common: list[str]
    cwd: Path
    out_dir: Path
    phases: dict[str, float]
    say: Callable[[str], None]
    interrupted: type[BaseException]
    held: list[str]
    judge: Callable[[ABSession], ABResult]
    prog: str = "kvcache ab"


def more_rounds(session: ABSession, doc: ABResult, ext: Extender) -> ABResult:
    """The loop (see the module docstring): the result of the pool, with ``ab_run.more_rounds`` and the summary's
    line among ``ab_run.notes``."""
    from kvcache.analysing import files

    first_rounds = int(session.sides[0].hello.settings.rounds or 1)
    record = MoreRounds(budget_s=round(ext.budget_s, 1), first_rounds=first_rounds, rounds=first_rounds)
    cost = cost_of(doc.run.pairs, first_rounds, ext.phases)
    began = clock.now()
    detail = ""
    while True:
        wanted = triggers(doc.verdicts, skipped_classes(doc))
        failed = [side for side in session.sides if side.failure]
        if not wanted:
            left = inconclusive(doc.verdicts)
            record.stopped = "decided" if not left else "cannot help"
            detail = ("every timed verdict decided" if not left else
                      f"more rounds cannot decide {', '.join(left)}: see the reason")
            break
        if session.interrupted or ext.held:  # a signal between the sessions: no more rounds, the pool as it is
            record.stopped, detail = "interrupted", f"interrupted by {session.interrupted or ext.held[0]}"
            break
        if failed:
            record.stopped, detail = "failed", f"side {failed[0].label} failed"
            break
        left_s = ext.budget_s - (clock.now() - began)
        rounds, why_not = plan(record.rounds, cost, left_s, len(record.extensions))
        if not rounds:
            record.stopped = "budget" if len(record.extensions) < MAX_EXTENSIONS else "most extensions"
            detail = str(why_not)
            break
        k = len(record.extensions) + 1
        estimate = cost.of(rounds)
        ext.say(f"{ext.prog}: inconclusive: {', '.join(wanted)}; taking {rounds} more round(s) of the timed items "
                f"(extension {k} of at most {MAX_EXTENSIONS}, about {estimate:.0f} s; {left_s:.0f} s of the "
                f"{ext.budget_s:.0f} s budget left, --more-rounds-within)")
        offset = last_round(session.sides) + 1
        extension = Extension(rounds=rounds, first_round=offset, why=wanted, estimate_s=round(estimate, 1))
        record.extensions.append(extension)
        more, phases = _run_extension(session, rounds, k, ext, extension)
        extension.seconds = round(sum(phases.values()), 1)
        record.seconds = round(clock.now() - began, 1)
        if more is None:  # not started, stopped before a pair, or not the same sweep: nothing to pool
            if session.interrupted:
                record.stopped, detail = "interrupted", str(extension.failed)
                doc = ext.judge(session)
            else:
                session.notes.append(f"more rounds {k} not taken: {extension.failed}")
                record.stopped, detail = "failed", str(extension.failed)
            break
        extension.pairs = len(more.pairs)
        if not extension.failed:
            cost = cost.at_least(cost_of(more.pairs, rounds, phases))
        # pooled even when stopped part-way: what both sides finished ran back to back all the same
        pool(session, more, offset, k, record.rounds + rounds)
        record.rounds += rounds
        doc = ext.judge(session)
    files.quiet_signals(ext.prog)
    record.seconds = round(clock.now() - began, 1)
    record.inconclusive = inconclusive(doc.verdicts)
    record.gave_up = bool(triggers(doc.verdicts, skipped_classes(doc)))
    doc.run.update(more_rounds=record)
    doc.run.notes.append(record.line(detail))
    return doc


def _run_extension(session: ABSession, rounds: int, k: int, ext: Extender,
                   extension: Extension) -> tuple[ABSession | None, dict[str, float]]:
    """One further pair of workers (``--kv-rounds rounds``, the timed items only), driven like the first; its
    session (None when it could not start) and phases. A signal stops it (its finished pairs are kept) and marks
    ``session.interrupted``; a start that fails (or other settings) is ``extension.failed``."""
    from kvcache.analysing import files

    sides = [Side(s.name, s.env, [*s.args, "--kv-rounds", str(rounds), "--kv-ab-roles", ",".join(ROLES)],
                  ext.out_dir / more_log(s.name, k), release=s.release) for s in session.sides]
    more = ABSession(sides)
    phases: dict[str, float] = {}
    began = clock.now()
    stopped, usable = False, True
    with files.signals_stop(ext.prog, ext.interrupted):
        try:
            start(more, ext.common, ext.cwd)
            problem = _settings_problem(session, more)
            if problem:
                raise ABError(problem)
            phases["start"] = clock.now() - began
            drive(more, ext.say)
            broken = next((side for side in sides if side.failure), None)
            if broken is not None:
                extension.failed = f"side {broken.label} failed: {broken.failure}"
        except ABError as exc:
            extension.failed, stopped, usable = str(exc), True, False
        except ext.interrupted as exc:
            session.interrupted = str(exc)
            extension.failed, stopped = f"interrupted by {exc}", True
    mark = clock.now()
    phases.setdefault("start", mark - began)
    phases["drive"] = mark - began - phases["start"]
    stopped = stopped or any(side.failure for side in sides)
    for side in sides:
        side.kill() if stopped else side.finish()
    phases["finish"] = clock.now() - mark
    if not usable or not more.pairs:
        return None, phases  # not started, or not the same sweep: nothing to pool
    return more, phases
