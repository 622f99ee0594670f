"""``kvcache bisect`` on real Transformers source: a git repository built here from the release installed in this
environment (its package as ``src/transformers``, with the tiny model's folders only), with planted commits:
unrelated edits, one that breaks an import and a later one that mends it, and one that adds a pass in DynamicCache's
update (a ``.clone()`` of the keys and values it returns: +2.00 counted passes). No network. One class on the tiny
model; the bisect runs once (five probes) and a second time from the cache. What the command checks before probing
runs in this process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import transformers
from kvrun import in_process, kvcache_command

from kvcache.commands import bisect as bisect_cli

CACHE_UTILS = "src/transformers/cache_utils.py"
UPDATE = """        self.values = torch.cat([self.values, value_states], dim=-2)
        return self.keys, self.values"""
PLANTED = """        self.values = torch.cat([self.values, value_states], dim=-2)
        return self.keys.clone(), self.values.clone()"""
BROKEN = "from .utils import this_name_does_not_exist  # planted\n"


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00"}
    done = subprocess.run(["git", "-C", str(repo), "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false",
                           "-c", "init.defaultBranch=main", *args], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def edit(repo: Path, path: str, change) -> None:
    file = repo / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(change(file.read_text() if file.exists() else ""))


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


#: The model folders the tiny model needs: the copy leaves out the other ~400 (they cost most of its files and of the
#: test's time to copy, commit and check out; Transformers imports a model's folder only when it is asked for).
MODEL_FOLDERS = {"auto", "llama"}


def copy_transformers(target: Path) -> None:
    source = Path(transformers.__file__).parent

    def ignore(folder: str, names: list[str]) -> list[str]:
        left = [n for n in names if n == "__pycache__" or n.endswith(".pyc")]
        if Path(folder) == source / "models":
            left += [n for n in names if (source / "models" / n).is_dir() and n not in MODEL_FOLDERS]
        return left

    shutil.copytree(source, target, ignore=ignore)


def build_repository(repo: Path) -> dict[str, str]:
    """The installed Transformers as ``src/transformers`` (the tiny model's folders only, reporting a development
    version, as a checkout of main does), then 5 commits; ``{name: sha}``. The range's middle is the broken commit,
    so the bisect skips it, then probes the mended one (good) and the planted one (bad): 5 probes with the ends."""
    repo.mkdir()
    git(repo, "init", "-q")
    copy_transformers(repo / "src" / "transformers")
    edit(repo, "src/transformers/__init__.py",
         lambda s: s.replace(f'__version__ = "{transformers.__version__}"', '__version__ = "9.1.0.dev0"'))
    edit(repo, "README.md", lambda s: "A copy of Transformers for kvcache bisect's test.\n")
    shas = {"base": commit(repo, "Transformers as installed")}
    edit(repo, "README.md", lambda s: s + "unrelated 1\n")
    shas["unrelated-1"] = commit(repo, "Unrelated: README")
    edit(repo, CACHE_UTILS, lambda s: BROKEN + s)
    shas["broken"] = commit(repo, "Break an import of cache_utils")
    edit(repo, CACHE_UTILS, lambda s: s.replace(BROKEN, ""))
    shas["mended"] = commit(repo, "Mend the import")
    assert (repo / CACHE_UTILS).read_text().count(UPDATE) == 1, (
        f"DynamicLayer.update of transformers {transformers.__version__} no longer ends as planted here: update UPDATE")
    edit(repo, CACHE_UTILS, lambda s: s.replace(UPDATE, PLANTED))
    shas["planted"] = commit(repo, "DynamicLayer.update hands out copies of its keys and values")
    edit(repo, "src/transformers/utils/__init__.py", lambda s: s + "\n# unrelated 2\n")
    shas["unrelated-2"] = commit(repo, "Unrelated: a comment in utils")
    return shas


def side_commit(repo: Path, parent: str, tmp_path: Path) -> str:
    """A commit on top of ``parent`` that ``main`` does not contain (a patch release on its branch), made without a
    checkout: ``parent``'s tree with one more file."""
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp_path / "side-index")}
    run = lambda *args, **kw: subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,  # noqa: E731
                                             env=env, check=True, **kw).stdout.strip()
    run("read-tree", parent)
    blob = run("hash-object", "-w", "--stdin", input="a patch on the side\n")
    run("update-index", "--add", "--cacheinfo", f"100644,{blob},PATCH.md")
    tree = run("write-tree")
    return git(repo, "commit-tree", tree, "-p", parent, "-m", "A patch release")


def bisect(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return kvcache_command("bisect", *args, cwd=cwd)


def bisect_here(capsys, *args: str) -> subprocess.CompletedProcess:
    return in_process(bisect_cli.main, capsys, *args)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("bisect")
    repo = root / "transformers"
    shas = build_repository(repo)
    return root, repo, shas


def test_bisect_names_the_planted_commit_and_skips_the_broken_one(planted):
    root, repo, shas = planted
    out = root / "bisect.json"
    args = ["--repo", str(repo), "--good", shas["base"], "--bad", "main", "--caches", "dynamic",
            "--cache-dir", str(root / "cache"), "--json", str(out)]
    done = bisect(*args, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["first_bad"] == shas["planted"], done.stdout
    assert doc["subject"] == "DynamicLayer.update hands out copies of its keys and values"
    assert doc["measure"]["name"] == "counted" and doc["measure"]["class"] == "dynamic"
    assert doc["before"] == pytest.approx(3.0) and doc["after"] == pytest.approx(5.0)
    assert doc["ops"] == {"clone": pytest.approx(2.0)}
    assert doc["parent"] == shas["mended"] and doc["accounts_for_all"] is True
    by_item = {p["item"]: p for p in doc["probes"]}
    broken = by_item[shas["broken"]]
    assert broken["verdict"] == "skip" and broken["figure"] is None
    assert "this_name_does_not_exist" in broken["reason"], broken
    assert by_item[shas["mended"]]["verdict"] == "good"
    assert by_item[shas["planted"]]["verdict"] == "bad"
    assert {p["transformers"] for p in doc["probes"] if p["figure"] is not None} == {"9.1.0.dev0"}
    assert all(p["untrusted"] == [] for p in doc["probes"])  # no version gate of dynamic's path is in doubt
    assert len(doc["probes"]) == 5
    text = done.stdout
    assert f"first bad commit: {shas['planted']}" in text
    assert "counted passes of dynamic: 3.00 -> 5.00 (+2.00)" in text and "ops that changed: clone +2.00" in text
    assert "this_name_does_not_exist" in text  # the skipped probe, with its reason
    assert git(repo, "worktree", "list").count("\n") == 0  # only the repository itself: the worktree is gone

    again = bisect(*args, cwd=root)  # every probe from the cache: nothing runs
    assert again.returncode == 0, again.stdout + again.stderr
    second = json.loads(out.read_text())
    assert second["first_bad"] == shas["planted"]
    assert all(p["cached"] for p in second["probes"]), second["probes"]
    assert git(repo, "worktree", "list").count("\n") == 0  # only the repository itself: no worktree left

    full = bisect(*args[:-1], "/dev/full", cwd=root)  # the final write fails: one line, exit 2 (not 1, "no change")
    assert full.returncode == 2, full.stdout + full.stderr
    assert full.stderr.strip() == "kvcache bisect: --json /dev/full: cannot write (No space left on device)", \
        full.stderr
    assert f"first bad commit: {shas['planted']}" in full.stdout  # the result is said all the same


@pytest.mark.parametrize(("args", "says"), [
    (["--repo", "{root}/nothing-here", "--good", "a", "--bad", "b"], "is not a folder"),
    (["--repo", "{root}", "--good", "a", "--bad", "b"], "is not a git repository"),
    (["--repo", "{repo}", "--good", "no-such-rev", "--bad", "main"], "--good 'no-such-rev' is not a commit"),
    (["--repo", "{repo}", "--good", "main", "--bad", "main"], "are the same commit"),
    (["--repo", "{repo}", "--good", "main", "--bad", "{base}"], "is an ancestor of --good main"),
    (["--repo", "{other}", "--good", "HEAD~1", "--bad", "HEAD"], "is not a Transformers checkout"),
    (["--repo", "{repo}", "--good", "{base}", "--bad", "main", "--class", "static", "--caches", "dynamic"],
     "--class 'static' is not among --caches dynamic"),
    (["--repo", "{repo}", "--good", "{base}", "--bad", "main", "--model", "no-such-model"],
     "--kv-model 'no-such-model' is not a preset"),
    # the suite's own check of an arch: type, against the bad end's Transformers, before any probe
    (["--repo", "{repo}", "--good", "{base}", "--bad", "main", "--model", "arch:no_such_type@layers=2"],
     "--model arch:no_such_type: 'no_such_type' is not a causal-LM model type of transformers "),
    (["--releases", "5.22"], "is not a range A..B"),
    (["--releases", "5.24.0..5.22.2"], "is an empty range"),
    (["--releases", "5.x..5.24.0"], "not a final release number"),
])
def test_bad_input_is_one_line_before_anything_runs(planted, tmp_path, capsys, args, says):
    root, repo, shas = planted
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    for i in range(2):
        (other / "f.txt").write_text(str(i))
        commit(other, f"c{i}")
    values = {"root": str(tmp_path), "repo": str(repo), "base": shas["base"], "other": str(other)}
    done = bisect_here(capsys, *[a.format(**values) for a in args], "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith("kvcache bisect: "), done.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_good_that_is_not_an_ancestor_uses_the_merge_base_and_says_so(planted, tmp_path, capsys, monkeypatch):
    """A patch tag on a release branch: the merge base with ``bad`` is the good end (checked before probing: the
    probes here are refused by a bad extra pytest argument, so nothing is measured)."""
    root, repo, shas = planted
    patch = side_commit(repo, shas["mended"], tmp_path)
    done = bisect_here(capsys, "--repo", str(repo), "--good", patch, "--bad", "main", "--no-cache", "--",
                       "--benchmark-json=x.json")
    assert done.returncode == 2 and "--benchmark-json after -- is the bisect's own" in done.stderr
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    done = bisect_here(capsys, "--repo", str(repo), "--good", patch, "--bad", "main", "--no-cache",
                       "--no-fork-server", "--", "--kv-no-such-option")  # a new interpreter per probe: that path too
    assert done.returncode == 2, done.stdout + done.stderr
    assert (f"--good {patch} is not an ancestor of --bad main: bisecting from their merge base "
            f"{shas['mended'][:12]}") in done.stdout
    assert "2 commits after" in done.stdout
    assert "the good end" in done.stderr and "cannot be measured" in done.stderr
