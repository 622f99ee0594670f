"""``kvcache bisect``'s probes without a suite run (no torch): what keys the probe cache, the fork server's own
timeout and its refusal to fork from a process with other threads or CUDA, and a commit git cannot check out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcache.analysing.records import KV
from kvcache.bisect import probing, runners, server


def suite(tmp_path, extra=()):
    return probing.Suite("tiny", "dynamic", None, None, None, list(extra), tmp_path)


def test_probes_run_on_the_cpu_unless_a_device_is_given_and_the_device_keys_the_cache(tmp_path):
    """A probe used to run on ``--kv-device auto`` (CUDA where there is one), while its cached figure was keyed
    without the device: the same cache folder served CPU and GPU probes."""
    plain = suite(tmp_path)
    assert plain.options()[-2:] == ["--kv-device", "cpu"]
    assert "--kv-device" in plain.identity()["options"]
    cuda = suite(tmp_path, ["--kv-device", "cuda"])
    assert cuda.options().count("--kv-device") == 1 and cuda.options()[-1] == "cuda"
    keyed = {probing.ProbeCache(tmp_path, s.identity()).identity_hash
             for s in (plain, cuda, suite(tmp_path, ["--kv-device=cuda"]))}
    assert len(keyed) == 3


def test_a_plugin_module_after_the_dashes_is_keyed_by_its_content(tmp_path, monkeypatch):
    """``-- -p my_caches`` was keyed by the name only: editing the module reused the probes of the old one."""
    (tmp_path / "my_caches.py").write_text("X = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    args = ["-p", "my_caches"]
    first = suite(tmp_path, args).identity()
    assert first["options"][-1].startswith("my_caches@sha256:")
    assert suite(tmp_path, ["-pmy_caches"]).identity()["options"][-1].startswith("-pmy_caches@sha256:")
    (tmp_path / "my_caches.py").write_text("X = 2\n")
    assert suite(tmp_path, args).identity() != first
    assert suite(tmp_path, ["-p", "no:randomly"]).identity()["options"][-1] == "no:randomly"
    (tmp_path / "args.txt").write_text("a")  # any argument naming a file: keyed by its content too
    assert "@sha256:" in suite(tmp_path, [f"--kv-x={tmp_path / 'args.txt'}"]).identity()["options"][-1]
    assert "my_caches" not in sys.modules  # found, never imported


def test_the_suite_hash_covers_the_whole_package():
    """The hash left out kvcache/analysing/analysis.py and records.py, which build kv.traffic from the counts."""
    names = {str(file.relative_to(root)) for root, file in probing.suite_files()}
    for part in ("analysing/analysis.py", "analysing/records/__init__.py", "measuring/counting/traffic.py",
                 "plugin/__init__.py"):
        assert f"kvcache{os.sep}{part.replace('/', os.sep)}" in names, part
    assert any("test_traffic.py" in name for name in names)


def test_the_server_refuses_to_fork_with_threads_or_cuda():
    assert server.refusal({"ready": True, "threads": 1, "cuda": False}) is None
    assert "2 threads alive" in server.refusal({"ready": True, "threads": 2, "cuda": False})
    assert "CUDA was initialised" in server.refusal({"ready": True, "threads": 1, "cuda": True})


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_the_server_kills_a_probe_at_its_timeout_in_a_group_of_its_own(tmp_path):
    (tmp_path / "test_hang.py").write_text(
        "import os, time\n"
        "def test_hang():\n"
        "    open('pgid.txt', 'w').write(str(os.getpgid(0) == os.getpid()))\n"
        "    time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep + str(Path(probing.__file__).resolve().parents[2])}
    forks = server.ForkServer([], tmp_path, env)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # the probe's own: no plugin (no torch) needed
    try:
        rc = forks.run(["-q", "-p", "no:cacheprovider", str(tmp_path / "test_hang.py")], tmp_path, env, [],
                       tmp_path / "log.txt", 2)
        assert rc is None  # timed out: killed by the server
        assert (tmp_path / "pgid.txt").read_text() == "True"
        assert forks.run(["-q", "-p", "no:cacheprovider", "--co", str(tmp_path / "test_hang.py")], tmp_path, env,
                         [], tmp_path / "log2.txt", 60) == 0  # and it serves the next one
    finally:
        forks.close()
    assert forks.proc.returncode == 0


class FakeSuite:
    workdir: Path

    def __init__(self, workdir):
        self.workdir, self.ran = workdir, []

    def run(self, item, first_on_path, number):
        self.ran.append(item.name)
        return probing.ProbeResult(item, kv=KV())

    def close(self):
        pass


def test_a_commit_git_cannot_check_out_is_skipped_not_the_end(tmp_path, monkeypatch):
    """A failing ``git checkout`` in the middle of the range used to stop the bisect with exit 2."""
    calls = []

    def fake_git(repo, *args, check=True):
        calls.append(args)
        if args[:1] == ("checkout",) and args[-1] == "bad-sha" or args[:2] == ("worktree", "add") and args[-1] == "x":
            raise probing.BisectError("git checkout --detach --force --quiet bad-sha failed in x: error: unable to "
                                     "create file")
        if args[:2] == ("worktree", "add"):
            Path(args[-2]).mkdir()
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(runners, "git", fake_git)
    fake = FakeSuite(tmp_path)
    runner = runners.CommitRunner(tmp_path, fake)
    assert runner.measure(probing.Revision("x", "x")).kv is None  # the first checkout (the ends came from the cache)
    assert runner.measure(probing.Revision("a", "a")).kv is not None
    skipped = runner.measure(probing.Revision("bad-sha", "bad-sha"))
    assert skipped.kv is None and not skipped.cacheable and "unable to create file" in skipped.reason
    (tmp_path / "worktree" / "src" / "__pycache__").mkdir(parents=True)
    assert runner.measure(probing.Revision("c", "c")).kv is not None  # the next commit is probed
    assert not (tmp_path / "worktree" / "src" / "__pycache__").exists()  # after an unknown state: no bytecode kept
    assert fake.ran == ["a", "c"]
    runner.close()
    assert calls[-1][:2] == ("worktree", "remove")


class _Runner:
    """A runner whose end cannot be prepared (a commit git cannot check out), or whose Python answers ``answer``."""

    def __init__(self, tmp_path, fails=False):
        self.tmp_path, self.fails, self.asked, self.closed = tmp_path, fails, [], False

    def environment(self, item):
        self.asked.append(item.name)
        if self.fails:
            raise probing.BisectError("cannot check it out")
        return self.tmp_path

    def close(self):
        self.closed = True


def test_an_arch_model_is_checked_at_the_bad_end_before_any_probe_and_only_an_arch_model(tmp_path, monkeypatch):
    """``--model arch:X``: the suite's own check (kvcache.measuring.architectures.check_type) in a Python of its own
    with the bad end's Transformers first on the path; its one line (``--kv-model`` said as bisect's ``--model``) is
    the bisect's usage error, the runner closed. A check that cannot run says nothing (the probes say it then)."""
    from kvcache.bisect import plan

    end = probing.Revision("b" * 40, "b" * 40)
    runner = _Runner(tmp_path)
    plan.check_arch_model("tiny", runner, end, "--bad main")
    assert runner.asked == []  # a preset: nothing to check, nothing checked out
    plan.check_arch_model("arch:x", _Runner(tmp_path, fails=True), end, "--bad main")  # no end: the probes say it
    said = ("--kv-model arch:x: 'x' is not a causal-LM model type of transformers 5.25.0; list them with `kvcache "
            "architectures --list`")
    ran = []

    def fake_run(cmd, **kwargs):
        ran.append((cmd, kwargs))
        return subprocess.CompletedProcess(cmd, 1, stdout=said + "\n", stderr="")

    monkeypatch.setattr(plan.subprocess, "run", fake_run)
    with pytest.raises(probing.BisectError) as raised:
        plan.check_arch_model("arch:x@layers=2", runner, end, "--bad main")
    assert str(raised.value) == said.replace("--kv-model", "--model") + " (checked at --bad main)"
    assert runner.closed and runner.asked == [end.name]
    (cmd, kwargs), = ran
    assert cmd[1:] == ["-c", plan.CHECK_TYPE, "arch:x@layers=2"]
    assert kwargs["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)  # the end's Transformers first
    monkeypatch.setattr(plan.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 3, "", ""))
    plan.check_arch_model("arch:x", _Runner(tmp_path), end, "--bad main")  # no torch there: not this check's to say
