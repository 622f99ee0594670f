"""The files a run writes (kvcache.analysing.files, the baseline's writer, ``kvcache baseline``): written through
symlinks atomically, probed for real before anything is written (immutable, append-only, read-only), every
problem naming the file."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

import pytest
from fakerun import make_run, write_run

from kvcache.analysing import files
from kvcache.analysing.judge import baseline
from kvcache.cli import main

DEVICE_KEY = "cpu: test machine | smollm2-135m | bfloat16"


@pytest.fixture
def attribute(tmp_path):
    """``attribute(path, "i")``: ``chattr +i path``, cleared after the test; skips where chattr cannot."""
    done_list = []

    def set_(path, flag):
        try:
            done = subprocess.run(["chattr", f"+{flag}", str(path)], capture_output=True, text=True, timeout=30)
        except OSError:
            pytest.skip("chattr is not installed")
        if done.returncode != 0:
            pytest.skip(f"chattr +{flag} is not supported here ({done.stderr.strip()}): tmpfs, or no "
                        "CAP_LINUX_IMMUTABLE")
        done_list.append((path, flag))

    yield set_
    for path, flag in done_list:
        subprocess.run(["chattr", f"-{flag}", str(path)], capture_output=True, timeout=30)


def test_a_symlink_is_written_through_with_the_temp_file_beside_its_target(tmp_path, monkeypatch):
    target_dir, link_dir = tmp_path / "targets", tmp_path / "links"
    target_dir.mkdir()
    link_dir.mkdir()
    target = target_dir / "b.json"
    target.write_text("old")
    target.chmod(0o640)
    link = link_dir / "b.json"
    link.symlink_to(target)
    made_in = []
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        made_in.append(kwargs.get("dir"))
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    files.write_text_atomically(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640
    assert made_in == [target_dir]
    assert sorted(p.name for p in target_dir.iterdir()) == ["b.json"] and os.listdir(link_dir) == ["b.json"]


def test_a_symlinked_baseline_stays_a_link_and_its_target_is_updated(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "kv-baseline.json"
    target.write_text(json.dumps(baseline.empty().to_json()))
    link = tmp_path / "kv-baseline.json"
    link.symlink_to(target)
    baseline.update(link, {DEVICE_KEY: {"dynamic": {"timed_passes": 3.0}}})
    assert link.is_symlink()
    assert baseline.load(target).to_json()["devices"][DEVICE_KEY]["dynamic"]["timed_passes"] == 3.0


def test_an_interrupted_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "b.json"
    path.write_text("old")

    def interrupted(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_text_atomically(path, "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["b.json"]


@pytest.mark.parametrize("flag", ["i", "a"])
def test_an_immutable_or_append_only_file_is_found_by_the_probe(tmp_path, attribute, flag):
    path = tmp_path / "b.json"
    path.write_text("{}")
    attribute(path, flag)
    problem = files.write_problem(path)
    assert problem is not None and problem.startswith(f"{path}: cannot be written"), problem
    assert path.read_text() == "{}" and os.listdir(tmp_path) == ["b.json"]  # the probe changed nothing


def test_an_immutable_folder_is_found_by_the_probe(tmp_path, attribute):
    folder = tmp_path / "frozen"
    folder.mkdir()
    attribute(folder, "i")
    problem = files.write_problem(folder / "b.json")
    assert problem is not None and f"cannot create a file in {folder}" in problem, problem


def test_a_read_only_file_is_found_by_the_probe_unless_root(tmp_path):
    path = tmp_path / "b.json"
    path.write_text("{}")
    path.chmod(0o444)
    if os.geteuid() == 0:
        pytest.skip("permissions do not stop root (the immutable case covers root)")
    assert files.write_problem(path).startswith(f"{path}: cannot be written")


def test_a_writable_file_or_link_passes_the_probe(tmp_path):
    path = tmp_path / "b.json"
    assert files.write_problem(path) is None  # not there yet
    path.write_text("{}")
    (tmp_path / "link.json").symlink_to(path)
    assert files.write_problem(path) is None and files.write_problem(tmp_path / "link.json") is None
    assert sorted(os.listdir(tmp_path)) == ["b.json", "link.json"]  # no probe left behind


def test_same_file_through_links(tmp_path):
    a = tmp_path / "a.json"
    a.write_text("{}")
    (tmp_path / "sym.json").symlink_to(a)
    os.link(a, tmp_path / "hard.json")
    assert files.same_file(a, tmp_path / "sym.json") and files.same_file(a, tmp_path / "hard.json")
    assert files.same_file(tmp_path / "new.json", tmp_path / "sub" / ".." / "new.json")
    assert not files.same_file(a, tmp_path / "new.json")


def test_kvcache_baseline_refuses_an_immutable_baseline_naming_it(tmp_path, capsys, attribute):
    run = write_run(tmp_path / "run.json", make_run({"dynamic": 3.0}))
    path = tmp_path / "kv-baseline.json"
    path.write_text(json.dumps(baseline.empty().to_json()))
    attribute(path, "i")
    assert main(["baseline", str(run), "--baseline", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kvcache baseline: --baseline {path}: cannot be written") and "\n" not in err, err


def test_kvcache_baseline_write_error_names_the_file(tmp_path, capsys, monkeypatch):
    """A write that fails after the probe passed (a full disk, a race) still names the file."""
    run = write_run(tmp_path / "run.json", make_run({"dynamic": 3.0}))
    path = tmp_path / "kv-baseline.json"

    def full(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert main(["baseline", str(run), "--baseline", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"kvcache baseline: {path}: cannot write baseline (No space left on device)", err


def test_kvcache_baseline_refuses_the_run_file_as_baseline(tmp_path, capsys):
    run = write_run(tmp_path / "run.json", make_run({"dynamic": 3.0}))
    before = run.read_text()
    (tmp_path / "link.json").symlink_to(run)
    assert main(["baseline", str(run), "--baseline", str(tmp_path / "link.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"RUN.json {run} and --baseline {tmp_path / 'link.json'} are one file" in err and "\n" not in err, err
    assert "--baseline would replace it" in err
    assert run.read_text() == before


def test_kvcache_baseline_writes_through_a_symlink(tmp_path, capsys):
    run = write_run(tmp_path / "run.json", make_run({"dynamic": 3.0}))
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "b.json"
    link = tmp_path / "b.json"
    link.symlink_to(target)  # dangling: the target is created
    assert main(["baseline", str(run), "--baseline", str(link)]) == 0
    assert link.is_symlink()
    assert baseline.load(target).to_json()["devices"][DEVICE_KEY]["dynamic"]["timed_passes"] == 3.0


def test_a_pipe_is_written_in_place(tmp_path):
    """``--benchmark-json /dev/stdout`` or a named pipe: nothing to replace, nothing probed (a probe could block)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert files.write_problem(fifo) is None
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        files.write_text_atomically(fifo, "{}")
        assert os.read(reader, 10) == b"{}"
    finally:
        os.close(reader)
    assert sorted(os.listdir(tmp_path)) == ["fifo"]
