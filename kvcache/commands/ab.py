"""``kvcache ab``: two environments measured side by side in one session, B judged against A from paired points. This
module is the command's parser and its checks before anything runs; the session is :mod:`kvcache.ab.session`'s,
the sides, the ABBA schedule, the results and the extensions :mod:`kvcache.ab`'s (docs/ab.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kvcache import cli, exits
from kvcache.ab import extend, session
from kvcache.ab.session import Interrupted
from kvcache.ab.sides import ABError, refused
from kvcache.analysing import arguments
from kvcache.analysing.options import option

#: The judge's relative tolerance (``--kv-tolerance``), whose default and accepted values ``--tolerance`` takes.
TOLERANCE = option("--kv-tolerance")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvcache ab", description="Measure two environments side by side in one session (interleaved, ABBA) "
        "and judge B against A from paired points: timed passes, intercept and per-op ledger by the B/A ratio with "
        "a paired bootstrap interval; counted passes and overhead by compare's judge. Common pytest options go "
        "after --.")
    for side in ("a", "b"):
        p.add_argument(f"--{side}-env", action="append", metavar="NAME=VALUE",
                       help=f"an environment variable of side {side.upper()} (repeatable)")
        p.add_argument(f"--{side}-args", metavar="ARGS", help=f"pytest arguments of side {side.upper()} only, "
                       "e.g. \"-p mypatch\"")
        p.add_argument(f"--{side}-release", metavar="VERSION", help=f"side {side.upper()} on this Transformers "
                       "release, installed side by side into --versions-dir")
    p.add_argument("--versions-dir", default=".versions", help="where releases are installed (default .versions)")
    p.add_argument("--out-dir", default=".kvcache-ab", help="each side's log (a.log, b.log; default .kvcache-ab)")
    p.add_argument("--json", metavar="OUT", help="write both sides' runs and the paired verdicts to OUT")
    default = TOLERANCE.default
    p.add_argument("--tolerance", default=f"{default:.2f}", help=f"allowed B/A ratio above 1 (default {default:.2f}: "
                   f"×{1 + default:.2f}); improvement below 1/(1 + tolerance)")
    p.add_argument("--more-rounds-within", default="0", metavar="MINUTES", help="when a paired timed verdict is "
                   "inconclusive for a reason more rounds can help (its interval straddles the bound, paired drift, "
                   "too few paired contexts), run more rounds of the timed items and judge again on all pairs, "
                   "within this many minutes in all (default 0: off)")
    return p


def parse_minutes(text: str) -> float:
    """``--more-rounds-within``: a finite number of minutes, 0 or more (0: off); ABError (one line) otherwise."""
    try:
        minutes = float(text)
        if not minutes >= 0 or minutes == float("inf"):
            raise ValueError
    except ValueError:
        raise ABError(f"--more-rounds-within {text!r}: expected a number of minutes, 0 or more (0: off)") from None
    return minutes


def parse_tolerance(text: str) -> float:
    """``--tolerance``: a finite number of 0 or more; ABError (one line) otherwise."""
    try:
        tolerance = float(text)
        if not tolerance >= 0 or tolerance == float("inf"):
            raise ValueError
    except ValueError:
        raise ABError(f"--tolerance {text!r}: expected {TOLERANCE.accepts} (e.g. {TOLERANCE.default:.2f})") from None
    return tolerance


#: The files ``kvcache ab`` writes into ``--out-dir``: each side's log and its release's install log; with
#: ``--more-rounds-within``, each extension's logs too (:data:`kvcache.ab.extend.MORE_LOGS`).
OUT_DIR_FILES = ("a.log", "b.log", "a-install.log", "b-install.log")


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(parser, work, argv, extra=True, errors=(ABError,), stop=Interrupted)


def work(args: argparse.Namespace, common: list[str]) -> int:
    """The options checked (one line, exit 2, before anything runs), then the session
    (:func:`kvcache.ab.session.run_session`)."""

    def say(text: str) -> None:
        cli.say(text, err=True)

    tolerance = parse_tolerance(args.tolerance)
    args.more_rounds_within = parse_minutes(args.more_rounds_within)
    refused(common, "the common options (after --)")
    out_dir = Path(args.out_dir)
    logs = OUT_DIR_FILES + (extend.MORE_LOGS if args.more_rounds_within else ())
    folders = [("--out-dir", out_dir, logs)]
    if args.a_release or args.b_release:
        folders.append(("--versions-dir", args.versions_dir, ()))
    if arguments.paths_refused("kvcache ab", writes=[("--json", args.json)], folders=folders):
        return exits.USAGE_ERROR
    return session.run_session(args, common, tolerance, out_dir, say)


if __name__ == "__main__":
    sys.exit(main())
