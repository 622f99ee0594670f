"""The pull-request gate end to end, on the real suite: a user's repository (a git repository made here) whose own
cache class ``mine`` gains a planted whole-cache read on a branch (+1 counted pass, the op ``sum``); the action's
script (``.github/actions/kvcache-gate/run.sh``) measures the counted suite (``tiny``) on the merge base and on the
head in two worktrees, writes the comment (``kvcache comment``) and the job summary, upserts the comment through a
stand-in ``gh`` on PATH that records its calls, and fails on the counted regression. The two runs it leaves are
then recorded in a history (``kvcache history``) and exported (``kvcache export``). Counted only: no timing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import ghstub
import pytest
from kvrun import ROOT, describe, environment

from kvcache.analysing import comment, history
from kvcache.cli import main

# The suite runs in the script's own processes: this one needs torch and transformers installed, not imported.
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("the suite needs torch and transformers", allow_module_level=True)

ACTION = ROOT / ".github" / "actions" / "kvcache-gate"
CLEAN = '''
from transformers import DynamicCache

from kvcache.caches import register_cache


class MyCache(DynamicCache):
    """The user's cache class."""


register_cache("mine", lambda request: MyCache(), description="the user's class")
'''
PLANTED = '''
from transformers import DynamicCache

from kvcache.caches import register_cache


class MyCache(DynamicCache):
    """The user's cache class, now reading all of K and V once more after every append (+1 pass)."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        keys.sum()
        values.sum()
        return keys, values


register_cache("mine", lambda request: MyCache(), description="the user's class")
'''
PR = 7
REPO = "octo/widgets"


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, describe(done)
    return done.stdout.strip()


def user_repository(path: Path) -> tuple[str, str]:
    """A repository with my_caches.py clean on main and planted on a branch: (base sha, head sha)."""
    path.mkdir()
    git(path, "init", "-q")
    git(path, "symbolic-ref", "HEAD", "refs/heads/main")
    (path / "my_caches.py").write_text(CLEAN)
    git(path, "add", "my_caches.py")
    git(path, "commit", "-q", "-m", "my cache")
    base = git(path, "rev-parse", "HEAD")
    git(path, "checkout", "-q", "-b", "planted")
    (path / "my_caches.py").write_text(PLANTED)
    git(path, "commit", "-q", "-am", "read the cache once more")
    return base, git(path, "rev-parse", "HEAD")


def stand_ins(tmp: Path, base: str, head: str, repo: Path, **extra: str) -> dict[str, str]:
    """The environment of the action's script: the stand-in gh on PATH (the pull request has one comment, a
    user's, quoting the marker: not the workflow's to edit), GITHUB_* files in ``tmp``, a pull_request event, the
    interpreter given relative to the checkout (``repo``)."""
    bin_dir = ghstub.install(tmp / "bin")
    event = tmp / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": PR, "base": {"sha": base}, "head": {"sha": head}}}))
    env = ghstub.clean_environment(environment())
    (tmp / "runner").mkdir(exist_ok=True)
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", GH_LOG=str(tmp / "gh.log"),
               GITHUB_EVENT_PATH=str(event), GITHUB_REPOSITORY=REPO, GITHUB_STEP_SUMMARY=str(tmp / "summary.md"),
               GITHUB_OUTPUT=str(tmp / "output.txt"), GITHUB_SERVER_URL="https://github.com", GITHUB_RUN_ID="1234",
               RUNNER_TEMP=str(tmp / "runner"), KVCACHE_PYTHON=os.path.relpath(sys.executable, repo),
               KVCACHE_OUT=str(tmp / "out"),
               GH_COMMENTS=json.dumps([ghstub.comment(9, "octocat", comment.COMMENT_MARKER)]),
               KVCACHE_PYTEST_ARGS="-p my_caches --kv-caches mine --kv-model tiny", **extra)
    return env


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """The action's script run once on the user's pull request (planted head): its result and its folder."""
    tmp = tmp_path_factory.mktemp("pr-gate")
    repo = tmp / "repo"
    base, head = user_repository(repo)
    done = subprocess.run(["bash", str(ACTION / "run.sh")], cwd=repo, env=stand_ins(tmp, base, head, repo),
                          capture_output=True, text=True, timeout=600)
    return done, tmp, base, head


def test_the_comment_names_the_class_both_values_the_change_and_the_op(gated):
    done, tmp, _, _ = gated
    assert (tmp / "out" / "head.json").exists(), describe(done)
    body = (tmp / "out" / "comment.md").read_text()
    assert body.startswith("### ▲ KV-cache passes: regression: mine\n"), body
    row = next(line for line in body.splitlines() if line.startswith("| mine | counted passes |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    base, head = float(cells[2]), float(cells[3])
    assert head - base == pytest.approx(1.0, abs=0.01), row  # the planted read: +1 pass
    assert cells[4] == f"{head - base:+.2f}" and cells[5] == "▲ regression", row
    assert "- **mine**: passes grew: sum +1.00" in body, body
    assert body.rstrip().endswith(comment.COMMENT_MARKER)
    assert "(https://github.com/octo/widgets/actions/runs/1234)" in body


def test_the_workflow_upserts_exactly_one_comment_and_fails_the_check(gated):
    done, tmp, base, head = gated
    assert done.returncode == 1, describe(done)  # a counted regression fails the check
    assert "counted regression against the merge base" in done.stdout, describe(done)
    body = (tmp / "out" / "comment.md").read_text()
    calls = ghstub.calls(tmp / "gh.log")
    listed = [c for c in calls if "--paginate" in c["args"]]
    writes = [c for c in calls if "--method" in c["args"]]
    assert len(listed) == 1 and f"repos/{REPO}/issues/{PR}/comments" in listed[0]["args"], calls
    assert len(writes) == 1, calls  # no comment of the workflow's with the marker yet: one POST, nothing else
    assert writes[0]["args"][:4] == ["api", "--method", "POST", f"repos/{REPO}/issues/{PR}/comments"], writes
    assert writes[0]["body"] == body
    summary = (tmp / "summary.md").read_text()
    assert body in summary and "kvcache compare BASE HEAD" in summary
    outputs = dict(line.split("=", 1) for line in (tmp / "output.txt").read_text().splitlines())
    assert outputs["regression"] == "true" and Path(outputs["comment"]) == tmp / "out" / "comment.md"
    assert git(tmp / "repo", "worktree", "list").count("\n") == 0  # its worktrees are gone


def test_history_of_three_recorded_runs_marks_the_step_with_its_commit(gated, capsys):
    _, tmp, base, head = gated
    store, out = tmp / "history.jsonl", tmp / "trend"
    runs = [("base.json", base), ("base.json", "0" * 40), ("head.json", head)]  # the clean run twice, then HEAD
    for name, commit in runs:
        assert main(["history", "add", str(tmp / "out" / name), "--store", str(store), "--commit", commit]) == 0
    assert main(["history", "plot", "--store", str(store), "--out", str(out)]) == 0
    steps = json.loads((out / "steps.json").read_text())
    counted = [s for s in steps if s["measure"] == "counted"]
    assert [(s["cache"], s["index"], s["label"]) for s in counted] == [("mine", 2, head[:8])], steps
    assert counted[0]["delta"] == pytest.approx(1.0, abs=0.01)
    assert (out / "counted.png").stat().st_size > 10_000
    assert f"step: mine counted at {head[:8]}" in capsys.readouterr().out
    entries = history.read_store(store)
    assert [e.commit for e in entries] == [c for _, c in runs]


def test_export_of_the_head_run(gated, capsys):
    _, tmp, _, _ = gated
    assert main(["export", str(tmp / "out" / "head.json"), "--format", "github-action-benchmark"]) == 0
    entries = json.loads(capsys.readouterr().out)
    by_name = {e["name"]: e for e in entries}
    assert by_name["mine: counted passes"]["unit"] == "passes"
    assert "tiny, bfloat16" in by_name["mine: counted passes"]["extra"]
    for entry in entries:
        assert set(entry) <= {"name", "unit", "value", "range", "extra"} and {"name", "unit", "value"} <= set(entry)
