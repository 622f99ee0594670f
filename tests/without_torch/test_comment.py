"""``kvcache comment``: the pull request's body, judged by compare's judge and tabled by the one renderer, on runs
made with tests/fakerun.py (the recorded real run, or synthetic runs). The real-suite case is
tests/suite/test_pr_gate.py."""

from __future__ import annotations

import json
import re

import pytest
from fakerun import make_run, recorded_run, write_run

from kvcache.analysing import comment
from kvcache.analysing.records import load_run
from kvcache.analysing.tables import MISSING
from kvcache.cli import main


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, str]:
    """The recorded run as BASE; HEAD the same with a planted +2-pass copy in dynamic (the op ``clone``)."""
    tmp = tmp_path_factory.mktemp("comment")
    return {"base": str(write_run(tmp / "base.json", recorded_run(resamples=200))),
            "planted": str(write_run(tmp / "head.json", recorded_run(counted={"dynamic": 5.0}, resamples=200)))}


def body_of(capsys, *argv: str) -> str:
    assert main(["comment", *argv]) == 0
    return capsys.readouterr().out


def row(body: str, cache: str, measure: str) -> list[str]:
    line = next(x for x in body.splitlines() if x.startswith(f"| {cache} | {measure} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_a_regression_exits_0_and_names_class_values_delta_and_op(recorded, capsys):
    body = body_of(capsys, recorded["base"], recorded["planted"])
    assert body.splitlines()[0] == "### ▲ KV-cache passes: regression: dynamic"
    assert row(body, "dynamic", "counted passes")[2:] == ["3.00", "5.00", "+2.00", "▲ regression"]
    assert row(body, "static", "counted passes")[5] == ""
    assert "- **dynamic**: passes grew: clone +2.00" in body
    assert "grew: clone +2.00" in body.split("#### Regressions")[1]
    assert body.rstrip().endswith(comment.COMMENT_MARKER) and body.count(comment.COMMENT_MARKER) == 1


def test_identical_counts_are_clean_and_timed_figures_of_separate_runs_informational(recorded, capsys):
    body = body_of(capsys, recorded["base"], recorded["base"])
    assert body.splitlines()[0] == "### ✓ KV-cache passes: no regression"
    assert "#### Timed figures (informational)" in body and "#### Regressions" not in body
    assert row(body, "dynamic", "timed passes")[4] == "+0.00"


def test_a_timed_regression_of_two_separate_runs_is_not_the_verdict(tmp_path, capsys):
    """Timed passes doubled, counted the same: compare's judge calls it a timed regression, the comment does not
    (separate runs drift apart); it shows the figures as informational."""
    base = write_run(tmp_path / "base.json", make_run({"dynamic": 3.0}, {"dynamic": 3.0}))
    head = write_run(tmp_path / "head.json", make_run({"dynamic": 6.0}, {"dynamic": 3.0}, seed=1))
    assert main(["compare", str(base), str(head)]) == 1  # the timed judge, as compare applies it
    capsys.readouterr()
    body = body_of(capsys, str(base), str(head))
    assert body.startswith("### ✓ KV-cache passes: no regression\n"), body
    timed = row(body.split("#### Timed figures (informational)")[1], "dynamic", "timed passes")
    assert timed[2].startswith("3.00") and timed[3].startswith("6.00") and timed[4] == "+3.00"


def test_an_ab_section_judges_timed_figures(tmp_path, capsys):
    base = write_run(tmp_path / "base.json", make_run({"dynamic": 3.0}))
    doc = make_run({"dynamic": 3.0})
    doc["ab"] = {"dynamic": {"timed": {"status": "regression", "value": 1.62, "allowed": 1.1, "ratio": 1.62,
                                       "ratio_ci": [1.55, 1.70], "reason": "B/A 1.62 is above 1.10"},
                             "intercept": {"status": "inconclusive", "value": 1.05, "allowed": 1.1, "ratio": 1.05,
                                           "ratio_ci": [0.9, 1.2], "reason": "interval straddles 1.10"}}}
    head = write_run(tmp_path / "head.json", doc)
    body = body_of(capsys, str(base), str(head))
    assert body.splitlines()[0] == "### ▲ KV-cache passes: regression: dynamic"
    # cells are escaped by the table renderer: [ shows as \[
    assert row(body, "dynamic", "timed passes (A/B)")[4:] == ["×1.620 \\[1.550–1.700\\]", "▲ regression"]
    assert "- **dynamic** intercept (A/B): interval straddles 1.10" in body
    assert "informational" not in body
    ab = tmp_path / "ab.json"
    ab.write_text(json.dumps({**make_run({"dynamic": 3.0}), "ab": {"dynamic": {"timed": {"status": "pass",
                                                                                   "ratio": 1.0}}}}))
    assert body_of(capsys, str(base), str(base), "--ab", str(ab)).startswith("### ✓")


def test_every_run_string_is_escaped(tmp_path, capsys):
    name = "<img src=x onerror=alert(1)>*x*|[y](z)"
    base = write_run(tmp_path / "base.json", make_run({name: 3.0}))
    head = write_run(tmp_path / "head.json", make_run({name: 3.0}, {name: 5.0}, seed=1))
    body = body_of(capsys, str(base), str(head))
    assert "<img" not in body and "&lt;img" in body
    assert "*x*" not in body and "[y](z)" not in body
    assert body.splitlines()[0] == f"### ▲ KV-cache passes: regression: {comment.md(name)}"
    rows = [x for x in body.splitlines() if x.startswith(f"| {comment.md(name)} |")]
    assert rows and all(len(re.findall(r"(?<!\\)\|", x)) in (6, 7) for x in rows), rows  # | stays in its cell


def test_a_long_body_is_cut_under_the_limit_with_a_note_and_the_marker(tmp_path, capsys):
    caches = {f"class-{i:03d}": 3.0 for i in range(60)}
    base = write_run(tmp_path / "base.json", make_run(caches, contexts=(512, 1024, 2048)))
    head = write_run(tmp_path / "head.json", make_run(caches, {**caches, "class-000": 5.0}, contexts=(512, 1024, 2048)))
    full = body_of(capsys, str(base), str(head))
    assert len(full) > 3000
    cut = body_of(capsys, str(base), str(head), "--max-chars", "3000")
    assert len(cut) <= 3000 and cut.splitlines()[0] == full.splitlines()[0]
    assert "_Truncated: this comment was longer than GitHub allows (3,000 characters)" in cut
    assert cut.rstrip().endswith(comment.COMMENT_MARKER)
    v, body = comment.build(load_run(base), load_run(head))
    assert len(body) <= comment.GITHUB_LIMIT and v == comment.REGRESSION


def test_report_url_labels_and_out(recorded, tmp_path, capsys):
    out = tmp_path / "comment.md"
    assert main(["comment", recorded["base"], recorded["planted"], "--out", str(out), "--report-url",
                 "https://github.com/o/r/actions/runs/9 (x)", "--base-label", "merge base abc", "--head-label",
                 "head <def>"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "regression" in captured.err
    body = out.read_text()
    assert "[job summary](https://github.com/o/r/actions/runs/9%20%28x%29)" in body
    assert "**BASE**: merge base abc: " in body and "**HEAD**: head &lt;def&gt;: " in body


@pytest.mark.parametrize("args, message", [
    (["missing.json", "missing.json"], "missing.json: cannot read"),
    (["{base}", "{base}", "--report-url", "javascript:alert(1)"], "is not an http(s) URL"),
    (["{base}", "{base}", "--max-chars", "10"], "--max-chars 10 is too small"),
    (["{base}", "{base}", "--ab", "{base}"], "no 'ab' section"),
    (["{base}", "{other}"], "refusing to compare runs that differ in device_name"),
])
def test_bad_input_is_one_line_exit_2(recorded, tmp_path, capsys, args, message):
    other = write_run(tmp_path / "other.json", make_run({"dynamic": 3.0}, device_name="cpu: another"))
    base = write_run(tmp_path / "base.json", make_run({"dynamic": 3.0}))
    argv = [a.format(base=base, other=other) for a in args]
    assert main(["comment", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and err.startswith("kvcache comment: "), err


MEMORY = {"allocated_passes": 1.0, "peak_passes": 0.0167, "held_passes": 1.0, "peak_factor": 1.0167,
          "allocated_by_op": {"cat": 1.0}, "peak_by_op": {"cat": 0.0167}, "contexts": [256, 512]}


def with_memory(held: float, **kwargs) -> dict:
    run = make_run({"dynamic": 3.0}, **kwargs)
    run["kv"]["memory"] = {"dynamic": {**MEMORY, "held_passes": held}}
    return run


def test_a_memory_regression_is_the_verdict_and_its_rows_show_passes(tmp_path, capsys):
    """Counted memory is judged exactly by the gate: a class that leaves 1.5 more passes held is a regression,
    and the memory rows show passes (bytes per KV-cache byte) to two decimals: 2.50, not 2."""
    base = write_run(tmp_path / "base.json", with_memory(1.0))
    head = write_run(tmp_path / "head.json", with_memory(2.5, seed=1))
    assert main(["compare", str(base), str(head), "--rules", "first"]) == 1  # the gate's judge calls it one
    capsys.readouterr()
    body = body_of(capsys, str(base), str(head))
    assert body.splitlines()[0] == "### ▲ KV-cache passes: regression: dynamic", body
    assert row(body, "dynamic", "memory: held passes")[2:] == ["1.00", "2.50", "+1.50", "▲ regression"]
    assert row(body, "dynamic", "memory: allocated passes")[2:] == ["1.00", "1.00", "+0.00", ""]
    assert row(body, "dynamic", "memory: peak passes")[2:4] == ["0.02", "0.02"]
    assert "- **dynamic** counted memory: held passes 2.5" in body, body
    assert row(body, "dynamic", "counted passes")[5] == ""


def dropped(tmp_path, how: str) -> tuple[str, str]:
    """BASE with dynamic and static counted; HEAD without dynamic's counted passes: skipped by the head's conftest
    (``skipped``, with its reason), or run with no counted figure (``uncounted``)."""
    base = write_run(tmp_path / "base.json", make_run({"dynamic": 3.0, "static": 1.0}))
    if how == "skipped":
        doc = make_run({"static": 1.0}, seed=1)
        doc["kv"]["skipped"] = [{"cache": "dynamic", "context": None, "reason": "conftest: not on this runner"}]
    else:
        doc = make_run({"dynamic": 3.0, "static": 1.0}, seed=1)
        del doc["kv"]["traffic"]["dynamic"]
    return str(base), str(write_run(tmp_path / "head.json", doc))


@pytest.mark.parametrize("how", ["skipped", "uncounted"])
def test_a_class_dropped_by_head_is_a_regression(tmp_path, capsys, how):
    base, head = dropped(tmp_path, how)
    assert main(["compare", base, head, "--rules", "first"]) == 0  # without the requirement: nothing to judge
    assert main(["compare", base, head, "--rules", "first", "--require-classes"]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("regression: dynamic in "))
    assert "counted passes: the class is required (it has 3.00 counted passes in the first run)" in line, line
    assert ("skipped: conftest: not on this runner" if how == "skipped" else "no counted passes: ") in line, line
    body = body_of(capsys, base, head)
    assert body.splitlines()[0] == "### ▲ KV-cache passes: regression: dynamic", body
    cells = row(body, "dynamic", "counted passes")
    assert cells[2:5] == ["3.00", MISSING, MISSING], cells
    assert cells[5].startswith("▲ regression: "), cells
    if how == "skipped":
        assert cells[5] == "▲ regression: not in HEAD: conftest: not on this runner"
    assert "#### Regressions" in body and "the class is required" in body
    assert row(body, "static", "counted passes")[5] == ""


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "x"])
def test_compare_and_comment_agree_on_counted_passes_that_are_not_a_number(tmp_path, capsys, value):
    """Issue 49 item 8: plain compare passed a HEAD whose counted passes were inf or NaN (exit 0, shown "—"), the
    comment called the same a regression (through the required class). Both fail it, once."""
    base = write_run(tmp_path / "base.json", make_run({"dynamic": 3.0, "static": 1.0}))
    doc = make_run({"dynamic": 3.0, "static": 1.0}, seed=1)
    doc["kv"]["traffic"]["dynamic"]["passes"] = value
    head = write_run(tmp_path / "head.json", doc)
    for extra in ([], ["--rules", "first", "--require-classes"]):
        assert main(["compare", str(base), str(head), *extra]) == 1, extra
        lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("regression:")]
        assert len(lines) == 1 and "dynamic" in lines[0] and "not a finite number" in lines[0], lines
    body = body_of(capsys, str(base), str(head))
    assert body.splitlines()[0] == "### ▲ KV-cache passes: regression: dynamic", body
    assert body.split("#### Regressions")[1].count("- **dynamic**") == 1, body
