"""What ``kvcache sentinel`` does once its arguments are parsed (:mod:`kvcache.commands.sentinel`): the state
file (:func:`read_state`), the branch walked commit by commit (:func:`run_commits`) or the releases replayed
(:func:`run_releases`), each changed figure bisected to its commit, and the outputs written (:func:`finish`).
Standard library only."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from kvcache import exits
from kvcache.analysing import files
from kvcache.analysing import releases as installer
from kvcache.analysing.records.file_formats import SentinelState
from kvcache.analysing.records.jsonrecord import RecordError
from kvcache.bisect import search
from kvcache.bisect.plan import probe_caches, probe_suite, published_range
from kvcache.bisect.probing import (
    EXIT_AMBIGUOUS,
    EXIT_FOUND,
    BisectError,
    ProbeCache,
    ProbeResult,
    Revision,
)
from kvcache.bisect.report import step_record
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
from kvcache.bisect.walk import Bisect, Plan
from kvcache.sentinel import figures as figs
from kvcache.sentinel import report

#: the sentinel's codes (kvcache.exits): a change (or a recovery) is its own 1, a head that cannot be measured could
#: not measure
EXIT_UNCHANGED, EXIT_CHANGED, EXIT_HEAD_UNMEASURED = exits.PASS, exits.REGRESSION, exits.NOT_MEASURED


# --- the state -----------------------------------------------------------------------------------------------------


def read_state(path: Path) -> SentinelState:
    """The state in ``path`` (:meth:`SentinelState.load`); BisectError (one line, exit 2) when it cannot be read, is
    not a sentinel's state or is a damaged one."""
    try:
        return SentinelState.load(path, f"--state {path}")
    except RecordError as exc:
        raise BisectError(str(exc)) from None


def origin_of(top: Path) -> str | None:
    """The repository's ``remote.origin.url`` (None: it has none), which binds a state to its repository."""
    return git(top, "config", "--get", "remote.origin.url", check=False).stdout.strip() or None


def branch_head(top: Path, branch: str) -> str:
    """The full sha of ``branch``'s head (a local branch, else ``origin/<branch>``); BisectError naming the
    branches there are."""
    for ref in (f"refs/heads/{branch}", f"refs/remotes/origin/{branch}"):
        done = git(top, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        if done.returncode == 0 and done.stdout.strip() and not branch.startswith("-"):
            return done.stdout.strip()
    listed = git(top, "for-each-ref", "--format=%(refname:short)", "refs/heads", "refs/remotes/origin",
                 check=False).stdout.split()
    raise BisectError(f"--branch {branch!r} is not a branch of {top} (its branches: {', '.join(listed) or 'none'})")


def author_date(top: Path, sha: str) -> str:
    return git(top, "show", "-s", "--format=%aI", sha, check=False).stdout.strip()


def is_ancestor(top: Path, older: str, newer: str) -> bool:
    return git(top, "merge-base", "--is-ancestor", older, newer, check=False).returncode == 0


# --- the walk ------------------------------------------------------------------------------------------------------


class SharedBisect(Bisect):
    """``kvcache bisect``'s walk, whose probes are shared by item with the other walks of one sentinel run (``memo``):
    every figure is bisected by a walk of its own, and no commit is probed twice."""

    def __init__(self, plan: Plan, say: Callable[[str], None], memo: dict[str, ProbeResult]):
        super().__init__(plan, say)
        self.memo = memo

    def probe(self, index: int) -> ProbeResult:
        if index not in self.probes and self.item(index).key in self.memo:
            self.probes[index] = self.memo[self.item(index).key]
            self.order.append(index)
        found = super().probe(index)
        self.memo[found.item.key] = found
        return found


def check_range(plan: Plan, reference: dict[str, float], head_kv: Any, memo: dict[str, ProbeResult],
                say: Callable[[str], None]) -> report.Found:
    """Compare the head's figures with ``reference`` and bisect every figure that moved over ``plan``'s range, each
    with a walk of its own (:class:`SharedBisect`)."""
    found = report.Found(head=figs.figures(head_kv))
    for moved in figs.moved_figures(reference, found.head):
        if moved.after is None:
            found.steps.append(report.lost(moved.key, moved.before, plan))
            say(f"{moved.key}: {moved.before:g} at {plan.ends[0].short}, not measured at {plan.ends[1].short}")
            continue
        watched = moved.after
        figure_plan = replace(plan, measure=watched.measure, cls=watched.cache)
        walk = SharedBisect(figure_plan, say, memo)
        try:
            result = walk.run()
        except BisectError as exc:
            found.steps.append(report.unbisected(watched, moved.before, figure_plan, str(exc)))
            continue
        if result.exit not in (EXIT_FOUND, EXIT_AMBIGUOUS) or not result.changes:
            found.steps.append(report.unbisected(watched, moved.before, figure_plan, "the walk found no change "
                                                 "between the ends (the last commit measures otherwise now)"))
            continue
        found.steps += [report.step(watched, step_record(walk, step), figure_plan) for step in result.changes]
    return found


def measure_end(walk: Bisect, index: int, what: str, say: Callable[[str], None]) -> ProbeResult:
    probe = walk.probe(index)
    say(walk.probe_line(index, what))
    return probe


# --- commits of a branch -------------------------------------------------------------------------------------------


def run_commits(args: argparse.Namespace, extra: list[str], workdir: Path, say: Callable[[str], None]) -> int:
    if not args.state:
        raise BisectError("give --state FILE (the last commit checked; --since REF starts it)")
    problem = files.outputs_problem([(o, p, True) for o, p in (("--state", args.state), ("--json", args.json),
                                                                ("--issue-out", args.issue_out)) if p])
    if problem:
        raise BisectError(problem)
    caches = probe_caches(args, extra)
    top = repository(args.repo)
    head = branch_head(top, args.branch)
    check_transformers(top, head, "--branch", args.branch)
    suite, cache_root = probe_suite(args, caches, extra, workdir, say, releases=False)
    cache = ProbeCache(cache_root, suite.identity())
    options = list(cache.identity["options"])
    state_path = Path(args.state)
    state = read_state(state_path) if state_path.exists() else None
    origin = origin_of(top)
    if state is not None:
        if args.since:
            say(f"--since {args.since} is for the first run: the state starts at {state.commit[:12]}")
        if state.options != options:
            raise BisectError(f"--state {state_path} was written for {' '.join(state.options)}, not "
                              f"{' '.join(options)}: give this suite a state of its own")
        if state.origin and origin and state.origin != origin:
            raise BisectError(f"--state {state_path} is of the repository {state.origin}, not {origin}")
        if state.branch != args.branch:
            raise BisectError(f"--state {state_path} watches --branch {state.branch}, not {args.branch}")
        if git(top, "cat-file", "-e", f"{state.commit}^{{commit}}", check=False).returncode != 0:
            raise BisectError(f"--state {state_path}: its last commit {state.commit[:12]} is not in {top} (a state "
                              "of another repository, or a clone too shallow to reach it)")
        if not is_ancestor(top, state.commit, head):
            raise BisectError(f"--state {state_path}: its last commit {state.commit[:12]} is not an ancestor of "
                              f"--branch {args.branch} (history rewritten?)")
        last = state.commit
    elif not args.since:
        raise BisectError(f"--state {state_path} does not exist yet: give --since REF, the first commit to measure")
    else:
        last = resolve_rev(top, args.since, "--since")
        check_transformers(top, last, "--since", args.since)
        if not is_ancestor(top, last, head):
            raise BisectError(f"--since {args.since} is not an ancestor of --branch {args.branch}")
    items = commit_range(top, last, head)
    start = revision_of(top, last)
    say(f"kvcache sentinel: repo {top} --branch {args.branch}: {len(items)} new commits after {start.short} "
        f"(last checked) up to {head[:12]}; {' '.join(options)}")
    runner = CommitRunner(top, suite)
    memo: dict[str, ProbeResult] = {}
    try:
        plan = Plan((start, items[-1] if items else start), items or [start], runner, cache,
                    search.followed(search.DEFAULT_MEASURE), None, f"repo {top}")
        walk = SharedBisect(plan, say, memo)
        reference = state.figures if state is not None else None
        notes: list[str] = []
        if state is not None and state.probe_identity != cache.identity_hash:
            notes.append(f"the suite or its environment changed since {start.short} was checked: it is measured "
                         "again, and its figures are the reference")
            say(notes[-1])
            reference = None
        if reference is None:
            probe = measure_end(walk, -1, "last", say)
            if probe.kv is None:
                raise BisectError(f"the starting commit {start.short} cannot be measured: {probe.reason}")
            reference = {k: w.value for k, w in figs.figures(probe.kv).items()}
        opened = list(state.open) if state is not None else []
        doc = report.document("commits", f"repo {top}", args.branch, start, revision_of(top, head), options, notes)
        doc["figures"] = reference
        if not items:
            say(f"no new commit on {args.branch} since {start.short}: nothing to check")
            new_state = SentinelState(commit=last, figures=reference, options=options,
                                  probe_identity=cache.identity_hash, origin=origin, branch=args.branch,
                                  open=opened, subject=start.subject, date=author_date(top, last))
            return finish(args, doc, new_state, report.Found(), [], opened, EXIT_UNCHANGED, memo, say)
        probe = measure_end(walk, len(items) - 1, "head", say)
        if probe.kv is None:
            say(f"the head {head[:12]} cannot be measured: {probe.reason}; nothing recorded")
            doc["status"], doc["reason"] = "head-unmeasured", probe.reason
            return finish(args, doc, None, report.Found(), [], opened, EXIT_HEAD_UNMEASURED, memo, say)
        found = check_range(plan, reference, probe.kv, memo, say)
        for step in found.steps:
            step["date"] = author_date(top, step["commit"]) if step.get("commit") else ""
        still, recovered = report.settle(opened, found, head)
        new_state = SentinelState(commit=head, figures={k: w.value for k, w in found.head.items()}, options=options,
                                  probe_identity=cache.identity_hash, origin=origin, branch=args.branch, open=still,
                                  subject=items[-1].subject, date=author_date(top, head))
        code = EXIT_CHANGED if found.steps or recovered else EXIT_UNCHANGED
        return finish(args, doc, new_state, found, recovered, still, code, memo, say)
    finally:
        runner.close()


def finish(args: argparse.Namespace, doc: dict[str, Any], state: SentinelState | None, found: report.Found,
           recovered: list[dict[str, Any]], still: list[dict[str, Any]], code: int, memo: dict[str, ProbeResult],
           say: Callable[[str], None]) -> int:
    """Say what was found, write ``--json``, ``--issue-out`` and then the state; ``code``."""
    report.fill(doc, found, recovered, still, code, list(memo.values()))
    for line in report.terminal_lines(doc):
        say(line)
    if args.json:
        files.write_output("--json", args.json, json.dumps(doc, indent=1) + "\n")
        say(f"written: {args.json}")
    if args.issue_out:
        files.write_output("--issue-out", args.issue_out, report.issue_out_body(doc))
        say(f"written: {args.issue_out}")
    if state is not None and getattr(args, "state", None):
        files.write_output("--state", args.state, json.dumps(state.to_json(), indent=1) + "\n")
        say(f"state: {state.commit[:12]} recorded in {args.state}")
    return code


# --- published releases --------------------------------------------------------------------------------------------


def replay_releases(text: str, say: Callable[[str], None]) -> list[str]:
    """The newest patch of every minor from FIRST's minor to LAST, oldest first (LAST given as a minor, ``5.24``: up to
    its newest patch; as a release, ``5.24.0``: up to that release)."""
    if text.count("..") != 1:
        raise BisectError(f"--releases {text!r} is not a range FIRST..LAST (e.g. 4.45..5.24)")
    try:
        first, last = (installer.normalise(part)[0] for part in text.split(".."))
    except installer.ReleaseError as exc:
        raise BisectError(f"--releases {text!r}: {exc}") from None
    if installer.version_key(first) >= installer.version_key(last):
        raise BisectError(f"--releases {text!r} is an empty range: {first} is not older than {last}")
    whole_minor = text.split("..")[1].strip().lstrip("vV").count(".") == 1  # LAST given as 5.24: its newest patch
    if whole_minor:
        try:
            listed = installer.published()
        except installer.ReleaseError as exc:
            raise BisectError(str(exc)) from None
    else:
        listed = published_range(last, last)
    cap = installer.version_key(last)[:2] if whole_minor else installer.version_key(last)
    chosen = installer.newest_per_minor([v for v in listed if installer.version_key(v)[:len(cap)] <= cap], first)
    if len(chosen) < 2:
        raise BisectError(f"--releases {text!r} holds fewer than two published minor releases")
    say(f"--releases {text}: the newest patch of every minor: {', '.join(chosen)}")
    return chosen


def run_releases(args: argparse.Namespace, extra: list[str], workdir: Path, say: Callable[[str], None]) -> int:
    if args.repo or args.state or args.since:
        raise BisectError("--releases replays published releases: give it without --repo/--state/--since")
    problem = files.outputs_problem([(o, p, True) for o, p in (("--json", args.json), ("--issue-out",
                                                                                          args.issue_out)) if p])
    if problem:
        raise BisectError(problem)
    caches = probe_caches(args, extra)
    chosen = replay_releases(args.releases, say)
    suite, cache_root = probe_suite(args, caches, extra, workdir, say, releases=True)
    cache = ProbeCache(cache_root, {**suite.identity(), "mode": "releases"})
    runner = ReleaseRunner(Path(args.versions_dir).expanduser().resolve(), suite)
    items = [Revision(f"release-{v}", v) for v in chosen]
    memo: dict[str, ProbeResult] = {}
    options = list(cache.identity["options"])
    started = time.monotonic()
    try:
        doc = report.document("releases", f"releases {chosen[0]}..{chosen[-1]}", None, items[0], items[-1],
                              options, [])
        total = report.Found()
        rows: list[dict[str, Any]] = []
        reference: dict[str, float] | None = None
        previous: Revision | None = None
        for item in items:
            plan = Plan((previous or item, item), [item], runner, cache, search.followed(search.DEFAULT_MEASURE), None,
                        f"releases {(previous or item).name}..{item.name}", mode="releases")
            walk = SharedBisect(plan, say, memo)
            probe = measure_end(walk, 0, "new", say)
            if probe.kv is None:
                rows.append({"release": item.name, "skipped": probe.reason, "changes": []})
                continue
            if reference is None or previous is None:
                found = report.Found(head=figs.figures(probe.kv))
            else:
                found = check_range(plan, reference, probe.kv, memo, say)
            rows.append({"release": item.name, "changes": found.steps})
            total.steps += found.steps
            reference, previous = {k: w.value for k, w in found.head.items()}, item
        doc["releases"] = rows
        doc["seconds"] = round(time.monotonic() - started, 1)
        code = EXIT_CHANGED if total.steps else EXIT_UNCHANGED
        return finish(args, doc, None, total, [], [], code, memo, say)
    finally:
        runner.close()
