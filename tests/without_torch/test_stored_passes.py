"""Counted passes per stored byte (``kv.traffic.<cache>.stored_passes``) beside passes per logical byte, in the summary,
``kvcache compare`` and the pull request's comment, wherever the class stores fewer (compression: a kvpress press
keeping half the context) or more bytes than the context's K/V; a class that stores exactly them shows none."""

from __future__ import annotations

from fakerun import make_run, write_run

from kvcache.analysing import summary
from kvcache.analysing.judge import measure_table
from kvcache.analysing.records import KV
from kvcache.cli import main


def run_with_press() -> dict:
    """dynamic stores the context's K/V (3.00 either way); knorm keeps half of it: 1.50 per logical byte, 3.00 per
    byte stored."""
    run = make_run(counted={"dynamic": 3.0, "knorm": 1.5}, caches={"dynamic": 3.0})
    traffic = run["kv"]["traffic"]
    traffic["dynamic"]["stored_passes"] = 3.0
    traffic["knorm"]["stored_passes"] = 3.0
    traffic["knorm"]["fill"] = "prefill"
    return run


def test_the_figure_is_read_only_where_it_differs_from_passes():
    kv = KV.from_json(run_with_press()["kv"])
    stored = measure_table.BY_NAME["stored"]
    assert measure_table.value_of(kv, stored, "knorm") == 3.0
    assert measure_table.value_of(kv, stored, "dynamic") is None
    assert kv.traffic["knorm"].fill == "prefill"


def test_the_summary_shows_it_beside_passes_per_logical_byte():
    kv = KV.from_json(run_with_press()["kv"])
    text = "\n".join(summary.lines(kv))
    assert "counted passes per stored byte" in text
    assert summary.figure_table(kv)[1] == [["knorm", "3.000"]]
    assert "counted knorm: 1.500 passes" in text
    assert "counted knorm: filled by prefill: the class needs a real prefill" in text


def test_compare_and_comment_show_it(tmp_path, capsys):
    base = str(write_run(tmp_path / "base.json", run_with_press()))
    head = run_with_press()
    head["kv"]["traffic"]["knorm"]["stored_passes"] = 3.5  # a press that now moves more per byte it keeps
    head_path = str(write_run(tmp_path / "head.json", head))
    assert main(["compare", base, head_path]) == 0  # not judged: shown, never a regression of its own
    out = capsys.readouterr().out
    assert "per stored byte" in out and "3.50" in out
    assert main(["comment", base, head_path]) == 0
    body = capsys.readouterr().out
    line = next(x for x in body.splitlines() if x.startswith("| knorm | counted passes per stored byte |"))
    assert "3.00" in line and "3.50" in line and "+0.50" in line
    assert not any(x.startswith("| dynamic | counted passes per stored byte |") for x in body.splitlines())
