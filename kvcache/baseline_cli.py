"""``kvcache baseline RUN.json [--baseline kv-baseline.json]``: record a finished run's passes as the
baseline (what ``--kv-update-baseline`` writes at the end of a session), without measuring again."""

from __future__ import annotations

import argparse
import datetime
import sys

from kvcache import analysis, gate
from kvcache.records import RecordError, load_run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvcache baseline", description=__doc__.splitlines()[0])
    parser.add_argument("run", metavar="RUN.json", help="a --benchmark-json file written by the suite")
    parser.add_argument("--baseline", default="kv-baseline.json", help="baseline file (default kv-baseline.json)")
    args = parser.parse_args(argv)
    try:
        run = load_run(args.run)
        recorded = run.datetime or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        entries = analysis.record_baseline(args.baseline, run.kv, recorded)
    except (RecordError, gate.BaselineError) as exc:
        print(f"kvcache baseline: {exc}", file=sys.stderr)
        return 2
    for key, by_cache in entries.items():
        for cache, entry in by_cache.items():
            values = ", ".join(f"{k} {entry[k]:.3f}" for k in gate.PASSES_KEYS if entry.get(k) is not None)
            print(f"{args.baseline}: {key}: {cache}: {values}")
    return 0
