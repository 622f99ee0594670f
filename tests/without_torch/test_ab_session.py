"""``kvcache ab``'s session (:mod:`kvcache.ab.session`) without workers: a ``--json`` that cannot be written (a full
disk, ``/dev/full``) is one line naming it and exit 2, never a traceback and exit 1 ("a regression"), and the
session's results are kept in a new file it names; ``--json`` may not be an extension's log in ``--out-dir``. No
torch."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvcache.ab import extend, session
from kvcache.commands import ab as command

DOC = {"ab": {"dynamic": {"timed": {"status": "regression"}}}, "ab_run": {"pairs": [], "notes": []}}
FULL = Path("/dev/full")


class Result:
    """Stands in for :class:`kvcache.ab.results.ABResult`: its document, its verdicts, ``run.update``."""

    def __init__(self, doc):
        self.doc, self.verdicts, self.run = doc, doc.get("ab", {}), self

    def update(self, **fields):
        self.doc.setdefault("ab_run", {}).update(fields)

    def to_json(self):
        return self.doc


@pytest.fixture
def measured(monkeypatch):
    """A session that measured one item and whose judge finds a regression (exit 1 when written)."""

    def start(ab_session, common, cwd):
        ab_session.items.append("test_traffic[dynamic]")

    monkeypatch.setattr(session, "build_sides", lambda args, out_dir, say: [])
    monkeypatch.setattr(session, "start", start)
    monkeypatch.setattr(session, "drive", lambda ab_session, say: None)
    monkeypatch.setattr(session, "results", lambda ab_session, tolerance: Result(json.loads(json.dumps(DOC))))
    monkeypatch.setattr(session, "ab_summary", lambda doc: ["dynamic timed: regression"])
    from kvcache.analysing.judge import paired as judge

    monkeypatch.setattr(judge, "regressions", lambda ab: ["dynamic timed"])


def test_a_written_session_with_a_regression_exits_1(measured, tmp_path, capsys):
    out = tmp_path / "ab.json"
    assert command.main(["--out-dir", str(tmp_path / "ab"), "--json", str(out)]) == 1
    assert json.loads(out.read_text())["ab"] == DOC["ab"]


@pytest.mark.skipif(not FULL.exists(), reason="no /dev/full here")
def test_a_json_that_cannot_be_written_is_one_line_exit_2_and_the_results_are_kept(measured, tmp_path, capsys):
    out_dir = tmp_path / "ab"
    assert command.main(["--out-dir", str(out_dir), "--json", str(FULL)]) == 2
    captured = capsys.readouterr()
    assert "dynamic timed: regression" in captured.out  # the summary is said all the same
    errors = [line for line in captured.err.splitlines() if line.startswith("kvcache ab: --json")]
    assert len(errors) == 1 and "Traceback" not in captured.err, captured.err
    found = re.fullmatch(r"kvcache ab: --json /dev/full: cannot write \(No space left on device\); the session's "
                         r"results are kept in (\S+)", errors[0])
    assert found, errors[0]
    kept = Path(found.group(1))
    assert kept.parent == out_dir and json.loads(kept.read_text())["ab"] == DOC["ab"]


@pytest.mark.skipif(not FULL.exists(), reason="no /dev/full here")
def test_results_that_cannot_be_kept_anywhere_say_so(tmp_path, monkeypatch):
    monkeypatch.setattr(session.tempfile, "gettempdir", lambda: str(tmp_path / "none"))
    said = session.write_results(str(FULL), Result(DOC), tmp_path / "missing")
    assert said is not None and said.startswith("--json /dev/full: cannot write (No space left on device); nor")
    assert "only the summary is left" in said


def test_json_on_an_extension_log_in_out_dir_is_refused_before_anything_runs(tmp_path, capsys):
    for log in ("a-more-1.log", f"b-more-{extend.MAX_EXTENSIONS}.log"):
        assert log in extend.MORE_LOGS
        argv = ["--out-dir", str(tmp_path), "--more-rounds-within", "5", "--json", str(tmp_path / log)]
        assert command.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--out-dir's {log}" in err and "are one file" in err, err
        assert not (tmp_path / log).exists()


@pytest.mark.skipif(not FULL.exists(), reason="no /dev/full here")
def test_stopped_during_start_up_with_a_json_that_cannot_be_written_exits_2(monkeypatch, tmp_path, capsys):
    """Interrupted before the workers said hello: the document with no pairs is kept the same way, exit 2 (not
    130: the file the caller asked for is not there)."""

    def start(ab_session, common, cwd):
        raise session.Interrupted("SIGTERM")

    monkeypatch.setattr(session, "build_sides", lambda args, out_dir, say: [])
    monkeypatch.setattr(session, "start", start)
    monkeypatch.setattr(session, "results_before_start", lambda sides, interrupted, tolerance: Result({"ab_run": {
        "interrupted": interrupted}}))
    out_dir = tmp_path / "ab"
    assert command.main(["--out-dir", str(out_dir), "--json", str(FULL)]) == 2
    err = capsys.readouterr().err
    assert "kvcache ab: --json /dev/full: cannot write (No space left on device); the session's results are kept in" \
        in err and "Traceback" not in err, err
    kept = list(out_dir.glob("ab-unwritten-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == {"ab_run": {"interrupted": "SIGTERM"}}
