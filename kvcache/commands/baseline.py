"""``kvcache baseline RUN.json [--baseline kv-baseline.json]``: record a finished run's passes as the
baseline (what ``--kv-update-baseline`` writes at the end of a session), without measuring again, by the
same rules: timed passes only from a fit that would itself be judged."""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Sequence

from kvcache import cli, exits
from kvcache.analysing import arguments
from kvcache.analysing.judge import baseline as baselines
from kvcache.analysing.records import RecordError, load_run


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="kvcache baseline",
        description="Record a finished run's passes (a --benchmark-json file) in the baseline file, by the rules "
                    "of --kv-update-baseline: counted passes always, timed passes only from a fit that would be "
                    "judged (positive, R² at least the run's --kv-min-r2, 3 or more contexts, drift checked and "
                    "within its limit, the session not interrupted).")
    made.add_argument("run", metavar="RUN.json", help="a --benchmark-json file written by the suite")
    made.add_argument("--baseline", default="kv-baseline.json", help="baseline file (default kv-baseline.json)")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(parser, work, argv)


def work(args: argparse.Namespace) -> int:
    """The run's figures recorded in the baseline file, each printed."""
    if arguments.paths_refused("kvcache baseline", reads=[("RUN.json", args.run)],
                               writes=[("--baseline", args.baseline)]):
        return exits.USAGE_ERROR
    try:
        run = load_run(args.run)
        recorded = run.datetime or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        entries, refused = baselines.record(args.baseline, run.record, recorded)
    except (RecordError, baselines.BaselineError) as exc:
        cli.say(f"kvcache baseline: {exc}", err=True)
        return exits.USAGE_ERROR
    except OSError as exc:  # every message names the file
        cli.say(f"kvcache baseline: {getattr(exc, 'filename', None) or args.baseline}: {baselines.error_line(exc)}",
                err=True)
        return exits.USAGE_ERROR
    for key, by_cache in entries.items():
        for cache, entry in by_cache.items():
            cli.say(f"{args.baseline}: {key}: {cache}: {figures_text(entry)}")
    for line in refused:
        cli.say(f"{args.baseline}: {line}")
    if not entries:  # nothing recorded: never a silent success
        from kvcache.analysing.export import export_names, why_no_figure

        cli.say(f"kvcache baseline: {args.run}: no figure recorded in {args.baseline}: "
                f"{'; '.join(refused) or why_no_figure(run, export_names())}", err=True)
        return exits.USAGE_ERROR
    return exits.PASS


def figures_text(entry: dict) -> str:
    """The figures of one recorded entry, ``counted_passes 3.000, ops_per_step 412, memory_held_passes 1.000``:
    its numbers (the passes, ops, intercept and memory figures), never an empty text."""
    keys = [*baselines.NUMBER_KEYS, *sorted(k for k in entry if k.startswith("memory_"))]
    shown = [f"{k} {entry[k]}" if isinstance(entry[k], int) else f"{k} {entry[k]:.3f}" for k in keys
             if isinstance(entry.get(k), (int, float)) and not isinstance(entry.get(k), bool)]
    return ", ".join(shown) or "recorded, with no figure to show"
