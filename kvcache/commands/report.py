"""``kvcache report RUN.json [RUN.json ...] --out DIR``: the arguments and the exit status; what the report holds
and how it is drawn are :mod:`kvcache.analysing.report`'s."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from kvcache import cli, exits
from kvcache.analysing import arguments, files, report
from kvcache.analysing.compare import mismatch
from kvcache.analysing.records import RecordError, load_runs
from kvcache.analysing.report import REPORT_FILES, render
from kvcache.analysing.report.ab import write_ab
from kvcache.analysing.report.data import ReportError


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="kvcache report", description=report.__doc__.splitlines()[0])
    made.add_argument("runs", nargs="+", metavar="RUN.json", help="pytest-benchmark JSON written with the kv plugin")
    made.add_argument("--out", type=Path, default=Path("report"), help="output directory (default: report)")
    made.add_argument("--allow-mismatch", action="store_true",
                      help="report runs whose identity differs (device, model, dtype, threads) side by side anyway")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    """``kvcache report RUN.json [RUN.json ...] --out DIR``; exit 2 on unreadable input or output."""
    return cli.run(parser, work, argv, errors=(RecordError, ReportError))


def work(args: argparse.Namespace) -> int:
    """The report written into a temp folder beside ``--out``, then moved into it whole
    (:func:`kvcache.analysing.files.staged_folder`); each file's path printed."""
    if arguments.paths_refused("kvcache report", reads=[("RUN.json", path) for path in args.runs],
                               folders=[("--out", args.out, REPORT_FILES)]):
        return exits.USAGE_ERROR
    runs = [run for path in args.runs for run in load_runs(path)]  # an A/B run: its two sides
    problem = mismatch(runs)
    if problem and not args.allow_mismatch:
        raise ReportError(f"refusing to report runs that differ in {problem} side by side; pass "
                          "--allow-mismatch to report them anyway")
    with files.staged_folder("--out", args.out, REPORT_FILES, keep=(ReportError,)) as stage:
        paths = render(runs, stage)
        paths += [p for path in args.runs for p in write_ab(path, runs, stage)]  # kvcache ab --json: the pair
    for path in paths:
        print(args.out / path.name)
    return exits.PASS
