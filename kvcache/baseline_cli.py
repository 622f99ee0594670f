"""``kvcache baseline RUN.json [--baseline kv-baseline.json]``: record a finished run's passes as the
baseline (what ``--kv-update-baseline`` writes at the end of a session), without measuring again, by the
same rules: timed passes only from a fit that would itself be judged."""

from __future__ import annotations

import argparse
import datetime
import sys

from kvcache.analysing import baseline as baselines
from kvcache.analysing import files
from kvcache.analysing.records import RecordError, load_run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kvcache baseline",
        description="Record a finished run's passes (a --benchmark-json file) in the baseline file, by the rules "
                    "of --kv-update-baseline: counted passes always, timed passes only from a fit that would be "
                    "judged (positive, R² at least the run's --kv-min-r2, 3 or more contexts, drift checked and "
                    "within its limit, the session not interrupted).")
    parser.add_argument("run", metavar="RUN.json", help="a --benchmark-json file written by the suite")
    parser.add_argument("--baseline", default="kv-baseline.json", help="baseline file (default kv-baseline.json)")
    args = parser.parse_args(argv)
    problem = files_problem(args.run, args.baseline)
    if problem:
        print(f"kvcache baseline: {problem}", file=sys.stderr)
        return 2
    try:
        run = load_run(args.run)
        recorded = run.datetime or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        entries, refused = baselines.record(args.baseline, run.record, recorded)
    except (RecordError, baselines.BaselineError) as exc:
        print(f"kvcache baseline: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # every message names the file
        print(f"kvcache baseline: {getattr(exc, 'filename', None) or args.baseline}: {baselines.one_line(exc)}",
              file=sys.stderr)
        return 2
    for key, by_cache in entries.items():
        for cache, entry in by_cache.items():
            values = ", ".join(f"{k} {entry[k]}" if isinstance(entry[k], int) else f"{k} {entry[k]:.3f}"
                               for k in baselines.NUMBER_KEYS if entry.get(k) is not None)
            print(f"{args.baseline}: {key}: {cache}: {values}")
    for line in refused:
        print(f"{args.baseline}: {line}")
    return 0


def files_problem(run: str, baseline: str) -> str | None:
    """Before anything is read: the baseline is not the run file, and can be written (the probe of
    :func:`kvcache.analysing.files.write_problem`); the problem names the file."""
    return files.outputs_problem([("RUN.json", run, False), ("--baseline", baseline, True)])
