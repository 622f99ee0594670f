"""``kvcache compare --strict`` (also spelt ``--kv-strict``, the suite's flag): what ``--kv-strict`` fails in the
suite's gate fails compare too, exit 1 (:func:`kvcache.analysing.judge.gate.strict_failure`, the one rule): an
inconclusive timed verdict, a class a later run skipped where the first run has figures, a drift beyond
``--max-drift``. Without it they are shown and compare exits 0, whatever ``--kv-strict`` a run was made with."""

from __future__ import annotations

import pytest
from fakerun import make_run, recorded_run, write_run

from kvcache.analysing.judge import gate
from kvcache.analysing.records import Verdict
from kvcache.cli import main


@pytest.fixture(scope="module")
def skipping(tmp_path_factory):
    """A first run with dynamic and static, and a later run that skipped static (its settings name it)."""
    folder = tmp_path_factory.mktemp("strict")
    base, head = make_run(), make_run({"dynamic": 3.0}, {"dynamic": 3.0})
    head["kv"]["settings"]["caches"] = ["dynamic", "static"]
    head["kv"]["skipped"] = [{"cache": "static", "context": None, "reason": "static runs on cuda only"}]
    return [str(write_run(folder / "base.json", base)), str(write_run(folder / "head.json", head))]


@pytest.fixture(scope="module")
def drifting(tmp_path_factory):
    """The recorded tiny run, whose speed drifted beyond --kv-max-drift within its session, twice."""
    path = str(write_run(tmp_path_factory.mktemp("drift") / "run.json", recorded_run(resamples=200)))
    return [path, path]


def lines_of(text: str, status: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(status)]


@pytest.mark.parametrize("flag", ["--strict", "--kv-strict"])
def test_a_skipped_class_the_first_run_has_fails_under_strict_only(skipping, capsys, flag):
    assert main(["compare", *skipping]) == 0
    assert "No regressions against the baseline." in capsys.readouterr().out
    assert main(["compare", *skipping, flag]) == 1
    out = capsys.readouterr().out
    failed = lines_of(out, "not-measured (--strict): static in ")
    assert [line.split("(head.json): ")[1].split(":")[0] for line in failed] == ["counted passes", "timed passes"]
    assert "skipped (static runs on cuda only)" in failed[0]
    assert "No regressions, but 3 verdicts failed under --strict against the baseline." in out
    assert lines_of(out, "inconclusive (--strict): dynamic in ")  # the synthetic run's intercept has no interval


def test_strict_is_the_same_exit_in_markdown_and_lists_the_failures_on_stderr(skipping, capsys):
    assert main(["compare", *skipping, "--strict", "--markdown"]) == 1
    captured = capsys.readouterr()
    assert "**No regressions, but 3 verdicts failed under --strict against the baseline.**" in captured.out
    assert len(lines_of(captured.err, "not-measured (--strict)")) == 2


def test_require_classes_and_strict_both_fail_a_dropped_class(skipping, capsys):
    assert main(["compare", *skipping, "--require-classes"]) == 1  # a regression of its own, strict or not
    assert main(["compare", *skipping, "--require-classes", "--strict", "--rules", "first"]) == 1
    out = capsys.readouterr().out
    assert "1 regression and 3 verdicts failed under --strict against the baseline." in out


def test_a_drift_beyond_its_limit_fails_under_strict(drifting, capsys):
    assert main(["compare", *drifting]) == 0
    capsys.readouterr()
    assert main(["compare", *drifting, "--strict"]) == 1
    (line,) = lines_of(capsys.readouterr().out, "drift (--strict): every class in ")
    assert "beyond the allowed ±10% (--kv-max-drift)" in line


def test_the_suite_and_compare_fail_the_same_verdicts():
    """gate.failures (the suite) and compare's strict failures both ask gate.strict_failure."""
    inconclusive, exact = Verdict("inconclusive", "poor fit"), Verdict("inconclusive", "not a number")
    baselined = Verdict("not-measured", "skipped", allowed=3.05)
    assert gate.strict_failure("timed", inconclusive) and gate.strict_failure("counted", baselined)
    assert not gate.strict_failure("counted", exact)  # exact verdicts: --kv-strict leaves them alone
    assert not gate.strict_failure("timed", Verdict("not-measured", "no timed points"))
    verdicts = {"dynamic": {"timed": inconclusive, "counted": exact}}
    assert gate.failures(verdicts, strict=True) == ["kv-cache inconclusive: dynamic timed: poor fit"]
    assert gate.failures(verdicts) == []
