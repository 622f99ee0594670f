"""``kvcache export RUN.json --format FORMAT``: the arguments and the exit status; the figures are
:mod:`kvcache.analysing.export`'s."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from kvcache import cli, exits
from kvcache.analysing import arguments
from kvcache.analysing.export import FORMATS, export_names, github_action_benchmark, why_no_figure
from kvcache.analysing.files import write_output
from kvcache.analysing.records import RecordError, load_run


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="kvcache export",
        description="Write a run's figures in a format other tools read. github-action-benchmark: a JSON array "
        "for its customSmallerIsBetter tool, one entry per class and measure (counted passes, ATen ops per step, "
        "weight passes, timed passes and intercept with their interval as range, memory allocated, peak and held "
        "passes where recorded), each "
        "with name, unit, value and the run's identity as extra; a figure that is not a finite number is left "
        "out and named.",
    )
    made.add_argument("run", metavar="RUN.json", help="a pytest --benchmark-json file of the suite")
    made.add_argument("--format", required=True, metavar="FORMAT", help=f"one of: {', '.join(FORMATS)}")
    made.add_argument("--measures", default=",".join(export_names()),
                      help=f"comma-separated, from {', '.join(export_names())} (default: all the run has)")
    made.add_argument("--out", metavar="FILE", help="write here instead of to stdout")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(parser, work, argv, errors=(RecordError,))


def work(args: argparse.Namespace) -> int:
    """The run's figures in ``--format``, to ``--out`` or stdout."""
    if args.format not in FORMATS:
        print(f"kvcache export: --format {args.format!r} is not known; choose from {', '.join(FORMATS)}",
              file=sys.stderr)
        return exits.USAGE_ERROR
    measures = [m.strip() for m in args.measures.split(",") if m.strip()]
    unknown = [m for m in measures if m not in export_names()]
    if unknown or not measures:
        print(f"kvcache export: --measures {args.measures!r}: {', '.join(map(repr, unknown)) or 'none given'}; "
              f"choose from {', '.join(export_names())}", file=sys.stderr)
        return exits.USAGE_ERROR
    if arguments.paths_refused("kvcache export", reads=[("RUN.json", args.run)], writes=[("--out", args.out)]):
        return exits.USAGE_ERROR
    run = load_run(args.run)
    notes: list[str] = []
    entries = github_action_benchmark(run, measures, notes)
    if not entries:  # one line saying why
        cli.say(f"kvcache export: {args.run}: no figure to export for --measures {','.join(measures)}: "
                f"{why_no_figure(run, measures, notes)}", err=True)
        return exits.USAGE_ERROR
    for note in notes:
        cli.say(f"kvcache export: {note}", err=True)
    text = json.dumps(entries, indent=2) + "\n"
    if args.out:
        write_output("--out", args.out, text)
    else:
        sys.stdout.write(text)
    return exits.PASS
