"""The kvcache-gate action's scripts (.github/actions/kvcache-gate) without the suite: the comment upsert through a
stand-in ``gh`` that records its calls and runs the script's own --jq filter with jq (the workflow's own comment
with the marker is PATCHed, nobody else's; else one POST), the script's one-line errors before anything is
measured, the script on canned runs (an interpreter that writes them in place of the suite: a head that drops a
class fails the check; no run written is no pass), and shellcheck where it is installed. The whole action on the
real suite is tests/suite/test_pr_gate.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import ghstub
import pytest
from fakerun import make_run, write_run

from kvcache.analysing import comment

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / ".github" / "actions" / "kvcache-gate"
BOT = "github-actions[bot]"


def env_with_gh(tmp: Path, **extra: str) -> dict[str, str]:
    env = ghstub.clean_environment()
    env.update(PATH=f"{ghstub.install(tmp / 'bin')}:{env.get('PATH', '')}", GH_LOG=str(tmp / "gh.log"), **extra)
    return env


def calls(tmp: Path) -> list[dict]:
    return ghstub.calls(tmp / "gh.log")


def upsert(tmp: Path, comments: list[dict], *author: str) -> subprocess.CompletedProcess:
    body = tmp / "comment.md"
    body.write_text(f"### ✓ KV-cache passes: no regression\n\n{comment.COMMENT_MARKER}\n")
    return subprocess.run(["bash", str(ACTION / "upsert-comment.sh"), "octo/widgets", "7", str(body), *author],
                          env=env_with_gh(tmp, GH_COMMENTS=json.dumps(comments)), capture_output=True, text=True,
                          timeout=60)


def writes(tmp: Path) -> list[dict]:
    return [c for c in calls(tmp) if "--method" in c["args"]]


def test_the_bots_comment_with_the_marker_is_updated_nobody_elses(tmp_path):
    """The comments (through the script's own --jq filter, run by jq): a user's comment quoting the marker, then the
    workflow's own, then the workflow's comment without it: the workflow's own with the marker is the one PATCHed."""
    ghstub.need_jq()
    done = upsert(tmp_path, [ghstub.comment(101, "octocat", f"see {comment.COMMENT_MARKER}"),
                             ghstub.comment(202, BOT, f"old\n{comment.COMMENT_MARKER}\n"),
                             ghstub.comment(303, BOT, "something else"),
                             ghstub.comment(404, BOT, f"older\n{comment.COMMENT_MARKER}\n")])
    assert done.returncode == 0, done.stderr
    made = calls(tmp_path)
    assert made[0]["args"][:3] == ["api", "--paginate", "repos/octo/widgets/issues/7/comments"]
    assert [c["args"][:4] for c in writes(tmp_path)] == \
        [["api", "--method", "PATCH", "repos/octo/widgets/issues/comments/202"]]
    assert writes(tmp_path)[0]["body"] == (tmp_path / "comment.md").read_text()


def test_without_one_of_its_own_a_comment_is_posted(tmp_path):
    """Only a user's comment carries the marker (or there is no comment at all): one POST, no PATCH."""
    ghstub.need_jq()
    for comments in ([ghstub.comment(101, "octocat", comment.COMMENT_MARKER)], []):
        (tmp_path / "gh.log").unlink(missing_ok=True)
        done = upsert(tmp_path, comments)
        assert done.returncode == 0, done.stderr
        assert [c["args"][:4] for c in writes(tmp_path)] == \
            [["api", "--method", "POST", "repos/octo/widgets/issues/7/comments"]]
        assert writes(tmp_path)[0]["body"] == (tmp_path / "comment.md").read_text()


def test_another_author_is_given_and_checked(tmp_path):
    """comment-author (the login of the token that posts): its comment is updated, the default bot's is not; a
    value that is no GitHub login is refused before gh is called."""
    ghstub.need_jq()
    done = upsert(tmp_path, [ghstub.comment(202, BOT, comment.COMMENT_MARKER), ghstub.comment(505, "my-bot[bot]",
                                                                                        comment.COMMENT_MARKER)],
                  "my-bot[bot]")
    assert done.returncode == 0, done.stderr
    assert [c["args"][3] for c in writes(tmp_path)] == ["repos/octo/widgets/issues/comments/505"]
    (tmp_path / "gh.log").unlink()
    done = upsert(tmp_path, [], 'x" or true or "')
    assert done.returncode == 2 and "is not a GitHub login" in done.stderr and calls(tmp_path) == [], done


def test_the_script_stops_with_one_line_before_measuring(tmp_path):
    """Outside a git repository, or with no base to measure (not a pull_request event, no base input): exit 2,
    one ::error:: line, no gh call, nothing measured."""
    outside = tmp_path / "outside"
    outside.mkdir()
    env = env_with_gh(tmp_path, GIT_CEILING_DIRECTORIES=str(tmp_path), RUNNER_TEMP=str(tmp_path),
                      KVCACHE_OUT=str(tmp_path / "out"))
    done = subprocess.run(["bash", str(ACTION / "run.sh")], cwd=outside, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stdout.strip() == \
        "::error::kvcache-gate: not in a git repository (run after actions/checkout)", done
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q"], cwd=outside, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q",
                        "--allow-empty", "-m", "one"], cwd=outside, check=True)
        done = subprocess.run(["bash", str(ACTION / "run.sh")], cwd=outside, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and "no BASE: not a pull_request event" in done.stdout, done
        # a base git cannot check out: git's own reason, on the one line; the worktrees made are gone, pruned
        done = subprocess.run(["bash", str(ACTION / "run.sh")], cwd=outside, env={**env, "KVCACHE_BASE": "nosuch"},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and len(done.stdout.splitlines()) == 1, done
        assert done.stdout.startswith("::error::kvcache-gate: cannot check out nosuch for base: fatal: "), done
        listed = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=outside, capture_output=True,
                                text=True, check=True).stdout
        assert listed.count("worktree ") == 1, listed
    assert calls(tmp_path) == [] and not list((tmp_path / "out").glob("*.json"))


def test_a_relative_interpreter_runs_in_the_worktrees_and_no_json_is_no_pass(tmp_path):
    """KVCACHE_PYTHON venv/python, relative to the checkout (and not committed), still runs the suite in each
    worktree; an interpreter that exits 0 without writing the run's JSON fails the check, it never passes it."""
    if not shutil.which("git"):
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    (repo / "venv").mkdir(parents=True)
    (repo / "venv" / "python").write_text('#!/bin/sh\necho "$PWD $*" >> "$PYTHON_LOG"\n')
    (repo / "venv" / "python").chmod(0o755)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty",
                    "-m", "one"], cwd=repo, check=True)
    env = env_with_gh(tmp_path, KVCACHE_PYTHON="venv/python", KVCACHE_BASE="HEAD", RUNNER_TEMP=str(tmp_path),
                      KVCACHE_OUT=str(tmp_path / "out"), KVCACHE_PARALLEL="false", PYTHON_LOG=str(tmp_path / "log"))
    done = subprocess.run(["bash", str(ACTION / "run.sh")], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done
    assert "::error::kvcache-gate: the counted suite wrote no base.json" in done.stdout, done
    ran = (tmp_path / "log").read_text().splitlines()
    assert [line.split()[0].rsplit("/", 1)[1] for line in ran] == ["base", "head"], ran
    assert all(" -m pytest " in line for line in ran), ran
    assert calls(tmp_path) == []


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck is not installed (.ci/run installs it)")
def test_the_scripts_are_shellcheck_clean():
    done = subprocess.run(["shellcheck", *sorted(str(p) for p in ACTION.glob("*.sh"))], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_head_that_drops_a_class_fails_the_check(tmp_path):
    """The script on canned runs (an interpreter that writes them in place of the suite, and runs kvcache itself):
    BASE counts dynamic and static, HEAD's conftest skips dynamic. compare --require-classes makes that a
    regression: exit 1, the comment's verdict names the class, the output says regression=true."""
    if not shutil.which("git"):
        pytest.skip("git is not installed")
    runs = tmp_path / "runs"
    runs.mkdir()
    write_run(runs / "base.json", make_run({"dynamic": 3.0, "static": 1.0}))
    head = make_run({"static": 1.0}, seed=1)
    head["kv"]["skipped"] = [{"cache": "dynamic", "context": None, "reason": "conftest: not on this runner"}]
    write_run(runs / "head.json", head)
    python = tmp_path / "python"
    python.write_text(f'''#!/bin/sh
if [ "$2" = pytest ]; then  # the suite, in the worktree of base or head: its canned run
  side=$(basename "$PWD")
  while [ $# -gt 0 ]; do [ "$1" = --benchmark-json ] && cp "{runs}/$side.json" "$2"; shift; done
  exit 0
fi
exec "{sys.executable}" "$@"
''')
    python.chmod(0o755)
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty",
                    "-m", "one"], cwd=repo, check=True)
    env = env_with_gh(tmp_path, KVCACHE_PYTHON=str(python), KVCACHE_BASE="HEAD", RUNNER_TEMP=str(tmp_path),
                      KVCACHE_OUT=str(tmp_path / "out"), GITHUB_OUTPUT=str(tmp_path / "output.txt"),
                      PYTHONPATH=str(ROOT))
    done = subprocess.run(["bash", str(ACTION / "run.sh")], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "counted regression against the base" in done.stdout, done
    body = (tmp_path / "out" / "comment.md").read_text()
    assert body.splitlines()[0] == "### ▲ KV-cache passes: regression: dynamic", body
    assert "not in HEAD: conftest: not on this runner" in body
    assert "regression=true" in (tmp_path / "output.txt").read_text().splitlines()
