"""One ``kvcache ab`` session, once its arguments are checked: both sides built and started, stepped through the
suite, stopped or finished, judged (more rounds when asked) and written; the exit status."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from kvcache import exits
from kvcache.ab import clock, extend
from kvcache.ab.results import ABResult, ab_summary, results, results_before_start
from kvcache.ab.schedule import ABSession, drive, start
from kvcache.ab.sides import ABError, build_sides
from kvcache.analysing import files
from kvcache.analysing.records import jsonfile
from kvcache.analysing.tables import terminal_text

#: ab's codes (kvcache.exits): a side that failed part-way could not be measured
EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, EXIT_SIDE_FAILED, EXIT_INTERRUPTED = (
    exits.PASS, exits.REGRESSION, exits.USAGE_ERROR, exits.NOT_MEASURED, exits.INTERRUPTED)


class Interrupted(Exception):
    """SIGINT or SIGTERM reached this process."""


def run_session(args: argparse.Namespace, common: list[str], tolerance: float, out_dir: Path,
        say: Callable[[str], None]) -> int:
    """The session; a first SIGINT or SIGTERM raises :class:`Interrupted` (the command's runner,
    :func:`kvcache.cli.run`), later ones only print (:func:`kvcache.analysing.files.signals_stop`)."""
    session: ABSession | None = None
    sides = []
    phases: dict[str, float] = {}  # wall seconds: start (both workers up), drive, finish (both exited), judge
    started = clock.now()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        sides = build_sides(args, out_dir, say)
        session = ABSession(sides)
        started = clock.now()  # releases installed: the session proper
        start(session, common, Path.cwd())
        phases["start"] = clock.now() - started
        say(f"kvcache ab: {len(session.items)} items, each side's log in {out_dir}/")
        drive(session, say)
    except ABError as exc:
        for side in sides:
            side.kill()
        print(terminal_text(f"kvcache ab: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except Interrupted as exc:
        if session is not None:
            session.interrupted = str(exc)
        say(f"kvcache ab: {exc}: stopping both sides, keeping the finished pairs")
    mark = clock.now()
    phases["drive"] = mark - started - phases.get("start", 0.0)
    stopped = session is None or session.interrupted or any(x.failure for x in session.sides)
    extending = bool(args.more_rounds_within) and not stopped
    # the results are written whatever arrives now; with more rounds to come, a signal means none
    held: list[str] = []
    if extending:
        held = extend.hold_signals("kvcache ab")
    else:
        files.quiet_signals("kvcache ab")
    for side in sides:
        side.kill() if stopped else side.finish()
    if session is None or not session.items:  # interrupted before the workers said hello: nothing was measured
        interrupted = session.interrupted if session is not None else "a signal"
        say(f"kvcache ab: interrupted by {interrupted} during start-up: nothing was measured")
        if args.json:
            problem = write_results(args.json, results_before_start(sides, str(interrupted), tolerance), out_dir)
            if problem:
                print(terminal_text(f"kvcache ab: {problem}"), file=sys.stderr)
                return EXIT_USAGE
            say(f"kvcache ab: {args.json} written (interrupted, no pairs)")
        return EXIT_INTERRUPTED
    phases["finish"], mark = clock.now() - mark, clock.now()
    doc = results(session, tolerance)
    phases["judge"] = clock.now() - mark
    if extending:
        assert session is not None
        mark = clock.now()
        doc = extend.more_rounds(session, doc, extend.Extender(
            args.more_rounds_within * 60, common, Path.cwd(), out_dir, dict(phases), say, Interrupted, held,
            lambda pooled: results(pooled, tolerance)))
        phases["more_rounds"] = clock.now() - mark
    doc.run.update(seconds=round(clock.now() - started, 1),
                   phase_seconds={name: round(value, 1) for name, value in phases.items()})
    problem = write_results(args.json, doc, out_dir) if args.json else None
    for line in ab_summary(doc):
        print(terminal_text(line), flush=True)
    if problem:  # after the summary: what was measured is said, and kept where the message says
        print(terminal_text(f"kvcache ab: {problem}"), file=sys.stderr)
        return EXIT_USAGE
    from kvcache.analysing.judge import paired as judge

    if judge.regressions(doc.verdicts):
        return EXIT_REGRESSION
    if session.interrupted:
        return EXIT_INTERRUPTED
    if any(side.failure for side in session.sides):
        return EXIT_SIDE_FAILED
    return EXIT_OK


def write_results(path: str, doc: ABResult, out_dir: Path) -> str | None:
    """``--json``: the session's document written to ``path``; None when it was. When it cannot be (a full disk,
    ``/dev/full``) the session is not lost: the document goes to a new file in ``out_dir`` or, failing that, in the
    temp folder, and the one line returned names ``path``, why, and where the document is."""
    text = jsonfile.dumps(doc.to_json(), newline=False)
    try:
        files.write_output("--json", path, text)
        return None
    except files.OutputError as exc:
        problem = str(exc)
    tried = []
    for folder in (out_dir, Path(tempfile.gettempdir())):
        try:
            fd, kept = tempfile.mkstemp(dir=folder, prefix="ab-unwritten-", suffix=".json")
        except OSError as exc:
            tried.append(f"{folder} ({' '.join(str(exc.strerror or exc).split())})")
            continue
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            return f"{problem}; the session's results are kept in {kept}"
        except OSError as exc:
            Path(kept).unlink(missing_ok=True)
            tried.append(f"{folder} ({' '.join(str(exc.strerror or exc).split())})")
    return f"{problem}; nor could the results be kept in {' or '.join(tried)}: only the summary is left"
