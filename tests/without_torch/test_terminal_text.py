"""Strings from a run reach a terminal and a PNG shown, never obeyed: ESC, a carriage return, a line break and every
other control (or bidirectional formatting) character in a class name, a model name, a reason or an error read from a
hostile file is printed as its code, as ``repr`` shows it (``\\x1b``, ``\\r``, ``\\n``), by the one terminal escape
(:func:`kvcache.analysing.tables.terminal_text`): the terminal summary, ``kvcache compare``'s text, every command's
one-line error and the PNGs' labels. Markdown and HTML: test_escaping.py."""

from __future__ import annotations

import json

import pytest
from fakerun import make_run, write_run

from kvcache.analysing import summary, tables
from kvcache.analysing.records import load_run
from kvcache.cli import main

#: ESC sequences that clear the screen and turn red, a carriage return that would overwrite the line, a line break that
#: would start a line of its own, NUL and the right-to-left override.
HOSTILE = "dyn\x1b[2J\x1b[31mamic\rFAKE\nregression: none\x00\u202e"
SHOWN = "dyn\\x1b[2J\\x1b[31mamic\\rFAKE\\nregression: none\\x00\\u202e"
RAW = set("\x1b\r\x00\u202e")


def raw_controls(text: str) -> set[str]:
    """The control characters in ``text`` besides its own line breaks (and none of the escapes' backslashes)."""
    return {ch for ch in text if ch != "\n" and tables.terminal_text(ch) != ch}


@pytest.mark.parametrize("text, shown", [
    (HOSTILE, SHOWN),
    ("tab\there", "tab\\there"),
    ("\x7f\x9b\u2066", "\\x7f\\x9b\\u2066"),
    ("é ✓ 日本 $\\frac$ <b>", "é ✓ 日本 $\\frac$ <b>"),  # printable text is left alone
])
def test_terminal_text_shows_every_control_character_as_repr_does(text, shown):
    assert tables.terminal_text(text) == shown
    assert tables.terminal_text(shown) == shown  # shown twice is shown once


def test_chart_text_keeps_the_line_breaks_only():
    """A chart's label may have a second line of its own; everything else is shown as in a terminal."""
    assert tables.chart_text("a\x1b[31m\rb\nc\td") == "a\\x1b[31m\\rb\nc\\td"


def hostile_runs(tmp_path):
    """Two runs whose class and model are named with HOSTILE (the second with another seed)."""
    paths = []
    for name, seed in (("base", 0), ("head", 1)):
        run = make_run({HOSTILE: 3.0, "static": 1.0}, seed=seed)
        run["kv"]["model"]["name"] = HOSTILE
        run["kv"]["skipped"] = [{"cache": "static", "context": 8192, "reason": HOSTILE}]
        paths.append(str(write_run(tmp_path / f"{name}.json", run)))
    return paths


def test_compare_text_of_hostile_runs_shows_the_codes(tmp_path, capsys):
    paths = hostile_runs(tmp_path)
    assert main(["compare", *paths]) in (0, 1)
    out = capsys.readouterr().out
    assert not raw_controls(out), sorted(raw_controls(out))
    assert SHOWN in out
    assert not any(line.startswith("regression: none") for line in out.splitlines())  # no forged line


def test_a_hostile_error_line_is_one_line_shown(tmp_path, capsys):
    """A file whose settings cannot judge: the one-line error quotes the bad value; a hostile one stays one line."""
    path = tmp_path / "bad.json"
    run = make_run()
    run["kv"]["settings"]["min_r2"] = HOSTILE
    path.write_text(json.dumps(run))
    assert main(["compare", str(path), str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not raw_controls(err), err


def test_report_of_hostile_runs_prints_nothing_raw_and_draws_the_codes(tmp_path, capsys):
    paths = hostile_runs(tmp_path)
    assert main(["report", paths[1], "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert not raw_controls(captured.out + captured.err)
    from kvcache.analysing.report.charts import _plain_text, latency_figure, traffic_figure

    @_plain_text
    def drawn(figure):
        fig = figure([load_run(paths[1])])
        fig.canvas.draw()  # tick labels are set when drawn
        return [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "set_text"))]

    for figure in (latency_figure, traffic_figure):
        texts = drawn(figure)
        assert any(tables.chart_text(HOSTILE) in t for t in texts), (figure.__name__, texts)  # its \n: a line
        assert not any(raw_controls(t) for t in texts), figure.__name__


def test_the_terminal_summary_of_a_hostile_run_shows_the_codes(tmp_path):
    kv = load_run(hostile_runs(tmp_path)[0]).record
    lines = summary.lines(kv)
    assert all(not raw_controls(line) and "\n" not in line for line in lines)
    assert any(SHOWN in line for line in lines)
    assert any(f"skipped static at 8192: {SHOWN}" == line for line in lines)
