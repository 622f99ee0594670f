"""``kvcache bisect``: which commit of Transformers (or which release) changed a counted figure.

    kvcache bisect --repo PATH --good REV --bad REV [--measure passes] [--class NAME] [--model tiny]
                   [--caches dynamic,static] [--attention NAME] [--driver loop] [--batch 1] [--json OUT]
                   [--cache-dir DIR] [-- PYTEST ARGS]
    kvcache bisect --releases 5.22.2..5.24.0 [--versions-dir .versions] [...the same options]

Each probe runs the counted suite (``pytest --pyargs kvcache.benchmarks -m counted``, ``--kv-device cpu`` unless
a device is given after ``--``) in a process of its own against one commit's source: a git worktree of the
repository (a temporary folder, detached, removed at the end) whose ``src/`` goes first on ``PYTHONPATH``: no
install, no network. A commit git cannot check out is skipped with its reason. The probes are forked from one
server process that imported torch and pytest once (:mod:`kvcache.bisect.server`; not used when a thread besides
the main one is alive after its imports or CUDA is initialised there, nor with ``--no-fork-server``: then a new
interpreter each).
With ``--releases`` a probe is a published release instead, installed side by side into
``--versions-dir/<release>`` by the one installer (:mod:`kvcache.analysing.releases`; this environment's own release is
used as it is). This command never imports torch: it reads each probe's run JSON (``kv.traffic``, ``kv.memory``).

Counted figures are exact: a probe is *bad* when its figure differs from the good end's by more than the counted
judge's tolerance (:func:`kvcache.bisect.search.tolerance`) in the direction of the bad end, *good* otherwise, and a
commit that cannot be imported or run is *skipped* with its reason, never blamed. The figure (``--measure``):
counted passes (default), ATen ops per step, weight passes, or memory held/peak/allocated per step where the run
has it; of ``--class``, or by default of the first class whose figure differs between the ends (the others are
listed with their own ends). When the first bad commit does not account for the whole difference, the bisect goes
on from it in the rest of the range. Commits are those of ``git rev-list --first-parent good..bad``; where ``good``
is not an ancestor of ``bad`` (patch tags on release branches) their merge base is the good end, and that is said.

A commit between two releases reports the next release's number (``5.24.0.dev0``). Where the compat layer can only
gate on that number (:class:`kvcache.measuring.compat.InstalledVersion`), the probe is listed as not to be trusted,
with the gates it took.

ProbeResult results (figures and skips, not timeouts) are cached by (commit or release, identity: the suite options with
the device, the pytest arguments after ``--`` with the content of a plugin module or file they name, torch, Python,
the packages a probe imports besides Transformers and the source of the whole kvcache package) in
``$XDG_CACHE_HOME/kvcache-passes/bisect`` (``~/.cache/...``) or ``--cache-dir``, so a second bisect over the same
range costs nothing. ``--json OUT`` writes everything: ``first_bad`` (the full sha, or the release), ``before``,
``after``, ``measure``, ``probes``, ``changes``, ``others``.

Exit status: 0 the first bad commit was found, 1 the two ends show no change (said after probing them), 2 bad input
(one line, before anything runs) or an end that cannot be measured, 3 only skipped commits are left where the
change is (they are listed), 130 interrupted (finished probes stay cached).

The parts: :mod:`kvcache.bisect.probing` (a probe, the suite it runs, the cache), :mod:`kvcache.bisect.runners` (git,
releases), :mod:`kvcache.bisect.server` (the fork server), :mod:`kvcache.bisect.report` (the output),
:mod:`kvcache.bisect.search` (the judging and the search) and :mod:`kvcache.bisect.walk` (the walk over the range);
this module parses the arguments, prints the result and returns the exit status.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kvcache import cli
from kvcache.analysing import files
from kvcache.bisect import search
from kvcache.bisect.plan import add_probe_options, make_plan
from kvcache.bisect.probing import EXIT_INTERRUPTED, BisectError
from kvcache.bisect.report import report
from kvcache.bisect.walk import Bisect


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="kvcache bisect",
        description="Find the Transformers commit (or release) that changed a counted figure: each probe runs the "
                    "counted suite against one commit's source (a git worktree's src/ first on PYTHONPATH; no "
                    "install, no network) or one release installed side by side. Exit 0 found, 1 no change between "
                    "the ends, 2 bad input, 3 only skipped commits left where the change is. Extra pytest "
                    "arguments for every probe go after --.")
    made.add_argument("--repo", help="a Transformers git checkout (its src/transformers is probed)")
    made.add_argument("--good", help="a revision whose figure is the old one (a tag such as v5.22.2, a sha)")
    made.add_argument("--bad", help="a later revision whose figure changed")
    made.add_argument("--releases", metavar="A..B", help="walk the published releases from A to B instead (patch "
                      "releases included; pip index versions, needs the network) and name the first with the change")
    made.add_argument("--versions-dir", default=".versions", help="where --releases installs releases (.versions)")
    made.add_argument("--measure", default="passes", choices=list(search.BISECT_MEASURES),
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
        print(line, flush=True)

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
        return EXIT_INTERRUPTED
    finally:
        if plan is not None:
            plan.runner.close()
        shutil.rmtree(workdir, ignore_errors=True)

