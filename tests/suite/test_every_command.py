"""Every ``kvcache`` command keeps what it was given (issue 39): each command of :data:`kvcache.cli.COMMANDS` is
walked with an output that is an input (the same path, a symlink to it, a hard link, a file written into an output
folder), an immutable output folder, an unwritable cache folder, a bad URL and an empty run. Each gives a one-line
error (exit 2) or a clean result, and its inputs are untouched. The commands that run long get two signals: the
suite one at a counted item and one in pytest's teardown (after its own unconfigure, where a second Ctrl-C a second
later lands: exit 2), ``kvcache ab`` two a second apart during start-up (exit 130, its ``--json`` written); none
prints a traceback. ``kvcache bisect`` stops by the same helper (:func:`kvcache.analysing.files.signals_stop`),
tested here in-process.

The command list comes from cli.py: a command added there must declare its cases in :data:`CASES` (what it reads
and writes), or :func:`test_every_command_declares_its_cases` names it. Runs are the recorded tiny run
(``tests/data/tiny-run.json``) and runs made from it; most cases run in-process and refuse before any work. The
immutable cases need ``chattr +i`` (root on ext4 or similar); they are skipped where it cannot be set.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvcache import cli
from tests.fakerun import RECORDED_RUN
from tests.kvrun import ROOT, describe, environment, output

PLUGINS = Path(__file__).resolve().parent / "plugins"
GAB = ["--format", "github-action-benchmark"]
TOO_LARGE = ("huge.json: kv.traffic.dynamic.passes is an integer of about 401 digits, too large for a number",)


@dataclass
class Case:
    """A command's arguments (after its name), the exit statuses it may end with and what its one error line
    must hold (when it exits 2); ``clean``: it must succeed (exit 0) instead."""

    argv: list[str]
    says: tuple[str, ...] = ()
    exits: tuple[int, ...] = (2,)
    needs: str | None = None  # "immutable", "/dev/full": skipped where chattr +i cannot be set, or no /dev/full


class Files:
    """The inputs every case reads, made fresh for each test: ``run`` and ``other`` (the recorded tiny run),
    ``link`` (a symlink to run), ``hard`` (a hard link to run), ``empty`` (a run whose classes were all skipped),
    ``counted`` (a counted-only run), ``nan`` (a run whose counted passes are NaN and text), ``other_model`` (the
    run with another model), an existing store ``store`` and ``folder``, an output folder holding a copy of the
    run as ``report.md`` and as ``steps.json``; ``immutable``: a folder with ``chattr +i`` (None where it cannot)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        doc = json.loads(RECORDED_RUN.read_text())
        self.run = self.write("run.json", doc)
        self.other = self.write("other.json", doc)
        self.link = tmp / "link.json"
        self.link.symlink_to(self.run)
        self.hard = tmp / "hard.json"
        os.link(self.other, self.hard)
        empty = json.loads(json.dumps(doc))
        empty["benchmarks"] = []
        kv = empty["kv"]
        kv.update(fit={}, traffic={}, probe={}, memory={}, verdict={}, ledger={}, points=[], ledger_points=[],
                  drift=None, crossovers=None,
                  skipped=[{"cache": c, "reason": "needs CUDA"} for c in ("dynamic", "static")])
        self.empty = self.write("empty.json", empty)
        counted = json.loads(json.dumps(doc))
        counted["benchmarks"] = []
        counted["kv"].update(fit={}, points=[], drift=None, crossovers=None)
        self.counted = self.write("counted.json", counted)
        nan = json.loads(json.dumps(doc))
        nan["kv"]["traffic"]["dynamic"]["passes"] = math.nan
        nan["kv"]["traffic"]["static"]["passes"] = "three"
        self.nan = self.write("nan.json", nan)
        huge = json.loads(json.dumps(doc))  # issue 49 item 7: JSON allows it; every figure's arithmetic overflowed
        huge["kv"]["traffic"]["dynamic"]["passes"] = 10**400
        self.huge = self.write("huge.json", huge)
        other_model = json.loads(json.dumps(doc))
        other_model["kv"]["settings"]["model"] = "smollm2-135m"
        other_model["kv"]["identity"]["model"] = "smollm2-135m"
        self.other_model = self.write("other-model.json", other_model)
        self.folder = tmp / "out"
        self.folder.mkdir()
        self.in_folder = {name: self.write(f"out/{name}", doc) for name in ("report.md", "steps.json", "a.log")}
        self.store = tmp / "history.jsonl"
        assert cli.main(["history", "add", str(self.run), "--store", str(self.store), "--release", "5.24.0"]) == 0
        entry = json.loads(self.store.read_text().splitlines()[0])  # a store written before history add refused it
        entry["caches"]["dynamic"]["counted"], entry["release"] = 10**400, "5.23.0"
        self.huge_store = tmp / "huge-history.jsonl"
        self.huge_store.write_text(self.store.read_text() + json.dumps(entry) + "\n")
        self.immutable: Path | None = tmp / "immutable"
        self.immutable.mkdir()
        done = subprocess.run(["chattr", "+i", str(self.immutable)], capture_output=True, text=True)
        if done.returncode != 0:
            self.immutable = None
        self.inputs = [self.run, self.other, self.empty, self.counted, self.store, *self.in_folder.values()]
        self.before = self.digests()

    def write(self, name: str, doc: dict) -> Path:
        path = self.tmp / name
        path.write_text(json.dumps(doc))
        return path

    def digests(self) -> dict[Path, str]:
        return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in self.inputs}

    def locked(self, name: str) -> str:
        """A path inside the immutable folder (the case is skipped where there is none)."""
        return str((self.immutable or self.tmp / "no-immutable") / name)

    def close(self) -> None:
        if self.immutable is not None:
            subprocess.run(["chattr", "-i", str(self.immutable)], capture_output=True)


def s(path: Path) -> str:
    return str(path)


#: command -> {case: Case from the inputs}. A case named ``clean ...`` must succeed; the others give one line.
CASES: dict[str, dict[str, Callable[[Files], Case]]] = {
    "traffic": {  # writes no file; its bad values answer before torch is imported
        "bad value": lambda f: Case(["--warmup", "9"], ("--warmup 9",)),
    },
    "architectures": {  # reads no file and writes none: it lists the installed release's model types
        "bad value": lambda f: Case(["--kv-at", "x"], ("--kv-at",)),
    },
    "compare": {  # reads only
        "clean: an empty run beside a full one": lambda f: Case([s(f.run), s(f.empty)], exits=(0,)),
        "a figure that is text": lambda f: Case([s(f.run), s(f.nan)], exits=(1,)),  # a counted figure: it fails
        "a figure too large for a number": lambda f: Case([s(f.run), s(f.huge)], TOO_LARGE),
        "another model": lambda f: Case([s(f.run), s(f.other_model)], ("refusing to compare", "model")),
    },
    "report": {
        "an output file in --out is an input": lambda f: Case(
            [s(f.in_folder["report.md"]), "--out", s(f.folder)], ("--out's report.md", "are one file")),
        "immutable --out": lambda f: Case([s(f.run), "--out", f.locked("report")], ("--out",),
                                          needs="immutable"),
        "--out is a file": lambda f: Case([s(f.run), "--out", s(f.other)], ("is not a folder",)),
        "clean: an empty run": lambda f: Case([s(f.empty), "--out", s(f.tmp / "report")], exits=(0,)),
        "a figure too large for a number": lambda f: Case([s(f.huge), "--out", s(f.tmp / "report")], TOO_LARGE),
        "another model": lambda f: Case([s(f.run), s(f.other_model), "--out", s(f.tmp / "report")],
                                        ("refusing to report", "model")),
    },
    "baseline": {
        "--baseline is the run": lambda f: Case([s(f.run), "--baseline", s(f.run)], ("are one file",)),
        "--baseline links to the run": lambda f: Case([s(f.run), "--baseline", s(f.link)], ("are one file",)),
        "--baseline is a hard link to the run": lambda f: Case([s(f.other), "--baseline", s(f.hard)],
                                                               ("are one file",)),
        "immutable folder": lambda f: Case([s(f.run), "--baseline", f.locked("b.json")], ("--baseline",),
                                           needs="immutable"),
        "an empty run": lambda f: Case([s(f.empty), "--baseline", s(f.tmp / "b.json")],
                                       ("no figure recorded", "every class was skipped")),
        "a figure too large for a number": lambda f: Case([s(f.huge), "--baseline", s(f.tmp / "b.json")],
                                                          TOO_LARGE),
    },
    "ab": {  # refused before any worker starts
        "--json is a log in --out-dir": lambda f: Case(["--out-dir", s(f.folder), "--json", s(f.in_folder["a.log"])],
                                                       ("are one file",)),
        "--out-dir is a file": lambda f: Case(["--out-dir", s(f.run)], ("--out-dir", "is not a folder")),
        "immutable --out-dir": lambda f: Case(["--out-dir", f.locked("ab")], ("--out-dir",), needs="immutable"),
        "unwritable --versions-dir": lambda f: Case(["--out-dir", s(f.tmp / "ab"), "--b-release", "5.23.0",
                                                     "--versions-dir", f.locked("versions")],
                                                    ("--versions-dir",), needs="immutable"),
        "immutable --json folder": lambda f: Case(["--out-dir", s(f.tmp / "ab"), "--json", f.locked("ab.json")],
                                                  ("--json",), needs="immutable"),
    },
    "bisect": {  # refused before git runs
        "unwritable --cache-dir": lambda f: Case(["--repo", s(f.tmp), "--good", "a", "--bad", "b", "--cache-dir",
                                                  f.locked("cache")], ("--cache-dir",), needs="immutable"),
        "--cache-dir is a file": lambda f: Case(["--repo", s(f.tmp), "--good", "a", "--bad", "b", "--cache-dir",
                                                 s(f.run)], ("--cache-dir", "is not a folder")),
        "immutable --json folder": lambda f: Case(["--repo", s(f.tmp), "--good", "a", "--bad", "b", "--json",
                                                   f.locked("b.json")], ("--json",), needs="immutable"),
    },
    "comment": {
        "--out is BASE": lambda f: Case([s(f.run), s(f.other), "--out", s(f.run)], ("are one file",)),
        "--out links to BASE": lambda f: Case([s(f.run), s(f.other), "--out", s(f.link)], ("are one file",)),
        "--out is a hard link to HEAD": lambda f: Case([s(f.run), s(f.other), "--out", s(f.hard)],
                                                       ("are one file",)),
        "--out is --ab": lambda f: Case([s(f.run), s(f.other), "--ab", s(f.counted), "--out", s(f.counted)],
                                        ("are one file",)),
        "immutable folder": lambda f: Case([s(f.run), s(f.other), "--out", f.locked("c.md")], ("--out",),
                                           needs="immutable"),
        "a URL urlsplit refuses": lambda f: Case([s(f.run), s(f.other), "--report-url", "http://[evil]/"],
                                                 ("--report-url",)),
        "a URL with a broken host": lambda f: Case([s(f.run), s(f.other), "--report-url", "http://[::1/"],
                                                   ("--report-url",)),
        "an --ab run of another model": lambda f: Case([s(f.run), s(f.other), "--ab", s(f.other_model)],
                                                       ("refusing to compare", "model")),
        "clean: an empty head": lambda f: Case([s(f.run), s(f.empty)], exits=(0,)),
        "--out on a full disk": lambda f: Case([s(f.run), s(f.other), "--out", "/dev/full"],
                                               ("--out /dev/full: cannot write (No space left on device)",),
                                               needs="/dev/full"),
        "a figure too large for a number": lambda f: Case([s(f.run), s(f.huge)], TOO_LARGE),
    },
    "history": {
        "--store is the run": lambda f: Case(["add", s(f.run), "--store", s(f.run), "--release", "5.23.0"],
                                             ("are one file",)),
        "--store links to the run": lambda f: Case(["add", s(f.run), "--store", s(f.link), "--release", "5.23.0"],
                                                   ("are one file",)),
        "a plot file in --out is the store": lambda f: Case(
            ["plot", "--store", s(f.in_folder["steps.json"]), "--out", s(f.folder)], ("--out's steps.json",)),
        "immutable --out": lambda f: Case(["plot", "--store", s(f.store), "--out", f.locked("plots")], ("--out",),
                                          needs="immutable"),
        "immutable --store folder": lambda f: Case(["add", s(f.run), "--store", f.locked("h.jsonl"), "--release",
                                                    "5.23.0"], ("--store",), needs="immutable"),
        "a release that is not a version": lambda f: Case(["add", s(f.run), "--store", s(f.store), "--release",
                                                           "latest"], ("--release", "latest")),
        "the same release spelt v5.24": lambda f: Case(["add", s(f.other), "--store", s(f.store), "--release",
                                                        "v5.24"], ("release 5.24.0",)),
        "an empty run": lambda f: Case(["add", s(f.empty), "--store", s(f.store), "--release", "5.23.0"],
                                       ("no figure", "every class was skipped")),
        "a figure too large for a number": lambda f: Case(["add", s(f.huge), "--store", s(f.store), "--release",
                                                           "5.23.0"], TOO_LARGE),
        "a store holding a figure too large for a number": lambda f: Case(
            ["plot", "--store", s(f.huge_store), "--out", s(f.tmp / "plots")],
            ("huge-history.jsonl:2: caches.dynamic.counted", "too large for a number")),
    },
    "sentinel": {  # refused before git runs or anything is measured
        "--json is --state": lambda f: Case(["--repo", s(f.tmp), "--state", s(f.tmp / "s.json"), "--json",
                                             s(f.tmp / "s.json")], ("are one file",)),
        "--issue-out links to --state": lambda f: Case(["--repo", s(f.tmp), "--state", s(f.run), "--issue-out",
                                                        s(f.link)], ("are one file",)),
        "immutable --state folder": lambda f: Case(["--repo", s(f.tmp), "--state", f.locked("s.json")],
                                                   ("--state",), needs="immutable"),
        "--repo not a git repository": lambda f: Case(["--repo", s(f.tmp), "--state", s(f.tmp / "s.json")],
                                                      ("--repo",)),
        "--issue-out in an immutable folder (releases)": lambda f: Case(
            ["--releases", "4.45..4.46", "--issue-out", f.locked("i.md")], ("--issue-out",), needs="immutable"),
    },
    "export": {
        "--out is the run": lambda f: Case([s(f.run), *GAB, "--out", s(f.run)], ("are one file",)),
        "--out links to the run": lambda f: Case([s(f.run), *GAB, "--out", s(f.link)], ("are one file",)),
        "immutable folder": lambda f: Case([s(f.run), *GAB, "--out", f.locked("e.json")], ("--out",),
                                           needs="immutable"),
        "an empty run": lambda f: Case([s(f.empty), *GAB], ("no figure", "every class was skipped")),
        "timed of a counted-only run": lambda f: Case([s(f.counted), *GAB, "--measures", "timed"],
                                                      ("no figure", "no timed fit")),
        "counted passes that are not numbers": lambda f: Case([s(f.nan), *GAB, "--measures", "counted"],
                                                              ("no figure",)),
        "--out on a full disk": lambda f: Case([s(f.run), *GAB, "--out", "/dev/full"],
                                               ("--out /dev/full: cannot write (No space left on device)",),
                                               needs="/dev/full"),
        "a figure too large for a number": lambda f: Case([s(f.huge), *GAB], TOO_LARGE),
    },
}


def walked() -> list[tuple[str, str]]:
    return [(command, case) for command in cli.COMMANDS for case in CASES.get(command, {})]


def test_every_command_declares_its_cases():
    missing = [command for command in cli.COMMANDS if command not in CASES]
    assert not missing, (f"kvcache {', '.join(missing)}: add what it reads and writes to CASES in {__file__} "
                         "(an output on an input, an unwritable output folder, an empty run)")


@pytest.fixture
def inputs(tmp_path):
    made = Files(tmp_path)
    yield made
    made.close()


def run_command(capsys, command: str, argv: list[str]) -> tuple[int, str, str]:
    try:
        code = cli.main([command, *argv])
    except SystemExit as exc:  # argparse in a command that does not catch it
        code = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("command, name", walked())
def test_each_command_refuses_in_one_line_or_runs_clean_and_keeps_its_inputs(inputs, capsys, command, name):
    case = CASES[command][name](inputs)
    if case.needs == "immutable" and inputs.immutable is None:
        pytest.skip("chattr +i cannot be set here (filesystem or privileges)")
    if case.needs == "/dev/full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    code, out, err = run_command(capsys, command, case.argv)
    shown = f"kvcache {command} {' '.join(case.argv)}\nexit {code}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    assert code in case.exits, shown
    assert "Traceback" not in out + err, shown
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"kvcache {command}: "), shown
        for text in case.says:
            assert text in lines[0], f"{text!r} not in the error line\n{shown}"
    assert inputs.digests() == inputs.before, f"an input changed\n{shown}"
    assert inputs.link.is_symlink()


def test_a_release_is_stored_under_its_normalised_name_and_steps_are_real(inputs, capsys):
    store = inputs.tmp / "releases.jsonl"
    for run, release in ((inputs.run, "v5.23.0"), (inputs.other, "5.24")):
        assert cli.main(["history", "add", str(run), "--store", str(store), "--release", release]) == 0
    assert cli.main(["history", "add", str(inputs.run), "--store", str(store), "--release", "5.23"]) == 2
    assert "already has an entry for release 5.23.0" in capsys.readouterr().err
    releases = [json.loads(line)["release"] for line in store.read_text().splitlines()]
    assert releases == ["5.23.0", "5.24.0"]
    assert cli.main(["history", "plot", "--store", str(store), "--out", str(inputs.tmp / "plots")]) == 0
    assert "0 steps" in capsys.readouterr().out  # the same run twice: no step


def test_a_figure_that_is_not_a_number_is_named_never_dropped_quietly(inputs, capsys):
    assert cli.main(["export", str(inputs.nan), *GAB]) == 0
    captured = capsys.readouterr()
    assert "dynamic: counted passes is nan, not a finite number: left out" in captured.err
    assert "static: counted passes is 'three', not a finite number: left out" in captured.err
    names = [entry["name"] for entry in json.loads(captured.out)]
    assert "dynamic: counted passes" not in names and "dynamic: ATen ops per step" in names
    assert cli.main(["history", "add", str(inputs.nan), "--store", str(inputs.tmp / "h.jsonl"), "--release",
                     "5.24.0"]) == 0
    assert "dynamic: counted passes is nan" in capsys.readouterr().err


def test_baseline_names_every_figure_it_records(inputs, capsys):
    assert cli.main(["baseline", str(inputs.counted), "--baseline", str(inputs.tmp / "b.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(not line.rstrip().endswith(":") for line in lines), lines


# --- signals -------------------------------------------------------------------------------------------------


def test_signals_after_the_first_only_print_until_the_command_exits(capfd):
    """The helper behind ab and bisect (and the suite's teardown): the first signal stops the block, every later one
    only prints, however many and whenever, and the handlers from before come back only when none came."""
    from kvcache.analysing import files

    class Stop(Exception):
        pass

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with files.signals_stop("kvcache test", Stop):
            pass
        assert {sig: signal.getsignal(sig) for sig in before} == before
        with pytest.raises(Stop, match="SIGTERM"), files.signals_stop("kvcache test", Stop):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs between bytecodes: here
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGTERM):
            os.kill(os.getpid(), sig)
            time.sleep(0.05)
        assert capfd.readouterr().err.count("already stopping") == 3
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def suite_stopped_twice(tmp: Path, signame: str, second: str = "unconfigure") -> subprocess.CompletedProcess:
    """The counted suite on tiny, sent ``signame`` at its second counted item and again in pytest's teardown
    (after the suite's own unconfigure: where a second Ctrl-C a second later lands) or, ``second`` "shutdown", in
    the interpreter's shutdown (after Python has put its signal handlers back to the default)."""
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "-q", "-m", "counted",
           "--kv-model", "tiny", "--kv-caches", "dynamic,static", "-p", "kv_signals", "--kv-test-signal", signame,
           "--kv-test-first", "counted", "--kv-test-second", second, "--kv-baseline",
           "none", "--benchmark-json", str(tmp / f"{signame}-{second}.json")]
    return subprocess.run(cmd, cwd=ROOT, env=environment([PLUGINS]), capture_output=True, text=True, timeout=300)


def ab_stopped_at_start_up(tmp: Path) -> subprocess.CompletedProcess:
    """``kvcache ab --json`` sent SIGTERM once its workers are starting (a.log exists) and again a second later."""
    out = tmp / "ab.json"
    cmd = [sys.executable, "-m", "kvcache.cli", "ab", "--out-dir", str(tmp / "ab"), "--json", str(out), "--",
           "--kv-model", "tiny", "--kv-caches", "dynamic"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=environment([PLUGINS]), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp / "ab" / "a.log").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(2):
            proc.send_signal(signal.SIGTERM)
            time.sleep(1)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def ab_with_a_bad_common_option(tmp: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kvcache.cli", "ab", "--out-dir", str(tmp / "bogus"), "--", "--kv-bogus"]
    return subprocess.run(cmd, cwd=ROOT, env=environment([PLUGINS]), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def long_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("signals")
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = {"SIGTERM": pool.submit(suite_stopped_twice, tmp, "SIGTERM"),
                "SIGINT": pool.submit(suite_stopped_twice, tmp, "SIGINT"),
                "SIGTERM-shutdown": pool.submit(suite_stopped_twice, tmp, "SIGTERM", "shutdown"),
                "SIGINT-shutdown": pool.submit(suite_stopped_twice, tmp, "SIGINT", "shutdown"),
                "ab": pool.submit(ab_stopped_at_start_up, tmp),
                "ab-bogus": pool.submit(ab_with_a_bad_common_option, tmp)}
        return tmp, {name: job.result() for name, job in jobs.items()}


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_the_suite_stopped_twice_exits_2_without_a_traceback_even_in_its_teardown(long_runs, signame):
    tmp, done = long_runs[0], long_runs[1][signame]
    assert done.returncode == 2, describe(done)
    text = output(done)
    assert "Traceback" not in text and "INTERNALERROR" not in text, describe(done)
    assert f"kvcache: {signame} again: already stopping" in text, describe(done)
    session = json.loads((tmp / f"{signame}-unconfigure.json").read_text())["kv"]["session"]
    assert session["interrupted"] is True and session["exit"] == f"interrupted by {signame}", session


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_second_signal_during_the_interpreters_shutdown_keeps_exit_2(long_runs, signame):
    """Python puts its signal handlers back to the default as it shuts down: a handled signal would then kill the
    process (143, 130). Once stopping, the suite ignores both signals as it exits (an ignored one stays ignored)."""
    tmp, done = long_runs[0], long_runs[1][f"{signame}-shutdown"]
    assert done.returncode == 2, describe(done)
    assert "Traceback" not in output(done) and "INTERNALERROR" not in output(done), describe(done)
    session = json.loads((tmp / f"{signame}-shutdown.json").read_text())["kv"]["session"]
    assert session["exit"] == f"interrupted by {signame}", session


COMMAND_STOPPED = """
import os, signal, sys
from kvcache import cli
sys.path.insert(0, {plugins!r})
from kv_signals import _AtShutdown

class Stop(Exception):
    pass

def parser():
    import argparse
    return argparse.ArgumentParser(prog="kvcache test")

def work(args):
    try:
        os.kill(os.getpid(), signal.{signame})
        signal.pause()  # the handler raises Stop here
    except Stop as exc:
        print(f"stopped by {{exc}}", flush=True)
        return 130
    return 0

late = _AtShutdown(signal.{signame})  # finalised as __main__'s globals are cleared: after the handlers' reset
sys.exit(cli.run(parser, work, [], stop=Stop))
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_command_stopped_keeps_its_exit_status_through_a_signal_at_shutdown(signame):
    """The runner's signal rule (:func:`kvcache.cli.run`): the first signal stops the work, and one that lands
    during the interpreter's shutdown (the second signal here, sent from a finaliser) leaves the status alone."""
    code = COMMAND_STOPPED.format(plugins=str(PLUGINS), signame=signame)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 130, describe(done)
    assert done.stdout == f"stopped by {signame}\n" and "Traceback" not in done.stderr, describe(done)


def test_ab_stopped_during_start_up_writes_its_json_and_exits_130(long_runs):
    tmp, done = long_runs[0], long_runs[1]["ab"]
    assert done.returncode == 130, describe(done)
    assert "Traceback" not in output(done), describe(done)
    doc = json.loads((tmp / "ab.json").read_text())
    assert doc["ab_run"]["interrupted"] == "SIGTERM", doc["ab_run"]
    assert doc["kv"]["session"]["interrupted"] is True and doc["side_a"]["kv"]["session"]["interrupted"] is True


def test_ab_names_a_bad_common_option(long_runs):
    done = long_runs[1]["ab-bogus"]
    assert done.returncode == 2, describe(done)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--kv-bogus" in lines[0] and "usage:" not in lines[0], describe(done)
