"""A stand-in for the gh CLI, for the kvcache-gate action's tests: put on PATH by :func:`install`, it records every
call (its arguments, and the body a ``-F body=@FILE`` would send) as a JSON line in ``$GH_LOG``. ``gh api --paginate
... --jq FILTER`` (the list of a pull request's comments) prints ``$GH_COMMENTS`` (a JSON array of comments) run
through FILTER with the real ``jq`` (gh runs gojq, the same language for these filters), so the script's filter is
what is tested; where jq is not installed no comment matches, and the tests of the filter skip (:func:`need_jq`;
.ci/run installs jq)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

SCRIPT = f'''#!{sys.executable}
import json, os, shutil, subprocess, sys
args = sys.argv[1:]
body = next((open(a[len("body=@"):], encoding="utf-8").read() for a in args if a.startswith("body=@")), None)
with open(os.environ["GH_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps({{"args": args, "body": body}}) + "\\n")
if "--paginate" in args:
    comments = os.environ.get("GH_COMMENTS", "[]")
    if "--jq" in args and not shutil.which("jq"):
        sys.exit(0)  # no jq here: as if no comment matched (the tests of the filter itself skip)
    if "--jq" in args:
        done = subprocess.run(["jq", "-r", args[args.index("--jq") + 1]], input=comments, text=True,
                              capture_output=True)
        sys.stderr.write(done.stderr)
        sys.stdout.write(done.stdout)
        sys.exit(done.returncode)
    sys.stdout.write(comments)
'''


def need_jq() -> None:
    """Skip the calling test where jq, which the stand-in filters with, is not installed."""
    if not shutil.which("jq"):
        pytest.skip("jq is not installed (.ci/run installs it): the stand-in gh filters comments with it")


def install(folder: Path) -> Path:
    """Write the stand-in as ``folder/gh`` (executable); returns ``folder``, to put first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gh").write_text(SCRIPT)
    (folder / "gh").chmod(0o755)
    return folder


def comment(id_: int, login: str, body: str) -> dict:
    """One comment as GitHub's REST API lists it (the fields the filter reads)."""
    return {"id": id_, "user": {"login": login, "type": "Bot" if login.endswith("[bot]") else "User"}, "body": body}


def calls(log: Path) -> list[dict]:
    """The recorded calls, in order."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def clean_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) without GitHub's, the runner's, gh's or the action's own variables."""
    source = os.environ if env is None else env
    return {k: v for k, v in source.items() if not k.startswith(("GITHUB_", "KVCACHE_", "GH_", "RUNNER_"))}
