"""``kvcache compare RUN.json RUN.json ...``: runs side by side, the first as baseline; exit 1 on a regression. This
module is the command's parser (the judge's rule options from the options table) and its work; the comparison is
:mod:`kvcache.analysing.compare`'s, its text :mod:`kvcache.analysing.compare_render`'s (docs/reports.md). No torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kvcache import cli, exits
from kvcache.analysing import arguments
from kvcache.analysing.compare import RULES_FROM, compare, mismatch
from kvcache.analysing.compare_render import render_markdown, render_text
from kvcache.analysing.records import RecordError, load_runs


def parser() -> argparse.ArgumentParser:
    """The command's arguments; the rule options from the options table."""
    made = argparse.ArgumentParser(
        prog="kvcache compare",
        description="Compare benchmark JSON runs against the first (the baseline) with the gate's judge; exit 1 "
        "on a regression, 2 on unreadable input, bad options or runs that are not comparable.",
    )
    made.add_argument("runs", nargs="+", metavar="RUN.json", help="pytest --benchmark-json files; first = baseline")
    made.add_argument("--markdown", action="store_true", help="print a GitHub-flavoured Markdown table")
    arguments.add_rule_options(made)
    made.add_argument("--rules", choices=RULES_FROM, default="each",
                      help="whose recorded --kv-* rules judge each later run: its own (each, the default) or the "
                      "first run's (first: a pull request's head cannot loosen its own gate)")
    made.add_argument("--require-classes", action="store_true",
                      help="every class with counted passes in the first run must have counted passes in each "
                      "later run: one skipped, unsupported or not run there is a regression (a pull request's "
                      "head cannot drop a class from its own gate)")
    made.add_argument("--strict", "--kv-strict", action="store_true",
                      help="what --kv-strict fails in the suite fails here too, exit 1: an inconclusive timed verdict "
                      "(noise, a poor fit, drift beyond --max-drift) and a class a later run skipped where the first "
                      "run has its figures (by default both are shown, not failed, whatever --kv-strict a run was "
                      "made with)")
    made.add_argument(
        "--allow-mismatch", "--allow-device-mismatch", dest="allow_mismatch", action="store_true",
        help="compare runs whose identity differs (device, model, dtype, threads) anyway",
    )
    return made


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(parser, work, argv, errors=(RecordError,))


def work(args: argparse.Namespace) -> int:
    """The comparison printed; 1 on a regression (and under --strict on what --kv-strict fails)."""
    try:
        rules = arguments.rules_given(args)
    except ValueError as exc:
        raise cli.UsageError(str(exc)) from None
    runs = [run for path in args.runs for run in load_runs(path)]  # an A/B run (kvcache ab --json): its two sides
    problem = mismatch(runs)
    if problem and not args.allow_mismatch:
        raise cli.UsageError(f"refusing to compare runs that differ in {problem}; pass --allow-mismatch to compare "
                             "anyway")
    comparison = compare(runs, **rules, rules_from=args.rules, require_classes=args.require_classes,
                         strict=args.strict)
    print(render_markdown(comparison) if args.markdown else render_text(comparison), flush=True)
    if args.markdown:  # stdout goes to the step summary; say it in the log too
        for regression in comparison.regressions + comparison.strict_failures:
            cli.say(regression.line(), err=True)
    return exits.REGRESSION if comparison.regressions or comparison.strict_failures else exits.PASS
