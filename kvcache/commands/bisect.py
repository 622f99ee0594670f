"""``kvcache bisect``: which commit of Transformers (or which release) changed a counted figure. This module is the
command's parser and its work: the arguments, the output and the exit status (docs/bisect.md); a probe, its cache,
the search and the walk over the range are :mod:`kvcache.bisect`'s. Never imports torch."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kvcache import cli, exits
from kvcache.analysing import files
from kvcache.bisect import search
from kvcache.bisect.plan import add_probe_options, make_plan
from kvcache.bisect.probing import BisectError
from kvcache.bisect.report import report
from kvcache.bisect.walk import Bisect


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="kvcache bisect",
        description="Find the Transformers commit (or release) that changed a counted figure: each probe runs the "
                    "counted suite against one commit's source (a git worktree's src/ first on PYTHONPATH; no "
                    "install, no network) or one release installed side by side. Extra pytest arguments for every "
                    "probe go after --.")
    made.add_argument("--repo", help="a Transformers git checkout (its src/transformers is probed)")
    made.add_argument("--good", help="a revision whose figure is the old one (a tag such as v5.22.2, a sha)")
    made.add_argument("--bad", help="a later revision whose figure changed")
    made.add_argument("--releases", metavar="A..B", help="walk the published releases from A to B instead (patch "
                      "releases included; pip index versions, needs the network) and name the first with the change")
    made.add_argument("--versions-dir", default=".versions", help="where --releases installs releases (.versions)")
    made.add_argument("--measure", default=search.DEFAULT_MEASURE, choices=list(search.bisect_measures()),
                      help="the figure: counted passes (default), ops (ATen ops per step), weight (weight passes), "
                           "held/peak/allocated (memory per step, where the runs have it), gpu:<class> (counted passes "
                           "under the SDPA backend torch would select on that GPU class: --kv-gpus is added)")
    made.add_argument("--class", dest="cls", metavar="NAME",
                      help="the class whose figure is bisected (default: the first whose figure differs at the ends)")
    made.add_argument("--json", metavar="OUT", help="write the result as JSON (first_bad, before, after, measure, "
                                                    "probes, ...)")
    add_probe_options(made)
    return made


def main(argv: Sequence[str] | None = None) -> int:
    # SIGTERM cleans up (the worktree) as Ctrl-C does
    return cli.run(parser, work, argv, extra=True, errors=(BisectError,), stop=KeyboardInterrupt)


def work(args: argparse.Namespace, extra: list[str]) -> int:
    """The bisect, once the arguments are parsed; a first SIGINT or SIGTERM raises KeyboardInterrupt."""

    def say(line: str) -> None:
        cli.say(line)

    workdir = Path(tempfile.mkdtemp(prefix="kvcache-bisect-"))
    plan = None
    try:
        plan = make_plan(args, extra, workdir, say)
        n = len(plan.items)
        say(f"kvcache bisect: {plan.where}: {n} {'releases' if plan.mode == 'releases' else 'commits'} after "
            f"{plan.ends[0].short} (good) up to {plan.ends[1].short} (bad); "
            f"{' '.join(plan.cache.identity['options'])}")
        bisect = Bisect(plan, say)
        result = bisect.run()
        lines, doc = report(bisect, result)
        for line in lines:
            say(line)
        if args.json:
            files.write_output("--json", args.json, json.dumps(doc, indent=1) + "\n")
            say(f"written: {args.json}")
        return result.exit
    except KeyboardInterrupt:
        where = plan.cache.folder if plan is not None else None
        print("kvcache bisect: interrupted" + (f"; the probes finished so far are kept in {where}" if where else ""),
              file=sys.stderr)
        return exits.INTERRUPTED
    finally:
        if plan is not None:
            plan.runner.close()
        shutil.rmtree(workdir, ignore_errors=True)

