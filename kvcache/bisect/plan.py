"""What every ``kvcache bisect`` (and ``kvcache sentinel``) probe runs and what a bisect walks: the probe options
and their checks (:func:`add_probe_options`, :func:`probe_caches`, :func:`probe_suite`), the release range
and the commit range made into a :class:`kvcache.bisect.walk.Plan` (:func:`make_plan`). Runs git and, with
``--releases``, ``pip index versions``; measures nothing. Standard library only."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from kvcache.analysing import files
from kvcache.analysing import releases as installer
from kvcache.analysing.settings import DRIVERS
from kvcache.bisect import search
from kvcache.bisect.probing import (
    DEFAULT_CACHES,
    PRELOAD,
    PRELOAD_FAMILY,
    PROBE_TIMEOUT,
    BisectError,
    ProbeCache,
    Revision,
    Suite,
    default_cache_dir,
    probe_env,
)
from kvcache.bisect.runners import (
    CommitRunner,
    ReleaseRunner,
    check_transformers,
    commit_range,
    git,
    repository,
    resolve_rev,
    revision_of,
)
from kvcache.bisect.walk import Plan


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
    from kvcache.analysing.presets import ModelError, check_name  # standard library only

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


#: The plugin's own check of an ``arch:`` model type (:func:`kvcache.measuring.architectures.check_type`, what
#: ``--kv-model arch:X`` answers in the suite), run by :func:`check_arch_model` in a Python of its own: exit 1 and the
#: one line when the release lacks the type, 3 when the check cannot run there.
CHECK_TYPE = """import sys
from kvcache.analysing.presets import ARCH_PREFIX, ModelError, split_layers
try:
    from kvcache.measuring.architectures import check_type
    check_type(split_layers(sys.argv[1])[0][len(ARCH_PREFIX):])
except ModelError as exc:
    print(exc)
    sys.exit(1)
except Exception:
    sys.exit(3)
"""


def check_arch_model(model: str, runner: Any, item: Revision, option: str) -> None:
    """``--model arch:<type>`` checked before any probe, by the suite's own check run against ``item``'s
    Transformers (the bad end: its worktree, or its release installed; what its probe would import) in a Python of
    its own, so that this process imports no torch: BisectError (one line naming the value and ``kvcache
    architectures --list``) when that release has no such decoder-only type, the runner closed (its worktree
    removed). A check that cannot run (the end does not check out or install, no torch here) says nothing: the probes
    say it then."""
    from kvcache.analysing.presets import ARCH_PREFIX

    if not model.startswith(ARCH_PREFIX):
        return
    try:
        first_on_path = runner.environment(item)
        done = subprocess.run([sys.executable, "-c", CHECK_TYPE, model], capture_output=True, text=True,
                              env=probe_env(first_on_path), cwd=first_on_path, timeout=PROBE_TIMEOUT)
    except (BisectError, installer.ReleaseError, subprocess.TimeoutExpired):
        return
    if done.returncode == 1 and done.stdout.strip():
        runner.close()
        line = done.stdout.strip().splitlines()[-1].replace("--kv-model ", "--model ", 1)
        raise BisectError(f"{line} (checked at {option})")


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


def make_plan(args: argparse.Namespace, extra: list[str], workdir: Path, say: Callable[[str], None]) -> Plan:
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
        items = [Revision(f"release-{v}", v) for v in chosen]
        root = Path(args.versions_dir).expanduser().resolve()
        cache = ProbeCache(cache_root, {**suite.identity(), "mode": "releases"})
        runner = ReleaseRunner(root, suite)
        check_arch_model(args.model, runner, items[-1], f"transformers {last}")
        return Plan((items[0], items[-1]), items[1:], runner, cache,
                    search.bisect_measures()[args.measure], args.cls, f"releases {first}..{last}", notes, "releases")
    top = repository(args.repo)
    good = resolve_rev(top, args.good, "--good")
    bad = resolve_rev(top, args.bad, "--bad")
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
    runner = CommitRunner(top, suite)
    check_arch_model(args.model, runner, items[-1], f"--bad {args.bad}")
    return Plan((revision_of(top, good), items[-1]), items, runner, cache,
                search.bisect_measures()[args.measure], args.cls, f"repo {top}", notes)
