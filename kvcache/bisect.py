"""``kvcache bisect``: which commit of Transformers (or which release) changed a counted figure.

    kvcache bisect --repo PATH --good REV --bad REV [--measure passes] [--class NAME] [--model tiny]
                   [--caches dynamic,static] [--attention NAME] [--driver loop] [--batch 1] [--json OUT]
                   [--cache-dir DIR] [-- PYTEST ARGS]
    kvcache bisect --releases 5.22.2..5.24.0 [--versions-dir .versions] [...the same options]

Each probe runs the counted suite (``pytest --pyargs kvcache.benchmarks -m counted``, ``--kv-device cpu`` unless
a device is given after ``--``) in a process of its own against one commit's source: a git worktree of the
repository (a temporary folder, detached, removed at the end) whose ``src/`` goes first on ``PYTHONPATH``: no
install, no network. A commit git cannot check out is skipped with its reason. The probes are forked from one
server process that imported torch and pytest once (:mod:`kvcache.bisect_server`; not used when a thread besides
the main one is alive after its imports or CUDA is initialised there, nor with ``--no-fork-server``: then a new
interpreter each).
With ``--releases`` a probe is a published release instead, installed side by side into
``--versions-dir/<release>`` by the one installer (:mod:`kvcache.releases`; this environment's own release is used
as it is). This command never imports torch: it reads each probe's run JSON (``kv.traffic``, ``kv.memory``).

Counted figures are exact: a probe is *bad* when its figure differs from the good end's by more than the counted
judge's tolerance (:func:`kvcache.bisect_search.tolerance`) in the direction of the bad end, *good* otherwise, and a
commit that cannot be imported or run is *skipped* with its reason, never blamed. The figure (``--measure``):
counted passes (default), ATen ops per step, weight passes, or memory held/peak/allocated per step where the run
has it; of ``--class``, or by default of the first class whose figure differs between the ends (the others are
listed with their own ends). When the first bad commit does not account for the whole difference, the bisect goes
on from it in the rest of the range. Commits are those of ``git rev-list --first-parent good..bad``; where ``good``
is not an ancestor of ``bad`` (patch tags on release branches) their merge base is the good end, and that is said.

A commit between two releases reports the next release's number (``5.24.0.dev0``). Where the compat layer can only
gate on that number (:class:`kvcache.measuring.compat.InstalledVersion`), the probe is listed as not to be trusted,
with the gates it took.

Probe results (figures and skips, not timeouts) are cached by (commit or release, identity: the suite options with
the device, the pytest arguments after ``--`` with the content of a plugin module or file they name, torch, Python,
the packages a probe imports besides Transformers and the source of the whole kvcache package) in
``$XDG_CACHE_HOME/kvcache-passes/bisect`` (``~/.cache/...``) or ``--cache-dir``, so a second bisect over the same
range costs nothing. ``--json OUT`` writes everything: ``first_bad`` (the full sha, or the release), ``before``,
``after``, ``measure``, ``probes``, ``changes``, ``others``.

Exit status: 0 the first bad commit was found, 1 the two ends show no change (said after probing them), 2 bad input
(one line, before anything runs) or an end that cannot be measured, 3 only skipped commits are left where the
change is (they are listed), 130 interrupted (finished probes stay cached).

The parts: :mod:`kvcache.bisect_probes` (a probe, the suite it runs, the cache), :mod:`kvcache.bisect_runners` (git,
releases), :mod:`kvcache.bisect_server` (the fork server), :mod:`kvcache.bisect_report` (the output) and
:mod:`kvcache.bisect_search` (the judging and the search); this module walks the range.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

from kvcache import bisect_search as search
from kvcache import releases as installer
from kvcache.analysing import files
from kvcache.bisect_probes import (
    DEFAULT_CACHES,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    PRELOAD,
    PRELOAD_FAMILY,
    PROBE_TIMEOUT,
    BisectError,
    Item,
    ProbeCache,
    Suite,
    default_cache_dir,
)
from kvcache.bisect_report import report
from kvcache.bisect_runners import (
    CommitRunner,
    ReleaseRunner,
    check_transformers,
    commit_range,
    describe,
    git,
    repository,
    resolve,
)
from kvcache.bisect_walk import Bisect, Plan
from kvcache.settings import DRIVERS

# --- the command ---------------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvcache bisect",
        description="Find the Transformers commit (or release) that changed a counted figure: each probe runs the "
                    "counted suite against one commit's source (a git worktree's src/ first on PYTHONPATH; no "
                    "install, no network) or one release installed side by side. Exit 0 found, 1 no change between "
                    "the ends, 2 bad input, 3 only skipped commits left where the change is. Extra pytest "
                    "arguments for every probe go after --.")
    p.add_argument("--repo", help="a Transformers git checkout (its src/transformers is probed)")
    p.add_argument("--good", help="a revision whose figure is the old one (a tag such as v5.22.2, a sha)")
    p.add_argument("--bad", help="a later revision whose figure changed")
    p.add_argument("--releases", metavar="A..B", help="walk the published releases from A to B instead (patch "
                   "releases included; pip index versions, needs the network) and name the first with the change")
    p.add_argument("--versions-dir", default=".versions", help="where --releases installs releases (.versions)")
    p.add_argument("--measure", default="passes", choices=list(search.MEASURES),
                   help="the figure: counted passes (default), ops (ATen ops per step), weight (weight passes), "
                        "held/peak/allocated (memory per step, where the runs have it), gpu:<class> (counted passes "
                        "under the SDPA backend torch would select on that GPU class: --kv-gpus is added)")
    p.add_argument("--class", dest="cls", metavar="NAME",
                   help="the class whose figure is bisected (default: the first whose figure differs at the ends)")
    p.add_argument("--json", metavar="OUT", help="write the result as JSON (first_bad, before, after, measure, "
                                                 "probes, ...)")
    add_probe_options(p)
    return p


def add_probe_options(p: argparse.ArgumentParser) -> None:
    """The options of how every probe runs the counted suite and where probes are cached (``kvcache bisect`` and
    ``kvcache sentinel``)."""
    p.add_argument("--model", default="tiny", help="--kv-model of every probe (default tiny)")
    p.add_argument("--caches", default=DEFAULT_CACHES, help=f"--kv-caches of every probe (default {DEFAULT_CACHES})")
    p.add_argument("--attention", help="--kv-attn of every probe (where the suite has it)")
    p.add_argument("--driver", choices=DRIVERS, help="--kv-driver of every probe")
    p.add_argument("--batch", type=_positive, help="--kv-batch of every probe")
    p.add_argument("--cache-dir", help=f"probe cache (default {default_cache_dir()})")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the probe cache")
    p.add_argument("--no-fork-server", action="store_true",
                   help="start every probe as a new interpreter (by default probes are forked from one process that "
                        "imported torch and pytest once, where forking is safe: one thread, no CUDA)")
    p.add_argument("--probe-timeout", type=_positive, default=PROBE_TIMEOUT,
                   help=f"seconds a probe may run before it is skipped (default {PROBE_TIMEOUT})")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def release_range(text: str, say: Callable[[str], None]) -> tuple[str, str]:
    if text.count("..") != 1:
        raise BisectError(f"--releases {text!r} is not a range A..B (e.g. 5.22.2..5.24.0)")
    ends = []
    for part in text.split(".."):
        try:
            ends.append(installer.normalised(part, "--releases", say))
        except installer.ReleaseError as exc:
            raise BisectError(f"--releases {text!r}: {exc}") from None
    if installer.version_key(ends[0]) >= installer.version_key(ends[1]):
        raise BisectError(f"--releases {text!r} is an empty range: {ends[0]} is not older than {ends[1]}")
    return ends[0], ends[1]


def probe_caches(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """The classes every probe runs (``--caches``), after checking ``--model`` and the pytest arguments after
    ``--``; BisectError (one line) on bad input."""
    from kvcache.measuring.presets import ModelError, check_name  # standard library only

    try:
        check_name(args.model)
    except ModelError as exc:
        raise BisectError(str(exc)) from None
    caches = [c.strip() for c in args.caches.split(",") if c.strip()]
    if not caches:
        raise BisectError(f"--caches {args.caches!r} names no class")
    for bad in ("--benchmark-json", "--kv-update-baseline", "--kv-baseline"):
        if any(a == bad or a.startswith(bad + "=") for a in extra):
            raise BisectError(f"{bad} after -- is the bisect's own: leave it out")
    return caches


def probe_suite(args: argparse.Namespace, caches: list[str], extra: list[str], workdir: Path,
                say: Callable[[str], None], releases: bool) -> tuple[Suite, Path | None]:
    """The suite every probe runs (:func:`add_probe_options`) and the probe cache's folder (None: ``--no-cache``)."""
    suite = Suite(args.model, ",".join(caches), args.attention, args.driver, args.batch, extra, workdir,
                  args.probe_timeout, None if args.no_fork_server else
                  PRELOAD + (() if releases else PRELOAD_FAMILY), say=say)
    cache_root = None if args.no_cache else Path(args.cache_dir).expanduser() if args.cache_dir \
        else default_cache_dir()
    problem = files.paths_problem(folders=[
        ("--cache-dir" if args.cache_dir else "the probe cache", cache_root, ()),
        ("--versions-dir", Path(args.versions_dir).expanduser() if releases else None, ())])
    if problem:
        raise BisectError(problem)
    return suite, cache_root


def published_range(first: str, last: str) -> list[str]:
    """Every published release (``pip index versions``), oldest first, after checking that ``first`` and ``last``
    are among them; BisectError naming the releases around one that is not."""
    try:
        listed = installer.published()
    except installer.ReleaseError as exc:
        raise BisectError(str(exc)) from None
    for end in (first, last):
        if end not in listed:
            key = installer.version_key(end)
            near = [*[v for v in listed if installer.version_key(v) < key][-1:],
                    *[v for v in listed if installer.version_key(v) > key][:1]]
            raise BisectError(f"--releases: transformers {end} is not published (the releases around it: "
                              f"{', '.join(near) or 'none'})")
    return listed


def prepare(args: argparse.Namespace, extra: list[str], workdir: Path, say: Callable[[str], None]) -> Plan:
    """Check every input and build the plan; BisectError (one line) on bad input. Runs git, and with ``--releases``
    ``pip index versions``; measures nothing."""
    caches = probe_caches(args, extra)
    if args.cls and "all" not in caches and args.cls not in caches:
        raise BisectError(f"--class {args.cls!r} is not among --caches {','.join(caches)}")
    if args.releases and (args.repo or args.good or args.bad):
        raise BisectError("--releases walks published releases: give it without --repo/--good/--bad")
    if not args.releases and not (args.repo and args.good and args.bad):
        missing = [o for o, v in (("--repo", args.repo), ("--good", args.good), ("--bad", args.bad)) if not v]
        raise BisectError(f"give {', '.join(missing)} (or --releases A..B)")
    if args.measure.startswith("gpu:") and not any(a == "--kv-gpus" or a.startswith("--kv-gpus=") for a in extra):
        extra = [*extra, "--kv-gpus", args.measure.removeprefix("gpu:")]
    suite, cache_root = probe_suite(args, caches, extra, workdir, say, releases=bool(args.releases))
    problem = files.paths_problem(reads=[("--repo", args.repo)], writes=[("--json", args.json)])
    if problem:
        raise BisectError(problem)
    notes: list[str] = []
    if args.releases:
        first, last = release_range(args.releases, say)
        listed = published_range(first, last)
        chosen = [v for v in listed if installer.version_key(first) <= installer.version_key(v)
                  <= installer.version_key(last)]
        items = [Item(f"release-{v}", v) for v in chosen]
        root = Path(args.versions_dir).expanduser().resolve()
        cache = ProbeCache(cache_root, {**suite.identity(), "mode": "releases"})
        return Plan((items[0], items[-1]), items[1:], ReleaseRunner(root, suite), cache, search.MEASURES[args.measure],
                    args.cls, f"releases {first}..{last}", notes, "releases")
    top = repository(args.repo)
    good = resolve(top, args.good, "--good")
    bad = resolve(top, args.bad, "--bad")
    check_transformers(top, bad, "--bad", args.bad)
    check_transformers(top, good, "--good", args.good)
    if good == bad:
        raise BisectError(f"--good {args.good} and --bad {args.bad} are the same commit: no commits between them")
    if git(top, "merge-base", "--is-ancestor", good, bad, check=False).returncode != 0:
        base = git(top, "merge-base", good, bad, check=False).stdout.strip()
        if not base:
            raise BisectError(f"--good {args.good} and --bad {args.bad} have no common ancestor in {top}")
        if base == bad:
            raise BisectError(f"--bad {args.bad} is an ancestor of --good {args.good}: no commits between them "
                              "(swap them to find where the figure came back)")
        note = (f"--good {args.good} is not an ancestor of --bad {args.bad}: bisecting from their merge base "
                f"{base[:12]}")
        notes.append(note)
        say(note)
        good = base
    items = commit_range(top, good, bad)
    if not items:
        raise BisectError(f"no commits between --good {args.good} and --bad {args.bad} on {args.bad}'s first-parent "
                          "line")
    cache = ProbeCache(cache_root, suite.identity())
    return Plan((describe(top, good), items[-1]), items, CommitRunner(top, suite), cache,
                search.MEASURES[args.measure], args.cls, f"repo {top}", notes)


def main(argv: list[str] | None = None) -> int:
    own, extra = split_argv(list(sys.argv[1:] if argv is None else argv))
    args = parser().parse_args(own)

    def say(line: str) -> None:
        print(line, flush=True)

    with files.signals_stop("kvcache bisect", KeyboardInterrupt):  # SIGTERM cleans up (the worktree) as Ctrl-C
        return _run(args, extra, say)


def _run(args: argparse.Namespace, extra: list[str], say: Callable[[str], None]) -> int:
    """The bisect, once the arguments are parsed; a first SIGINT or SIGTERM raises KeyboardInterrupt, later ones
    only print (:func:`kvcache.analysing.files.signals_stop`)."""
    workdir = Path(tempfile.mkdtemp(prefix="kvcache-bisect-"))
    plan = None
    try:
        try:
            plan = prepare(args, extra, workdir, say)
        except BisectError as exc:
            print(f"kvcache bisect: {exc}", file=sys.stderr)
            return EXIT_USAGE
        n = len(plan.items)
        say(f"kvcache bisect: {plan.where}: {n} {'releases' if plan.mode == 'releases' else 'commits'} after "
            f"{plan.ends[0].short} (good) up to {plan.ends[1].short} (bad); "
            f"{' '.join(plan.cache.identity['options'])}")
        bisect = Bisect(plan, say)
        try:
            result = bisect.run()
        except BisectError as exc:
            print(f"kvcache bisect: {exc}", file=sys.stderr)
            return EXIT_USAGE
        lines, doc = report(bisect, result)
        for line in lines:
            say(line)
        if args.json:
            files.write_text_atomically(args.json, json.dumps(doc, indent=1) + "\n")
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


if __name__ == "__main__":
    sys.exit(main())
