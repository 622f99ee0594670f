"""``kvcache comment BASE.json HEAD.json``: one Markdown body for a pull request's comment
(:func:`kvcache.analysing.comment.build`), to stdout or ``--out FILE``.

Timed figures are judged only from an A/B run: ``--ab AB.json`` (``kvcache ab --json``'s output), or an ``ab``
section in HEAD.json. ``--report-url`` links the full report; ``--base-label``/``--head-label`` name the two runs;
``--max-chars`` bounds the body (GitHub's limit, 65536 characters, by default). Exit 0 whenever a body is written,
a regression included (rendering is not judging: the gate is ``kvcache compare``'s exit status); 2 on unreadable
input, bad options or runs that are not comparable. No torch here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvcache import cli, exits
from kvcache.analysing import arguments
from kvcache.analysing.comment import GITHUB_LIMIT, build
from kvcache.analysing.compare import mismatch
from kvcache.analysing.files import write_output
from kvcache.analysing.records import RecordError, load_run, load_runs
from kvcache.analysing.records.ab_document import ABDocument


class CommentError(ValueError):
    """Bad input to ``kvcache comment``: a one-line message."""


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="kvcache comment",
        description="Write one Markdown body for a pull request's comment: HEAD judged against BASE by kvcache "
        "compare's judge (BASE's rules; every class BASE counted required in HEAD), a verdict line, a table of "
        "classes by measure with BASE, HEAD and change (counted passes, ATen ops per step, weight passes, counted "
        "memory in passes), the ops that grew, the reasons for inconclusive figures and "
        "a hidden marker that a workflow updates one comment by. Timed figures are judged only from an A/B run "
        "(--ab); those of two separate runs are shown as informational.",
    )
    made.add_argument("base", metavar="BASE.json", help="the pull request's base run (pytest --benchmark-json)")
    made.add_argument("head", metavar="HEAD.json", help="the pull request's head run")
    made.add_argument("--ab", metavar="AB.json", help="an A/B run (kvcache ab --json) whose paired timed "
                      "verdicts (its 'ab' section) are shown and judged, its sides of BASE's identity (unless "
                      "--allow-mismatch); an 'ab' section in HEAD.json is used the same way")
    made.add_argument("--report-url", metavar="URL", help="http(s) link to the full report or job summary")
    made.add_argument("--base-label", metavar="TEXT", help="what BASE is, e.g. 'merge base 1a2b3c4'")
    made.add_argument("--head-label", metavar="TEXT", help="what HEAD is, e.g. 'head 5d6e7f8'")
    made.add_argument("--out", metavar="FILE", help="write the body here instead of to stdout")
    made.add_argument("--max-chars", type=int, default=GITHUB_LIMIT,
                      help=f"longest body, in characters (default {GITHUB_LIMIT}, GitHub's limit)")
    made.add_argument("--allow-mismatch", action="store_true",
                      help="compare runs whose identity differs (device, model, dtype, threads) anyway")
    return made


def read_ab(path: str) -> dict[str, Any] | None:
    """The ``ab`` section of a JSON file, or None when it has none; CommentError when unreadable."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CommentError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise CommentError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        found = ABDocument.read(doc, path)
    except RecordError as exc:
        raise CommentError(str(exc)) from None
    return None if found is None else found.ab


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(parser, work, argv, errors=(CommentError, RecordError))


def work(args: argparse.Namespace) -> int:
    """The body, to ``--out`` or stdout."""
    if arguments.paths_refused("kvcache comment", reads=[("BASE.json", args.base), ("HEAD.json", args.head),
                                                         ("--ab", args.ab)], writes=[("--out", args.out)]):
        return exits.USAGE_ERROR
    if args.max_chars < 1000:
        raise CommentError(f"--max-chars {args.max_chars} is too small; give at least 1000 (GitHub allows "
                           f"{GITHUB_LIMIT})")
    if args.report_url is not None:
        try:
            arguments.http_url("--report-url", args.report_url)
        except ValueError as exc:
            raise CommentError(str(exc)) from None
    base, head = load_run(args.base), load_run(args.head)
    sides = load_runs(args.ab) if args.ab else []  # an A/B run's two sides: the same identity as BASE's
    problem = mismatch([base, head, *sides])
    if problem and not args.allow_mismatch:
        raise CommentError(f"refusing to compare runs that differ in {problem}; pass --allow-mismatch to "
                           "compare anyway")
    ab = read_ab(args.ab) if args.ab else read_ab(args.head)
    if args.ab and ab is None:
        raise CommentError(f"{args.ab}: no 'ab' section; is it kvcache ab's --json output?")
    verdict, body = build(base, head, ab=ab, report_url=args.report_url, limit=args.max_chars,
                          labels=(args.base_label, args.head_label))  # RecordError: settings that cannot judge
    if args.out:
        write_output("--out", args.out, body)
        print(f"kvcache comment: {verdict}; body written to {args.out} ({len(body)} characters)", file=sys.stderr)
    else:
        sys.stdout.write(body)
        sys.stdout.flush()
    return exits.PASS
