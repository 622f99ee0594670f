"""Files and signals, end to end on ``tiny``: two outputs (or an output and the baseline) on one file are refused
at start-up; a symlinked baseline or JSON is written through to its target; an immutable or append-only output
is caught before anything runs, naming the file; SIGTERM stops a run as Ctrl-C does (the finished points
written, the session marked interrupted, exit 2, no timed baseline); a second signal, while pytest handles the
first or while the results are written, neither spoils the file nor clears the interrupted mark.

The start-up cases, and the signals sent from inside (``-p kv_signals``: two SIGINTs or two SIGTERMs, the second
while pytest handles the first or while the results are written, at fixed moments, so deterministic), are fresh
``pytest.main`` runs, a subprocess for each kind (tests/kvrun.py); one more run is a real command line sent
SIGTERM from outside, as ``timeout`` would, once its first timed point has passed. Nothing here asserts on
timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kvrun import ROOT, assert_one_line_usage_error, describe, environment, load_json, output, run_batch

pytest.importorskip("torch")
pytest.importorskip("transformers")

PLUGINS = Path(__file__).resolve().parent / "plugins"
USAGE_ERROR, INTERRUPTED = 4, 2
TIMED = ["--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-contexts", "128,256", "--kv-steps", "3",
         "--kv-warmup", "0", "--kv-copy-mib", "8", "--kv-ledger-steps", "0", "--kv-no-gate"]
ROUND_0 = 2  # timed points finished before the first signal: round 0 (two contexts, one class)
BASELINE = {"schema": 2, "devices": {}}


def set_attribute(path: Path, flag: str) -> bool:
    """``chattr +FLAG path``; False where the filesystem or the user cannot (tmpfs, no CAP_LINUX_IMMUTABLE)."""
    try:
        done = subprocess.run(["chattr", f"+{flag}", str(path)], capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return done.returncode == 0


class Runs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.attributes: list[tuple[Path, str]] = []  # (file, flag) set with chattr, cleared at the end
        self.skipped: dict[str, str] = {}  # case -> why it cannot run here
        self.baseline = tmp / "baseline.json"
        self.baseline.write_text(json.dumps(BASELINE))
        self.cases: dict[str, list[str]] = {}  # start-up and file cases
        self.signal_cases: dict[str, list[str]] = {}  # one batch of their own: no signal kills the others
        self.expected: dict[str, list[str]] = {}  # start-up case -> texts its one error line holds
        self._startup_cases()
        self._signal_cases()

    def path(self, name: str, content: str | None = None) -> Path:
        p = self.tmp / name
        if content is not None:
            p.write_text(content)
        return p

    def refused(self, name: str, args: list[str], *texts: str) -> None:
        self.cases[name] = ["--co", "-q", "--kv-model", "tiny", *args]
        self.expected[name] = list(texts)

    def _startup_cases(self) -> None:
        b = str(self.baseline)
        link = self.tmp / "link-to-baseline.json"
        link.symlink_to(self.baseline)
        hard = self.tmp / "hard-link-to-baseline.json"
        os.link(self.baseline, hard)
        self.refused("json-is-baseline", ["--kv-baseline", b, "--benchmark-json", b],
                     f"--kv-baseline {b} and --benchmark-json {b} are one file",
                     "--benchmark-json would replace it", "give each its own path")
        self.refused("json-links-to-baseline", ["--kv-baseline", b, "--benchmark-json", str(link)],
                     f"--benchmark-json {link} are one file ({self.baseline})")
        self.refused("json-hard-link-to-baseline", ["--kv-baseline", b, "--benchmark-json", str(hard)],
                     f"--benchmark-json {hard} are one file")
        new = str(self.tmp / "new.json")  # neither exists yet: the same path all the same
        self.refused("json-is-updated-baseline", ["--kv-update-baseline", "--kv-baseline", new,
                                                  "--benchmark-json", new],
                     f"--kv-baseline {new} and --benchmark-json {new} are one file",
                     "one would be written over the other")
        xml = str(self.tmp / "out.xml")
        self.refused("json-is-junitxml", ["--kv-baseline", "none", "--benchmark-json", xml,
                                          "--junitxml", xml],
                     f"--benchmark-json {xml} and --junitxml {xml} are one file")
        for flag, what in (("i", "immutable"), ("a", "append-only")):
            baseline = self.path(f"{what}-baseline.json", json.dumps(BASELINE))
            out = self.path(f"{what}.json", "{}")
            for path in (baseline, out):
                if set_attribute(path, flag):
                    self.attributes.append((path, flag))
            names = {f"baseline-{what}": (baseline, ["--kv-update-baseline", "--kv-baseline", str(baseline)],
                                          f"--kv-baseline {baseline}: cannot be written"),
                     f"json-{what}": (out, ["--kv-baseline", "none", "--benchmark-json",
                                            str(out)], f"--benchmark-json {out}"),}
            for name, (path, args, text) in names.items():
                if (path, flag) in self.attributes:
                    self.refused(name, args, text)
                else:
                    self.skipped[name] = f"chattr +{flag} is not available here (filesystem or privileges)"
        read_only = self.path("read-only-baseline.json", json.dumps(BASELINE))
        read_only.chmod(0o444)
        if os.geteuid() == 0:
            self.skipped["baseline-read-only"] = "permissions do not stop root (the immutable case covers root)"
        else:
            self.refused("baseline-read-only", ["--kv-update-baseline", "--kv-baseline", str(read_only)],
                         f"--kv-baseline {read_only}: cannot be written")
        # a symlinked baseline and JSON in another folder: written through to their targets
        targets = self.tmp / "targets"
        targets.mkdir()
        (targets / "baseline.json").write_text(json.dumps(BASELINE))
        (targets / "run.json").write_text("{}")
        (self.tmp / "baseline-link.json").symlink_to(targets / "baseline.json")
        (self.tmp / "run-link.json").symlink_to(targets / "run.json")
        self.cases["symlinks"] = ["-m", "counted", "--kv-model", "tiny", "--kv-caches", "dynamic",
                                  "--kv-update-baseline", "--kv-baseline", str(self.tmp / "baseline-link.json"),
                                  "--benchmark-json", str(self.tmp / "run-link.json")]

    def _signal_cases(self) -> None:
        plugin = ["-p", "kv_signals"]
        for name, args in {  # a single SIGTERM mid-sweep: test_a_signal_from_outside_loses_no_finished_point
            "term-twice": ["--kv-rounds", "2", "--kv-test-signal", "SIGTERM", "--kv-test-second", "keyboard_interrupt"],
            "int-twice": ["--kv-rounds", "2", "--kv-test-signal", "SIGINT", "--kv-test-second", "keyboard_interrupt"],
            "term-during-write": ["--kv-rounds", "2", "--kv-test-signal", "SIGTERM", "--kv-test-second", "update_json"],
            "int-only-during-write": ["--kv-rounds", "1", "--kv-test-signal", "SIGINT", "--kv-test-first", "none",
                                      "--kv-test-second", "update_json"],
            "term-after-analysis": ["--kv-rounds", "1", "--kv-test-signal", "SIGTERM", "--kv-test-first", "none",
                                    "--kv-test-second", "sessionfinish"],
        }.items():
            baseline = self.path(f"{name}-baseline.json", json.dumps(BASELINE))
            self.signal_cases[name] = [*TIMED, *plugin, *args, "--kv-update-baseline", "--kv-baseline",
                                       str(baseline), "--benchmark-json", str(self.tmp / f"{name}.json")]

    def clear_attributes(self) -> None:
        for path, flag in self.attributes:
            subprocess.run(["chattr", f"-{flag}", str(path)], capture_output=True, timeout=30)


def batch_or_failures(cases: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    """:func:`kvrun.run_batch`, or, where a signal killed the batch's process, one failed result per case saying
    so (each test then fails on its own)."""
    try:
        return run_batch(cases, pythonpath=[PLUGINS])
    except RuntimeError as exc:
        return {name: subprocess.CompletedProcess(["pytest.main", *args], None, "", str(exc))
                for name, args in cases.items()}


def signalled_from_outside(tmp: Path, name: str) -> subprocess.CompletedProcess:
    """``python -m pytest benchmarks -v ...`` sent SIGTERM, as ``timeout`` would, once its first timed point has
    passed; its output and exit status as a CompletedProcess. It has rounds enough left that it cannot finish
    before the signal lands, whatever the machine; killed if it outlives the guard (no timing asserted)."""
    args = [sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "-v", "-m", "timed", *TIMED,
            "--kv-rounds", "5", "--kv-baseline", "none",  # rounds it never gets to
            "--benchmark-json", str(tmp / f"{name}.json")]
    proc = subprocess.Popen(args, cwd=ROOT, env=environment(PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    guard = threading.Timer(600, proc.kill)  # a child that hangs before its first point cannot hang the suite
    guard.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if "test_decode[" in line and "PASSED" in line:
                proc.send_signal(signal.SIGTERM)
                break
        rest, _ = proc.communicate(timeout=300)
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, "".join(lines) + (rest or ""), "")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("files-signals")
    r = Runs(tmp)
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            batch = pool.submit(run_batch, r.cases, pythonpath=[PLUGINS])
            signalled = pool.submit(batch_or_failures, r.signal_cases)
            term = pool.submit(signalled_from_outside, tmp, "outside-term")
            results = {**batch.result(), **signalled.result(), "outside-term": term.result()}
    finally:
        r.clear_attributes()
    return r, results


STARTUP = ["json-is-baseline", "json-links-to-baseline", "json-hard-link-to-baseline", "json-is-updated-baseline",
           "json-is-junitxml", "baseline-immutable", "json-immutable", "baseline-append-only", "json-append-only",
           "baseline-read-only"]


@pytest.mark.parametrize("case", STARTUP)
def test_unwritable_or_shared_output_is_refused_at_start(runs, case):
    r, results = runs
    if case in r.skipped:
        pytest.skip(r.skipped[case])
    done = results[case]
    assert_one_line_usage_error(done, r.expected[case])


def test_the_baseline_is_untouched_by_a_refused_run(runs):
    r, _ = runs
    assert load_json(r.baseline) == BASELINE


def test_symlinks_are_written_through_to_their_targets(runs):
    r, results = runs
    done = results["symlinks"]
    assert done.returncode == 0, describe(done)
    for link, target in (("baseline-link.json", "baseline.json"), ("run-link.json", "run.json")):
        assert (r.tmp / link).is_symlink(), f"{link} was replaced by a regular file"
        assert os.readlink(r.tmp / link) == str(r.tmp / "targets" / target)
    devices = load_json(r.tmp / "targets" / "baseline.json")["devices"]
    assert devices["cpu | tiny | bfloat16"]["dynamic"]["counted_passes"] > 0
    assert "traffic" in load_json(r.tmp / "targets" / "run.json")["kv"]
    leftovers = [p.name for p in (r.tmp / "targets").iterdir() if p.name not in ("baseline.json", "run.json")]
    assert not leftovers, leftovers


def check_interrupted(done: subprocess.CompletedProcess, json_path: Path, signame: str, *,
                      points: int = ROUND_0) -> dict:
    """Exit 2, no traceback, and a whole JSON with the finished points, marked interrupted by ``signame``."""
    assert done.returncode == INTERRUPTED, describe(done)
    text = output(done)
    assert "Traceback" not in text and "INTERNALERROR" not in text, describe(done)
    doc = load_json(json_path)  # a whole JSON document
    assert len(doc["benchmarks"]) >= points, describe(done)
    session = doc["kv"]["session"]
    assert session["interrupted"] is True and session["exit"] == f"interrupted by {signame}", session
    return doc


@pytest.mark.parametrize("case, signame", [("term-twice", "SIGTERM"), ("int-twice", "SIGINT"),
                                           ("term-during-write", "SIGTERM")])
def test_a_signal_writes_the_finished_points_marked_interrupted(runs, case, signame):
    r, results = runs
    check_interrupted(results[case], r.tmp / f"{case}.json", signame)
    devices = load_json(r.tmp / f"{case}-baseline.json")["devices"]
    assert devices, "the counted passes (exact) are recorded"
    assert all("timed_passes" not in e for by_cache in devices.values() for e in by_cache.values()), devices


def test_a_signal_while_the_results_are_written_fails_the_run_and_records_no_timed_passes(runs):
    r, results = runs
    doc = check_interrupted(results["int-only-during-write"], r.tmp / "int-only-during-write.json", "SIGINT",
                            points=ROUND_0 + 1)  # every point was measured: one round and the drift
    assert any(b["name"] == "test_drift" for b in doc["benchmarks"]), [b["name"] for b in doc["benchmarks"]]
    devices = load_json(r.tmp / "int-only-during-write-baseline.json")["devices"]
    assert all("timed_passes" not in e for by_cache in devices.values() for e in by_cache.values()), devices


def test_sigterm_from_outside_loses_no_finished_point(runs):
    r, results = runs
    check_interrupted(results["outside-term"], r.tmp / "outside-term.json", "SIGTERM", points=1)


def test_a_signal_after_the_analysis_records_no_baseline_and_fails_the_run(runs):
    """The JSON is whole and says what the analysis found; the baseline is left as it was; the exit is 2."""
    r, results = runs
    done = results["term-after-analysis"]
    assert done.returncode == INTERRUPTED, describe(done)
    assert "Traceback" not in output(done) and "INTERNALERROR" not in output(done), describe(done)
    assert "baseline NOT written to" in output(done) and "SIGTERM arrived while the results were being written" \
        in output(done), describe(done)
    assert len(load_json(r.tmp / "term-after-analysis.json")["benchmarks"]) == ROUND_0 + 1
    assert load_json(r.tmp / "term-after-analysis-baseline.json") == BASELINE
