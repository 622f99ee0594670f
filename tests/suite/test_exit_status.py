"""The exit-status contract (issue 49 items 3 and 4), walked: :mod:`kvcache.exits`' table is docs/exit-status.md's and
the end of every command's ``--help``; every command, for every status the table says it can give, is invoked and
exits with that status's code; and a red gate is red in pytest's own last line.

Most commands run in this process on the recorded tiny run (``tests/data/tiny-run.json``) and runs made from it. The
long-running commands are cut where their work meets what they drive: ``kvcache ab``'s session without workers (as
``tests/without_torch/test_ab_session.py`` does), ``kvcache bisect``'s plan with probes made up here (as
``tests/without_torch/test_bisect_search.py`` does), ``kvcache sentinel``'s on a git repository of three commits
shaped like a Transformers checkout, its probes made up. An interrupt is a real SIGINT sent to this process from
inside the command's work."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcache import cli, exits
from tests.fakerun import RECORDED_RUN, planted
from tests.kvrun import ROOT, describe, run_batch

PAGE = ROOT / "docs" / "exit-status.md"


# --- the table, the page and the --help texts -------------------------------------------------------------------

def test_the_page_holds_the_tables_generated_from_the_module():
    text = PAGE.read_text(encoding="utf-8")
    assert exits.markdown_table() in text and exits.markdown_meanings() in text
    assert exits.regenerated(text) == text, "run: python -m kvcache.exits docs/exit-status.md"


def test_the_table_covers_every_command_and_the_suites_codes_are_pytests():
    assert list(exits.COMMAND_STATUSES) == list(cli.COMMANDS)
    for meanings in exits.COMMAND_STATUSES.values():
        assert set(meanings) <= set(exits.STATUS_BY_NAME), meanings
        assert {"pass", "usage error", "interrupted"} <= set(meanings)
    codes = pytest.ExitCode
    assert (exits.SUITE_PASS, exits.SUITE_FAILED, exits.SUITE_INTERRUPTED, exits.SUITE_INTERNAL_ERROR,
            exits.SUITE_USAGE_ERROR, exits.SUITE_NO_TESTS) == (codes.OK, codes.TESTS_FAILED, codes.INTERRUPTED,
                                                              codes.INTERNAL_ERROR, codes.USAGE_ERROR,
                                                              codes.NO_TESTS_COLLECTED)
    assert set(exits.SUITE_MEANINGS) == set(exits.STATUS_BY_NAME)


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_help_ends_with_the_commands_exit_statuses(capsys, command):
    assert cli.main([command, "--help"]) == exits.PASS
    shown = "".join(capsys.readouterr().out.split())  # argparse reflows it, and breaks exit-status.md at its hyphen
    assert "".join(exits.epilog(command).split()) in shown
    for number, name, _ in exits.command_statuses(command):
        assert "".join(f"{number} {name}:".split()) in shown


# --- every command, every status --------------------------------------------------------------------------------

class Inputs:
    """``run`` (the recorded tiny run), ``worse`` (the same with dynamic's counted passes 1 higher: a counted
    regression against ``run``), ``empty`` (every class skipped: no figure)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        doc = json.loads(RECORDED_RUN.read_text(encoding="utf-8"))
        self.run = self.write("run.json", doc)
        worse = copy.deepcopy(doc)
        dynamic = worse["kv"]["traffic"]["dynamic"]
        worse["kv"]["traffic"]["dynamic"] = planted(dynamic, dynamic["passes"] + 1.0)
        self.worse = self.write("worse.json", worse)
        empty = copy.deepcopy(doc)
        empty["benchmarks"] = []
        empty["kv"].update(fit={}, traffic={}, probe={}, memory={}, verdict={}, ledger={}, points=[], ledger_points=[],
                           drift=None, crossovers=None,
                           skipped=[{"cache": c, "reason": "needs CUDA"} for c in ("dynamic", "static")])
        self.empty = self.write("empty.json", empty)
        self.missing = str(tmp / "missing.json")

    def write(self, name: str, doc: dict) -> str:
        path = self.tmp / name
        path.write_text(json.dumps(doc), encoding="utf-8")
        return str(path)


def interrupt(*args, **kwargs):
    """Stands in for a step of a command's work: a SIGINT arrives (the runner's signal rule turns it into the
    command's stop)."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    raise AssertionError("SIGINT did not stop the command")


#: Where each command's work is cut to send the interrupt: a name its work calls.
INTERRUPT_AT = {
    "traffic": "kvcache.commands.traffic.parse_warmup",
    "compare": "kvcache.commands.compare.load_runs",
    "report": "kvcache.commands.report.load_runs",
    "baseline": "kvcache.commands.baseline.load_run",
    "ab": "kvcache.ab.session.run_session",
    "bisect": "kvcache.commands.bisect.make_plan",
    "sentinel": "kvcache.commands.sentinel.run_commits",
    "comment": "kvcache.commands.comment.load_run",
    "history": "kvcache.commands.history.load_run",
    "export": "kvcache.commands.export.load_run",
    "architectures": "kvcache.measuring.architectures.causal_lm_types",
}
#: Arguments that reach the point :data:`INTERRUPT_AT` names (``{run}``: the recorded run, ``{tmp}``: a folder).
INTERRUPT_ARGS = {
    "traffic": ["--model", "tiny"],
    "compare": ["{run}", "{run}"],
    "report": ["{run}", "--out", "{tmp}/report"],
    "baseline": ["{run}", "--baseline", "{tmp}/b.json"],
    "ab": ["--out-dir", "{tmp}/ab"],
    "bisect": ["--repo", "{tmp}", "--good", "a", "--bad", "b"],
    "sentinel": ["--repo", "{tmp}", "--state", "{tmp}/state.json"],
    "comment": ["{run}", "{run}"],
    "history": ["add", "{run}", "--store", "{tmp}/h.jsonl", "--release", "5.24.0"],
    "export": ["{run}", "--format", "github-action-benchmark"],
    "architectures": ["--list"],
}
#: Arguments that are a usage error for each command.
USAGE_ARGS = {
    "traffic": ["--warmup", "9"],
    "compare": ["{missing}"],
    "report": ["{missing}", "--out", "{tmp}/report"],
    "baseline": ["{empty}", "--baseline", "{tmp}/b.json"],
    "ab": ["--tolerance", "nan"],
    "bisect": ["--repo", "{tmp}/nowhere", "--good", "a", "--bad", "b"],
    "sentinel": ["--repo", "{tmp}", "--releases", "5.0..5.1"],
    "comment": ["{run}", "{missing}"],
    "history": ["add", "{empty}", "--store", "{tmp}/h.jsonl", "--release", "5.24.0"],
    "export": ["{run}", "--format", "nonsense"],
    "architectures": ["--kv-at", "many"],
}
#: The other statuses, each a command's arguments; ``report`` and ``traffic`` take longer (matplotlib, torch).
OTHER_ARGS = {
    ("traffic", "pass"): ["--model", "tiny", "--cache", "dynamic", "--device", "cpu", "--json"],
    ("traffic", "could not measure"): ["--model", "tiny", "--cache", "offloaded", "--device", "cpu"],  # cuda only
    ("compare", "pass"): ["{run}", "{run}"],
    ("compare", "regression"): ["{run}", "{worse}"],
    ("report", "pass"): ["{run}", "--out", "{tmp}/report"],
    ("baseline", "pass"): ["{run}", "--baseline", "{tmp}/b.json"],
    ("comment", "pass"): ["{run}", "{worse}"],  # a regression included: rendering is not judging
    ("history", "pass"): ["add", "{run}", "--store", "{tmp}/h.jsonl", "--release", "5.24.0"],
    ("export", "pass"): ["{run}", "--format", "github-action-benchmark"],
    ("architectures", "pass"): ["--list"],
}
#: Statuses a test elsewhere invokes: (file, test name). None today: every status is invoked here.
ELSEWHERE: dict[tuple[str, str], tuple[str, str]] = {}
#: Statuses no test invokes, each with the reason (the table is walked: a new one must be named here or run).
NOT_WALKED: dict[tuple[str, str], str] = {}


def cases() -> list[tuple[str, str]]:
    return [(command, name) for command, meanings in exits.COMMAND_STATUSES.items() for name in meanings]


def fill(argv: list[str], inputs: Inputs) -> list[str]:
    names = {"run": inputs.run, "worse": inputs.worse, "empty": inputs.empty, "missing": inputs.missing,
             "tmp": str(inputs.tmp)}
    return [arg.format(**names) for arg in argv]


def fake_ab(monkeypatch, *, regression: bool = False, side_failed: bool = False, verdict: str = "pass") -> None:
    """``kvcache ab``'s session without workers: one item measured, the judge's verdict ``verdict``, a regression
    or not, a side that failed part-way or not."""
    from kvcache.ab import session
    from kvcache.analysing.judge import paired

    doc = {"ab": {"dynamic": {"timed": {"status": verdict}}}, "ab_run": {"pairs": [], "notes": []}}

    class Result:
        def __init__(self) -> None:
            self.doc, self.verdicts, self.run = doc, doc["ab"], self

        def update(self, **fields) -> None:
            self.doc["ab_run"].update(fields)

        def to_json(self) -> dict:
            return self.doc

    side = SimpleNamespace(failure="worker exited 1 at item 2" if side_failed else None, kill=lambda: None,
                           finish=lambda: None)
    monkeypatch.setattr(session, "build_sides", lambda args, out_dir, say: [side])
    monkeypatch.setattr(session, "start", lambda ab_session, common, cwd: ab_session.items.append("x"))
    monkeypatch.setattr(session, "drive", lambda ab_session, say: None)
    monkeypatch.setattr(session, "results", lambda ab_session, tolerance: Result())
    monkeypatch.setattr(session, "ab_summary", lambda result: [f"dynamic timed: {verdict}"])
    monkeypatch.setattr(paired, "regressions", lambda verdicts: ["dynamic timed"] if regression else [])


def fake_bisect(monkeypatch, figures: dict) -> None:
    """``kvcache bisect``'s plan over commits ``c0..`` after ``g`` with probes from ``figures`` (test_bisect_search's
    made-up probes)."""
    from kvcache.bisect import probing, search, walk
    from tests.without_torch.test_bisect_search import FakeRunner

    def make_plan(args, extra, workdir, say):
        names = [n for n in figures if n != "g"]
        items = [probing.Revision(n, n, f"subject of {n}", "2026-01-01") for n in names]
        return walk.Plan((probing.Revision("g", "g"), items[-1]), items, FakeRunner(figures),
                         probing.ProbeCache(None, {"options": []}), search.bisect_measures()["passes"], None,
                         "repo test", [])

    monkeypatch.setattr("kvcache.commands.bisect.make_plan", make_plan)


def fake_sentinel(monkeypatch, tmp: Path, head: float | str) -> list[str]:
    """A git repository of three commits, each with ``src/transformers/__init__.py``; the sentinel's probes made up:
    dynamic's counted passes 3.0 at the first two, ``head`` at the last (a string: the reason it cannot be
    measured). The arguments of a first run from the first commit."""
    import subprocess

    from tests.without_torch.test_bisect_search import FakeRunner, kv

    repo = tmp / "transformers"
    (repo / "src" / "transformers").mkdir(parents=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q", "-b", "main")
    shas = []
    for i in range(3):
        (repo / "src" / "transformers" / "__init__.py").write_text(f"version = {i}\n")
        git("add", "-A")
        git("commit", "-q", "-m", f"commit {i}")
        shas.append(git("rev-parse", "HEAD"))
    table = {sha: kv({"dynamic": 3.0, "static": 1.0}) for sha in shas[:2]}
    table[shas[2]] = head if isinstance(head, str) else kv({"dynamic": head, "static": 1.0})
    def runner(top: Path, suite) -> FakeRunner:
        made = FakeRunner(table)
        made.suite = suite  # what the report's reproduce line reads
        return made

    monkeypatch.setattr("kvcache.sentinel.watching.CommitRunner", runner)
    return ["--repo", str(repo), "--state", str(tmp / "state.json"), "--since", shas[0], "--no-cache",
            "--no-fork-server", "--json", str(tmp / "sentinel.json")]


def prepared(command: str, status: str, inputs: Inputs, monkeypatch) -> list[str]:
    """The arguments that give ``status``, with whatever the command's work is cut at already patched."""
    if status == "interrupted":
        monkeypatch.setattr(INTERRUPT_AT[command], interrupt)
        return fill(INTERRUPT_ARGS[command], inputs)
    if status == "usage error":
        return fill(USAGE_ARGS[command], inputs)
    if command == "ab":
        fake_ab(monkeypatch, regression=status == "regression", side_failed=status == "could not measure",
                verdict={"regression": "regression", "inconclusive": "inconclusive"}.get(status, "pass"))
        return ["--out-dir", str(inputs.tmp / "ab"), "--json", str(inputs.tmp / "ab.json")]
    if command == "bisect":
        from tests.without_torch.test_bisect_search import series

        values = {"pass": [3.0, 3.0, 5.0, 5.0], "regression": [3.0, 3.0, 3.0, 3.0],
                  "could not measure": [3.0, 3.0, 5.0, 5.0]}[status]
        fake_bisect(monkeypatch, series(values, skip=(1,) if status == "could not measure" else ()))
        return ["--repo", str(inputs.tmp)]
    if command == "sentinel":
        head = {"pass": 3.0, "regression": 5.0, "could not measure": "ImportError: the head does not build"}[status]
        return fake_sentinel(monkeypatch, inputs.tmp, head)
    if command == "compare" and status == "inconclusive":
        return inconclusive_pair(inputs)
    return fill(OTHER_ARGS[(command, status)], inputs)


def inconclusive_pair(inputs: Inputs) -> list[str]:
    """Two runs whose timed verdict is inconclusive (the later one's fit has an R² below its --kv-min-r2) and no
    figure regressed."""
    doc = json.loads(Path(inputs.run).read_text(encoding="utf-8"))
    for fit in doc["kv"]["fit"].values():
        fit["r2"] = 0.5
    return [inputs.run, inputs.write("poor.json", doc)]


@pytest.mark.parametrize(("command", "status"), cases(), ids=lambda x: str(x).replace(" ", "-"))
def test_each_command_exits_with_the_code_of_each_status_it_can_give(tmp_path, monkeypatch, capsys, command,
                                                                      status):
    if (command, status) in ELSEWHERE:
        path, name = ELSEWHERE[(command, status)]
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), (path, name)
        pytest.skip(f"invoked by {path}::{name}")
    if (command, status) in NOT_WALKED:
        pytest.skip(f"not walked: {NOT_WALKED[(command, status)]}")
    if command == "traffic" and status in ("pass", "interrupted", "could not measure"):
        pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    argv = prepared(command, status, Inputs(tmp_path), monkeypatch)
    code = cli.main([command, *argv])
    out, err = capsys.readouterr()
    assert code == exits.status_code(status), f"kvcache {command} {argv}: exit {code}\n{out[-2000:]}\n{err[-2000:]}"
    assert "Traceback" not in err, err
    if status == "interrupted":
        assert "interrupted" in err, err
    if status == "inconclusive":
        assert "inconclusive" in out, out


def test_the_walk_names_no_status_the_table_does_not_have():
    named = {*OTHER_ARGS, *ELSEWHERE, *NOT_WALKED}
    assert named <= set(cases()), named - set(cases())


# --- a red gate in pytest's own words ---------------------------------------------------------------------------

def test_a_red_gate_is_red_in_pytests_last_line():
    counted = ["-m", "counted", "--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-baseline", "none"]
    done = run_batch({"red": [*counted, "--kv-max-passes", "dynamic=1"],
                      "reported": [*counted, "--kv-max-passes", "dynamic=1", "--kv-no-gate"],
                      "green": counted})
    red, reported, green = done["red"], done["reported"], done["green"]
    last: Callable[..., str] = lambda d: d.stdout.strip().splitlines()[-1]  # noqa: E731
    assert red.returncode == exits.SUITE_FAILED, describe(red)
    assert "1 failed" in last(red) and "1 passed" in last(red), describe(red)
    assert "FAILED kv-cache gate - kv-cache regression: dynamic counted" in red.stdout, describe(red)
    for run in (reported, green):  # a gate that does not fail the build leaves pytest's words as they were
        assert run.returncode == exits.SUITE_PASS, describe(run)
        assert "failed" not in last(run) and "1 passed" in last(run), describe(run)
    assert "not failing: --kv-no-gate" in reported.stdout, describe(reported)
