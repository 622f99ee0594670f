"""``kvcache sentinel`` on real Transformers source: the planted repository of tests/suite/test_bisect.py (the
installed Transformers as ``src/transformers``, the tiny model's folders only; an unrelated edit, an import broken
and mended, a ``.clone()`` in DynamicLayer.update: +2.00 counted passes, +4 ops) whose last commit is replaced by one
that adds a ``.view_as()`` to what update returns (+4 ops, no bytes): two changes of the ops in one range. One class on
the tiny model, one probe cache: the first run (5 probes) names both commits and skips the broken one; a second run
with no new commit raises nothing; a run stopped by SIGTERM while it probes leaves the state as it was; a revert of both
recovers every change. Bad input is checked in this process, before anything is probed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kvrun import in_process, kvcache_command
from test_bisect import CACHE_UTILS, PLANTED, build_repository, commit, edit, git

from kvcache.commands import sentinel as sentinel_cli

VIEWED = """        self.values = torch.cat([self.values, value_states], dim=-2)
        return self.keys.clone().view_as(self.keys), self.values.clone().view_as(self.values)"""
PASSES, OPS = "traffic.dynamic.passes", "traffic.dynamic.ops_per_step"


def sentinel(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return kvcache_command("sentinel", *args, cwd=cwd)


def sentinel_here(capsys, *args: str) -> subprocess.CompletedProcess:
    return in_process(sentinel_cli.main, capsys, *args)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentinel")
    repo = root / "transformers"
    shas = build_repository(repo)
    git(repo, "reset", "-q", "--hard", shas.pop("unrelated-2") + "~1")  # 5 commits, the broken one in the middle
    edit(repo, CACHE_UTILS, lambda s: s.replace(PLANTED, VIEWED))
    shas["viewed"] = commit(repo, "DynamicLayer.update returns views of its copies")
    return root, repo, shas


def test_sentinel_names_each_change_skips_what_does_not_build_and_sees_a_revert_recover(planted):
    root, repo, shas = planted
    state, out, issue = root / "state.json", root / "out.json", root / "issue.md"
    common = ["--repo", str(repo), "--state", str(state), "--caches", "dynamic", "--cache-dir", str(root / "cache"),
              "--json", str(out)]

    first = sentinel(*common, "--since", shas["base"], "--issue-out", str(issue), cwd=root)
    assert first.returncode == 1, first.stdout + first.stderr
    doc = json.loads(out.read_text())
    by_figure: dict[str, list[dict]] = {}
    for change in doc["changes"]:
        by_figure.setdefault(change["figure"], []).append(change)
    assert [c["commit"] for c in by_figure[PASSES]] == [shas["planted"]]
    passes = by_figure[PASSES][0]
    assert passes["subject"] == "DynamicLayer.update hands out copies of its keys and values"
    assert passes["date"] == "2026-01-01T00:00:00+00:00"  # the author date
    assert (passes["before"], passes["after"], passes["ops"]) == (pytest.approx(3.0), pytest.approx(5.0),
                                                                  {"clone": pytest.approx(2.0)})
    assert passes["parent"] == shas["mended"]
    assert [c["commit"] for c in by_figure[OPS]] == [shas["planted"], shas["viewed"]]  # two changes in one range
    assert set(by_figure[OPS][1]["ops"]) == {"view_as"}, by_figure[OPS][1]
    broken = [p for p in doc["probes"] if p["item"] == shas["broken"]]
    assert broken and broken[0]["skipped"] and "this_name_does_not_exist" in broken[0]["reason"]
    assert all(c["commit"] != shas["broken"] for c in doc["changes"])  # skipped, never blamed
    assert {i["key"] for i in doc["issues"]} == {shas["planted"], shas["viewed"]}
    assert all(i["state"] == "open" for i in doc["issues"])
    body = issue.read_text()
    assert f"`{shas['planted']}`" in body and f"`{shas['viewed']}`" in body
    assert f"kvcache bisect --repo transformers --good {shas['mended']} --bad {shas['planted']}" in body
    recorded = json.loads(state.read_text())
    assert recorded["commit"] == shas["viewed"] and recorded["figures"][PASSES] == pytest.approx(5.0)
    assert len(recorded["open"]) == len(doc["changes"])

    before = state.read_bytes()
    again = sentinel(*common, cwd=root)  # no new commit: nothing raised, nothing probed
    assert again.returncode == 0, again.stdout + again.stderr
    assert "no new commit on main" in again.stdout
    assert json.loads(out.read_text())["changes"] == [] and state.read_bytes() == before

    full = sentinel(*common[:-1], "/dev/full", cwd=root)  # the final write fails: exit 2, not 0 or 1 (a green job)
    assert full.returncode == 2, full.stdout + full.stderr
    assert full.stderr.strip() == "kvcache sentinel: --json /dev/full: cannot write (No space left on device)", \
        full.stderr
    assert state.read_bytes() == before

    git(repo, "revert", "--no-edit", shas["viewed"])
    git(repo, "revert", "--no-edit", shas["planted"])

    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    running = subprocess.Popen([sys.executable, "-m", "kvcache.cli", "sentinel", *common, "--no-cache"], cwd=root,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert running.stdout is not None
    started = running.stdout.readline()  # said once the signal handlers are set, before the head is probed
    assert "2 new commits after" in started, started
    running.send_signal(signal.SIGTERM)  # while it probes the head
    said, err = running.communicate(timeout=120)
    assert running.returncode == 130, started + said + err
    assert "the state is as it was" in err and state.read_bytes() == before

    revert = sentinel(*common, cwd=root)
    assert revert.returncode == 1, revert.stdout + revert.stderr
    doc = json.loads(out.read_text())
    assert doc["open"] == [] and {r["figure"] for r in doc["recovered"]} >= {PASSES, OPS}
    assert all(c["kind"] == "recovered" for c in doc["changes"])
    assert all(i["state"] == "closed" for i in doc["issues"])
    assert json.loads(state.read_text())["figures"][PASSES] == pytest.approx(3.0)
    assert git(repo, "worktree", "list").count("\n") == 0  # the probes' worktree is gone


def other_state(shas: dict[str, str], **change) -> dict:
    """A state as the sentinel writes it (for the suite of these tests), with ``change`` made to it."""
    doc = {"kvcache_sentinel_state": 1, "origin": None, "branch": "main",
           "options": ["--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-device", "cpu"],
           "probe_identity": "x", "commit": shas["base"], "figures": {PASSES: 3.0}, "open": []}
    return {**doc, **change}


@pytest.mark.parametrize(("args", "state", "says"), [
    (["--repo", "{root}/nothing-here"], None, "is not a folder"),
    (["--repo", "{plain}"], None, "is not a git repository"),
    (["--repo", "{repo}", "--branch", "release"], None, "--branch 'release' is not a branch of"),
    (["--repo", "{repo}", "--since", "no-such-rev"], None, "--since 'no-such-rev' is not a commit"),
    (["--repo", "{repo}"], None, "does not exist yet: give --since REF"),
    (["--repo", "{repo}"], "not json {", "is not JSON"),
    (["--repo", "{repo}"], '{"figures": {}}', "is not a kvcache sentinel state"),
    (["--repo", "{repo}"], '{"kvcache_sentinel_state": 1, "figures": {}}', "is not a kvcache sentinel state (its"),
    (["--repo", "{repo}"], {"commit": "f" * 40}, "is not in"),
    # a damaged state (issue 49): refused before anything is measured, each one line, exit 2
    (["--repo", "{repo}"], {"open": [{"figure": PASSES}]}, "(its open[0] before is None, not a finite number)"),
    (["--repo", "{repo}"], {"open": [{"before": 3.0}]}, "(its open[0] has no figure"),
    (["--repo", "{repo}"], {"figures": {PASSES: float("nan")}}, f"(its figures[{PASSES!r}] is nan, not a finite"),
    (["--repo", "{repo}"], {"commit": "main"}, "(its commit 'main' is not a full commit sha"),
    (["--repo", "{repo}"], {"options": ["--kv-model", "tiny", "--kv-caches", "static", "--kv-device", "cpu"]},
     "was written for --kv-model tiny --kv-caches static"),
    (["--repo", "{repo}", "--json", "{state}"], {}, "are one file"),
    (["--releases", "5.24..5.22"], False, "is an empty range"),
    (["--releases", "5.22..5.24", "--repo", "{repo}"], False, "give --repo PATH --state FILE"),
])
def test_bad_input_is_one_line_and_leaves_the_state_untouched(planted, tmp_path, capsys, args, state, says):
    root, repo, shas = planted
    plain = tmp_path / "plain"
    plain.mkdir()
    path = tmp_path / "state.json"
    if isinstance(state, str):
        path.write_text(state)
    elif isinstance(state, dict):
        path.write_text(json.dumps(other_state(shas, **state)))
    before = path.read_bytes() if path.exists() else None
    values = {"root": str(tmp_path), "repo": str(repo), "plain": str(plain), "state": str(path)}
    given = [a.format(**values) for a in args]
    if state is not False:
        given += ["--state", str(path)]
    done = sentinel_here(capsys, *given, "--caches", "dynamic", "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith("kvcache sentinel: "), done.stderr
    assert (path.read_bytes() if path.exists() else None) == before
    assert not (tmp_path / "cache").exists()
