"""``kvcache sentinel``: watch a Transformers branch commit by commit (or replay releases); when a counted figure
changed, name the commit. This module is the command's parser and its work; the state, the walk and the report are
:mod:`kvcache.sentinel`'s (docs/sentinel.md)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kvcache import cli, exits
from kvcache.bisect.plan import add_probe_options
from kvcache.bisect.probing import BisectError
from kvcache.sentinel.watching import run_commits, run_releases


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="kvcache sentinel",
        description="Measure a Transformers branch's head against the last commit checked (the state file); when a "
                    "counted figure changed beyond the gate's tolerance, bisect to the commit that changed it and "
                    "write an issue body. Extra pytest arguments for every probe go after --.")
    made.add_argument("--repo", help="a Transformers git checkout whose branch is watched")
    made.add_argument("--branch", default="main", help="the branch watched (default main)")
    made.add_argument("--state", metavar="FILE", help="the state: the last commit checked, its figures, the changes "
                                                      "not yet recovered (read, then replaced at the end)")
    made.add_argument("--since", metavar="REF", help="the first run's starting commit (measured); ignored once the "
                                                     "state exists")
    made.add_argument("--releases", metavar="FIRST..LAST", help="instead of --repo: replay the newest patch of every "
                      "minor release from FIRST's to LAST, each as if it were new (pip index versions: the network)")
    made.add_argument("--versions-dir", default=".versions", help="where --releases installs releases (.versions)")
    made.add_argument("--json", metavar="OUT", help="write the result as JSON (changes, recovered, open, issues)")
    made.add_argument("--issue-out", metavar="FILE.md", help="write a Markdown issue body naming every change")
    add_probe_options(made)
    return made


def main(argv: Sequence[str] | None = None) -> int:
    # the first SIGINT/SIGTERM stops the run like Ctrl-C (the state untouched)
    return cli.run(parser, work, argv, extra=True, stop=KeyboardInterrupt,
                   errors=(BisectError, subprocess.SubprocessError))  # SubprocessError: a git that could not run


def work(args: argparse.Namespace, extra: list[str]) -> int:
    """The branch's new commits (or the releases) measured, each change bisected, the result and the state
    written."""
    said: set[str] = set()

    def say(line: str) -> None:  # a probe's line once: each figure's walk shares the probes
        if line.startswith("  [") and line in said:
            return
        said.add(line)
        cli.say(line)

    workdir = Path(tempfile.mkdtemp(prefix="kvcache-sentinel-"))
    try:
        if bool(args.releases) == bool(args.repo):
            raise BisectError("give --repo PATH --state FILE (a branch, commit by commit) or --releases FIRST..LAST")
        return (run_releases if args.releases else run_commits)(args, extra, workdir, say)
    except KeyboardInterrupt:
        print("kvcache sentinel: interrupted; the state is as it was, finished probes stay cached", file=sys.stderr)
        return exits.INTERRUPTED
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

