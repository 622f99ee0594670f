"""``kvcache history add|plot``: entries keyed by commit or release and identity, never replaced; trend PNGs with
the steps marked (counted: every change; timed: only where the levels' intervals do not overlap). Runs from
tests/fakerun.py; the real-suite case is tests/suite/test_pr_gate.py."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from fakerun import make_run, recorded_run, write_run

from kvcache.analysing import history
from kvcache.analysing import step_detect as steps
from kvcache.cli import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("history")
    return {"clean": str(write_run(tmp / "clean.json", recorded_run(resamples=200))),
            "planted": str(write_run(tmp / "planted.json", recorded_run(counted={"dynamic": 5.0}, resamples=200)))}


def test_three_recorded_runs_plot_with_the_counted_step_marked(runs, tmp_path, capsys):
    store = tmp_path / "history.jsonl"
    for name, commit in (("clean", "a" * 40), ("clean", "b" * 40), ("planted", "c" * 40)):
        assert main(["history", "add", runs[name], "--store", str(store), "--commit", commit]) == 0
    assert main(["history", "plot", "--store", str(store), "--out", str(tmp_path / "plots")]) == 0
    assert "step: dynamic counted at cccccccc: 3 -> 5 (+2)" in capsys.readouterr().out
    steps = json.loads((tmp_path / "plots" / "steps.json").read_text())
    assert [(s["measure"], s["cache"], s["label"], s["delta"]) for s in steps] == [("counted", "dynamic", "c" * 8, 2.0)]
    decoding_only = {"per_token"}  # a figure of --kv-decoding keys only, which the recorded runs do not measure
    for measure in history.trend_measures():  # the recorded run has every other measure; one timed fit three times
        if measure in decoding_only:
            assert not (tmp_path / "plots" / f"{measure}.png").exists()
            continue
        assert (tmp_path / "plots" / f"{measure}.png").stat().st_size > 5000


ABC = "abc" + "0" * 37  # a full sha: kept as given where git cannot resolve it


def test_an_entry_is_never_replaced(runs, tmp_path, capsys):
    store = tmp_path / "history.jsonl"
    assert main(["history", "add", runs["clean"], "--store", str(store), "--commit", ABC]) == 0
    before = store.read_text()
    assert main(["history", "add", runs["planted"], "--store", str(store), "--commit", ABC.upper()]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvcache history: ") and f"already has an entry for commit {ABC}" in err and "\n" not in err
    assert store.read_text() == before
    # the same commit on another identity, and a release, are other entries
    other = write_run(tmp_path / "other.json", make_run({"dynamic": 3.0}, device_name="cpu: another"))
    assert main(["history", "add", str(other), "--store", str(store), "--commit", ABC]) == 0
    assert main(["history", "add", runs["clean"], "--store", str(store), "--release", "5.24.0"]) == 0
    entries = history.read_store(store)
    assert [(e.commit, e.release) for e in entries] == [(ABC, None), (ABC, None), (None, "5.24.0")]
    assert entries[0].caches["dynamic"]["counted"] == 3.0 and entries[0].caches["dynamic"]["by_op"]


def test_the_commit_defaults_to_git_head_and_its_absence_is_one_line(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # not a git repository
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert main(["history", "add", runs["clean"], "--store", "h.jsonl"]) == 2
    err = capsys.readouterr().err.strip()
    assert "git rev-parse HEAD failed" in err and "--commit REV" in err and "\n" not in err
    monkeypatch.setattr(history, "git_head", lambda: "f" * 40)
    assert main(["history", "add", runs["clean"], "--store", "h.jsonl"]) == 0
    assert history.read_store(tmp_path / "h.jsonl")[0].commit == "f" * 40


@pytest.mark.parametrize("argv, message", [
    (["add", "{run}", "--store", "{tmp}/h.jsonl", "--commit", "a b"], "--commit 'a b' must be one word"),
    (["add", "{run}", "--store", "{tmp}/h.jsonl", "--commit", "no-such-rev"],
     "--commit 'no-such-rev' is not a commit of the repository here"),
    (["add", "{tmp}/none.json", "--store", "{tmp}/h.jsonl", "--commit", "a" * 40], "none.json: cannot read"),
    (["add", "{run}", "--store", "{tmp}/no/h.jsonl", "--commit", "a" * 40], "does not exist"),
    (["plot", "--store", "{tmp}/bad.jsonl", "--out", "{tmp}/p"], "bad.jsonl:2: history entry is not JSON"),
    (["plot", "--store", "{tmp}/empty.jsonl", "--out", "{tmp}/p"], "no entries"),
])
def test_bad_input_is_one_line_exit_2(runs, tmp_path, capsys, argv, message):
    (tmp_path / "bad.jsonl").write_text('{"commit": "a", "caches": {}}\n{oops\n')
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["history", *[a.format(run=runs["clean"], tmp=tmp_path) for a in argv]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvcache history: ") and message in err and "\n" not in err, err


def test_counted_steps_are_every_change():
    assert steps.counted_steps([3.0, 3.0, None, 4.0, 4.0, 3.0]) == [(3, 3.0, 4.0), (5, 4.0, 3.0)]
    assert steps.counted_steps([1.0, 1.0 + 1e-7]) == []  # a few bytes: not a change the tables show
    assert steps.counted_steps([132, 133, 133], resolution=0.5) == [(1, 132, 133)]


def test_timed_steps_respect_the_intervals():
    rng = random.Random(0)
    noise = [30 + rng.gauss(0, 1) for _ in range(12)]
    assert steps.timed_steps(noise, [[v - 3, v + 3] for v in noise]) == []  # moves within the intervals
    jump = noise[:6] + [v + 15 for v in noise[6:]]
    ((index, before, after),) = steps.timed_steps(jump, [[v - 3, v + 3] for v in jump])
    assert index == 6 and after - before == pytest.approx(15, abs=2)
    # the same jump with intervals wide enough to overlap is no step
    assert steps.timed_steps(jump, [[v - 10, v + 10] for v in jump]) == []
    # entries without a figure are skipped; a figure without an interval gets ±10% of itself
    assert steps.timed_steps([30.0, None, 45.0], [[29, 31], None, None]) == [(2, 30.0, 45.0)]
    assert steps.timed_steps([30.0, 31.0], [None, None]) == []


def test_counted_figures_of_runners_with_other_cpus_make_one_line(tmp_path):
    """Counted passes do not depend on the CPU model: two runners' runs are one counted series (one step), while
    their timed figures are two series (a machine's timing is its own)."""
    store = tmp_path / "h.jsonl"
    for commit, device, counted in (("a" * 40, "cpu: one", 3.0), ("b" * 40, "cpu: two", 5.0)):
        run = write_run(tmp_path / f"{commit}.json", make_run({"dynamic": 3.0}, {"dynamic": counted},
                                                              device_name=device))
        assert main(["history", "add", str(run), "--store", str(store), "--commit", commit]) == 0
    entries = history.read_store(store)
    assert list(history.trend_series(entries, "counted")) == [("cpu | smollm2-135m | bfloat16", "dynamic")]
    assert len(history.trend_series(entries, "timed")) == 2
    assert [(s.cache, s.label, s.delta) for s in history.steps_of(entries, "counted")] == [("dynamic", "b" * 8, 2.0)]


def test_a_commit_is_stored_as_its_full_sha(runs, tmp_path, monkeypatch, capsys):
    """HEAD, the short sha and the full one are one commit: one entry, the full sha; the second add is refused."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "one"], cwd=repo, check=True)
    full = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()
    monkeypatch.chdir(repo)
    store = tmp_path / "h.jsonl"
    assert main(["history", "add", runs["clean"], "--store", str(store), "--commit", "HEAD"]) == 0
    for rev in (full[:7], full):
        assert main(["history", "add", runs["clean"], "--store", str(store), "--commit", rev]) == 2
        assert f"already has an entry for commit {full}" in capsys.readouterr().err
    assert [e.commit for e in history.read_store(store)] == [full]


def test_releases_are_plotted_by_version_with_the_steps_in_markdown(runs, tmp_path, capsys):
    """Releases added out of order (as a workflow's downloads come) are drawn by version, 4.9 before 4.10; the step
    is where the version order puts it, and steps.md tables it for a job summary, escaped."""
    store = tmp_path / "h.jsonl"
    for name, release in (("planted", "4.10.0"), ("clean", "4.9.1"), ("clean", "4.10.0rc1"), ("planted", "5.0.0")):
        assert main(["history", "add", runs[name], "--store", str(store), "--release", release]) == 0
    assert [e.release for e in history.ordered(history.read_store(store))] == ["4.9.1", "4.10.0rc1", "4.10.0",
                                                                                 "5.0.0"]
    assert main(["history", "plot", "--store", str(store), "--out", str(tmp_path / "plots")]) == 0
    assert "step: dynamic counted at 4.10.0: 3 -> 5 (+2)" in capsys.readouterr().out
    table = (tmp_path / "plots" / "steps.md").read_text()
    assert "#### Trend across 4 releases" in table and "`counted.png`" in table
    assert "| counted | dynamic | " in table and "| 4.10.0 | 3 | 5 | +2 |" in table, table


def test_plot_without_matplotlib_writes_the_steps_and_names_the_histories_pngs(runs, tmp_path, monkeypatch, capsys):
    """steps.json and steps.md need no matplotlib: they are written; the one-line error (exit 2) names the trend
    PNGs it could not draw, not the report's files."""
    store = tmp_path / "h.jsonl"
    for name, release in (("clean", "5.23.0"), ("planted", "5.24.0")):
        assert main(["history", "add", runs[name], "--store", str(store), "--release", release]) == 0
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["history", "plot", "--store", str(store), "--out", str(tmp_path / "trend")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "matplotlib is not installed" in err, err
    assert "cannot draw timed.png, counted.png, intercept.png, ops.png, weight_passes.png" in err, err
    assert "latency.png" not in err and "wrote steps.json and steps.md (1 steps)" in err, err
    steps = json.loads((tmp_path / "trend" / "steps.json").read_text())
    assert [(s["cache"], s["label"], s["delta"]) for s in steps] == [("dynamic", "5.24.0", 2.0)]
    assert "Charts: none" in (tmp_path / "trend" / "steps.md").read_text()
    assert not list((tmp_path / "trend").glob("*.png"))


def test_add_leaves_its_lock_file_beside_the_store_as_documented(runs, tmp_path):
    """The lock ``add`` takes is the empty file STORE.lock beside the store, left in place (removing it would let
    two writers lock two files); docs/pull-requests.md says so, and how a workflow keeps it out of a commit."""
    store = tmp_path / "history.jsonl"
    assert main(["history", "add", runs["clean"], "--store", str(store), "--release", "1.0"]) == 0
    lock = tmp_path / "history.jsonl.lock"
    assert lock.exists() and lock.stat().st_size == 0
    page = Path(__file__).resolve().parents[2] / "docs" / "pull-requests.md"
    assert "`history.jsonl.lock`" in page.read_text(encoding="utf-8")


def test_a_plot_whose_write_fails_leaves_the_folder_as_it_was(runs, tmp_path, monkeypatch, capsys):
    """A full disk as steps.md is written: the PNGs and steps.json of the plot before stay (none half-replaced), no
    temp folder is left, and the one-line error names --out (exit 2)."""
    import errno

    from kvcache.analysing import files

    store, out = tmp_path / "h.jsonl", tmp_path / "trend"
    assert main(["history", "add", runs["clean"], "--store", str(store), "--release", "5.23.0"]) == 0
    assert main(["history", "plot", "--store", str(store), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["history", "add", runs["planted"], "--store", str(store), "--release", "5.24.0"]) == 0
    capsys.readouterr()
    write = files.write_text_atomically

    def full(path, text):
        if Path(path).name == "steps.md":
            raise OSError(errno.ENOSPC, "No space left on device")
        write(path, text)

    monkeypatch.setattr(files, "write_text_atomically", full)
    assert main(["history", "plot", "--store", str(store), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"kvcache history: --out {out}: cannot write (No space left on device)\n", err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.jsonl", "h.jsonl.lock", "trend"]
