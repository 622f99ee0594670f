"""The runners of ``kvcache bisect``: git (the range, one detached worktree whose ``src/`` a probe puts first on
``PYTHONPATH``) and published releases installed side by side (:mod:`kvcache.analysing.releases`).
Standard library only."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kvcache.analysing import releases as installer
from kvcache.bisect.probing import BisectError, ProbeResult, Revision, Suite, version_of
from kvcache.cli import last_line


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``git -C repo ARGS`` with hooks and LFS downloads off; output captured as text."""
    env = {**os.environ, "GIT_LFS_SKIP_SMUDGE": "1", "GIT_TERMINAL_PROMPT": "0"}
    done = subprocess.run(["git", "-C", str(repo), "-c", "core.hooksPath=/dev/null", *args], capture_output=True,
                          text=True, env=env)
    if check and done.returncode != 0:
        raise BisectError(f"git {' '.join(args)} failed in {repo}: {last_line(done.stderr or done.stdout)}")
    return done


def resolve_rev(top: Path, rev: str, option: str) -> str:
    """The full sha of the commit ``rev`` names, or a BisectError naming it."""
    if not rev or rev.startswith("-"):
        raise BisectError(f"{option} {rev!r} is not a revision")
    done = git(top, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise BisectError(f"{option} {rev!r} is not a commit in {top} (an unknown revision)")
    return done.stdout.strip()


def repository(path: str) -> Path:
    """The top folder of the git repository at ``path``, or a BisectError."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise BisectError(f"--repo {path!r} is not a folder")
    done = git(folder, "rev-parse", "--show-toplevel", check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise BisectError(f"--repo {path!r} is not a git repository (nor inside one)")
    return Path(done.stdout.strip())


def check_transformers(top: Path, sha: str, option: str, rev: str) -> None:
    """A BisectError unless commit ``sha`` has ``src/transformers/__init__.py`` (a Transformers checkout)."""
    if git(top, "cat-file", "-e", f"{sha}:src/transformers/__init__.py", check=False).returncode != 0:
        raise BisectError(f"--repo {top} is not a Transformers checkout: {option} {rev} has no "
                          "src/transformers/__init__.py")


def commit_range(top: Path, good: str, bad: str) -> list[Revision]:
    """The commits after ``good`` up to ``bad`` on ``bad``'s first-parent line, oldest first."""
    done = git(top, "log", "--first-parent", "--reverse", "--format=%H%x1f%s%x1f%cI", f"{good}..{bad}")
    items = []
    for line in done.stdout.splitlines():
        sha, subject, date = (line.split("\x1f") + ["", ""])[:3]
        items.append(Revision(sha, sha, subject, date))
    return items


def revision_of(top: Path, sha: str) -> Revision:
    subject, date = (git(top, "show", "-s", "--format=%s%x1f%cI", sha).stdout.strip().split("\x1f") + [""])[:2]
    return Revision(sha, sha, subject, date)


# --- the runners: a worktree of a repository, or releases side by side -----------------------------------------


UNKNOWN = ""  # CommitRunner.current after a checkout that failed


class CommitRunner:
    """Probes commits of ``top`` in one detached worktree (a temporary folder, removed by :meth:`close`)."""

    def __init__(self, top: Path, suite: Suite):
        self.top, self.suite = top, suite
        self.tree = suite.workdir / "worktree"
        self.current: str | None = None
        self.count = 0

    def measure(self, item: Revision) -> ProbeResult:
        """The probe of commit ``item``; a commit git cannot check out is skipped with git's reason (not cached: it
        may check out another time), never the end of the bisect."""
        self.count += 1
        try:
            source = self.environment(item)
        except BisectError as exc:
            return ProbeResult(item, reason=f"cannot check it out: {exc}", cacheable=False)
        return self.suite.run(item, source, self.count)

    def environment(self, item: Revision) -> Path:
        """The folder first on a probe's ``PYTHONPATH`` for commit ``item``: the worktree's ``src`` checked out at
        it; BisectError when git cannot check it out."""
        self.checkout(item.name)
        return self.tree / "src"

    def checkout(self, sha: str) -> None:
        """Make the worktree commit ``sha``'s, with no stale bytecode of a file that changed; BisectError when git
        fails (the worktree's state is then unknown, and the next checkout cleans all its bytecode)."""
        if self.current == sha:
            return
        previous, self.current = self.current, UNKNOWN
        if not self.tree.exists():  # the first checkout, or the first ones failed
            git(self.top, "worktree", "add", "--detach", "--force", str(self.tree), sha)
        else:
            changed = None
            if previous:
                done = git(self.tree, "diff", "--name-only", previous, sha, "--", "src", check=False)
                changed = done.stdout.split() if done.returncode == 0 else None
            git(self.tree, "checkout", "--detach", "--force", "--quiet", sha)
            if changed is None:  # not known what changed: no bytecode is kept
                for cache in (self.tree / "src").rglob("__pycache__"):
                    shutil.rmtree(cache, ignore_errors=True)
            for name in changed or []:  # a stale bytecode file of the same size and second must never be run
                path = self.tree / name
                for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
                    pyc.unlink(missing_ok=True)
        self.current = sha

    def close(self) -> None:
        self.suite.close()
        if self.current is None and not self.tree.exists():
            return
        if git(self.top, "worktree", "remove", "--force", str(self.tree), check=False).returncode != 0:
            shutil.rmtree(self.tree, ignore_errors=True)
            git(self.top, "worktree", "prune", check=False)
        self.current = None


class ReleaseRunner:
    """Probes published releases, each installed side by side into ``root/<release>`` by
    :mod:`kvcache.analysing.releases`."""

    def __init__(self, root: Path, suite: Suite):
        self.root, self.suite = root, suite
        self.count = 0

    def measure(self, item: Revision) -> ProbeResult:
        self.count += 1
        try:
            target = self.environment(item)
        except installer.ReleaseError as exc:
            return ProbeResult(item, reason=str(exc), cacheable=False)
        probe = self.suite.run(item, target, self.count)
        if probe.kv is not None and probe.transformers != item.name:
            probe.kv, probe.cacheable = None, False
            probe.reason = f"the run imported transformers {probe.transformers}, not {item.name}"
        return probe

    def environment(self, item: Revision) -> Path:
        """The folder first on a probe's ``PYTHONPATH`` for release ``item``: where it is installed (an empty folder
        for this environment's own release); ReleaseError when it cannot be installed."""
        if item.name == version_of("transformers"):  # this environment's own release: nothing to install
            target = self.suite.workdir / "environment"
            target.mkdir(exist_ok=True)
            return target
        with open(self.suite.workdir / f"install-{item.name}.log", "w", encoding="utf-8") as log:
            return installer.ensure(item.name, self.root, log)

    def close(self) -> None:
        self.suite.close()

