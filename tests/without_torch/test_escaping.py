"""Strings from a run reach Markdown and HTML only escaped: the one Markdown escape
(:func:`kvcache.analysing.tables.escape_markdown`), the one HTML escape
(:func:`kvcache.analysing.report.documents.html_text`), the page's JSON
(:func:`kvcache.analysing.report.page.script_json`) and the PNGs' text (mathtext off). The whole poisoned run, in a
browser, is in test_report_page.py."""

from __future__ import annotations

import json
import re

import pytest
from fakerun import make_run, write_run

from kvcache.analysing import report, tables
from kvcache.analysing.records import load_run
from kvcache.analysing.report.page import script_json
from kvcache.analysing.tables import Table, escape_markdown


@pytest.mark.parametrize("text, expected", [
    ("dynamic", "dynamic"),
    ("scaled_dot_product_attention", "scaled_dot_product_attention"),  # intraword _ is never emphasis
    ("<img src=x onerror=alert(1)>", "&lt;img src=x onerror=alert(1)&gt;"),
    ("- item", "\\- item"), ("1. item", "1\\. item"), ("3.00", "3.00"), ("-1.5", "-1.5"),  # a list only at a line start
    ("<!--<script>", "&lt;!--&lt;script&gt;"),
    ("&lt; &amp;", "&amp;lt; &amp;amp;"),
    ("| x |", "\\| x \\|"),
    ("`code` *em* _em_ ~del~", "\\`code\\` \\*em\\* \\_em\\_ \\~del\\~"),
    ("[link](javascript:alert(1)) ![i](x)", "\\[link\\](javascript:alert(1)) !\\[i\\](x)"),
    ("3.00 [2.85, 3.15]", "3.00 \\[2.85, 3.15\\]"),
    ("C:\\models\\x $\\frac$ #1", "C:\\\\models\\\\x \\$\\\\frac\\$ \\#1"),
    ("index_copy_()", "index_copy\\_()"),
    ("one\ntwo\r\n# three", "one two \\# three"),
    ("@octocat's cache", "@&#8203;octocat's cache"), ("org/@team x@y", "org/@&#8203;team x@&#8203;y"),  # no mention
])
def test_escape_markdown(text, expected):
    assert escape_markdown(text) == expected


def test_markdown_table_escapes_cells_and_group_labels_but_keeps_its_own_markup():
    table = Table(["cache", "passes"], [["<b>x</b>", "3.00"]], groups=[("", 1), ("5.24.0 *<i>*", 1)])
    assert tables.markdown(table) == [
        "| cache | **5.24.0 \\*&lt;i&gt;\\***<br>passes |",
        "| :--- | :--- |",
        "| &lt;b&gt;x&lt;/b&gt; | 3.00 |",
    ]


def test_script_json_escapes_what_could_end_or_comment_out_its_element():
    data = {"</script><!--<script>": "a & b > c \u2028\u2029", "n": [1.5, None]}
    text = script_json(data)
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == data


def render(tmp_path, run):
    return report.render([load_run(write_run(tmp_path / "run.json", run))], tmp_path / "out")


def test_version_with_a_comment_opener_leaves_the_page_script_intact(tmp_path):
    """A ``<!--<script>`` in a version string used to swallow report.js: the data element holds no ``<`` now and the
    page has exactly its two scripts, the data and report.js."""
    run = make_run(transformers="5.24.0<!--<script>")
    render(tmp_path, run)
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert m and "<" not in m.group(1)
    assert json.loads(m.group(1))["series"][0]["run"].endswith("5.24.0<!--<script> on cpu: test machine")
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert "<!--" not in page


def test_model_name_in_the_chart_title_is_escaped(tmp_path):
    """The chart's heading names the model: a model directory named like an element is text, in both files."""
    run = make_run()
    run["kv"]["model"]["name"] = "<img src=x onerror=alert(1)>"
    render(tmp_path, run)
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "<img" not in page
    assert "— &lt;img src=x onerror=alert(1)&gt;, bfloat16</h2>" in page
    md = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "<" not in md and "&lt;img src=x onerror=alert(1)&gt;" in md


def test_dollar_signs_in_names_are_drawn_not_typeset(tmp_path):
    """A ``$...$`` in a run's names (model, cache, op) is drawn literally: matplotlib used to parse it as mathtext and
    fail to write the PNGs."""
    run = make_run({"dyn$\\frac$": 3.0, "static": 1.0})
    run["kv"]["model"]["name"] = "m$\\frac$"
    run["kv"]["ledger"] = {"dyn$\\frac$": {"op$\\x$": {"timed": 1.0, "timed_ci": [0.9, 1.1], "ms": 1.0}}}
    written = render(tmp_path, run)
    assert sorted(p.name for p in written) == ["latency.png", "ledger.png", "report.html", "report.md", "traffic.png"]
    from kvcache.analysing.report.charts import latency_figure

    fig = latency_figure([load_run(tmp_path / "run.json")])
    assert "m$\\frac$" in fig.axes[0].get_title()
    assert all(not t.get_parse_math() for ax in fig.axes for t in [ax.title, *ax.get_legend().get_texts()])


def test_compare_markdown_of_poisoned_runs_has_no_raw_markup(tmp_path, capsys):
    """``kvcache compare --markdown`` (the job summary) of two runs whose strings are all injection attempts."""
    from test_report_page import PAYLOAD, poisoned_run

    from kvcache.cli import main

    paths = [str(write_run(tmp_path / f"{name}.json", poisoned_run())) for name in ("a", "b")]
    main(["compare", *paths, "--markdown"])
    out = capsys.readouterr().out
    assert escape_markdown(PAYLOAD + "dynamic") in out
    assert "<" not in out.replace("<br>", "") and ">" not in out.replace("<br>", "")


CONTROL = "dyn\x00amic\u202eevil\x1b[31m"  # NUL, the right-to-left override, ESC


@pytest.mark.parametrize("text, markdown, html", [
    ("a\x00b", "a\\\\x00b", "a\\x00b"),
    ("abc\u202edef", "abc\\\\u202edef", "abc\\u202edef"),  # would draw "def" backwards
    ("\u2066x\u2069 \u200f", "\\\\u2066x\\\\u2069 \\\\u200f", "\\u2066x\\u2069 \\u200f"),
    ("\x1b[31mred\x7f\x9b", "\\\\x1b\\[31mred\\\\x7f\\\\x9b", "\\x1b[31mred\\x7f\\x9b"),
    ("tab\there é ✓ 日本", "tab\there é ✓ 日本", "tab\there é ✓ 日本"),  # printable text is left alone
])
def test_control_and_bidi_characters_are_shown_as_their_code(text, markdown, html):
    """Issue 49 item 13: a NUL and U+202E in a class name reached comment.md and report.md/html raw."""
    from kvcache.analysing.report.documents import html_text

    assert escape_markdown(text) == markdown
    assert html_text(text) == html
    assert json.loads(script_json({text: [text]})) == {html: [html]}


def test_control_and_bidi_characters_in_class_names_reach_no_document_raw(tmp_path, capsys):
    """comment.md, report.md, report.html and compare --markdown of runs whose class is named with a NUL, U+202E and
    ESC: none of the three characters is in any of them; each shows as its code."""
    from kvcache.cli import main

    paths = [str(write_run(tmp_path / f"{name}.json", make_run({CONTROL: 3.0, "static": 1.0}, seed=seed)))
             for name, seed in (("base", 0), ("head", 1))]
    assert main(["comment", *paths, "--out", str(tmp_path / "comment.md")]) == 0
    main(["compare", *paths, "--markdown"])
    summary = capsys.readouterr().out
    assert main(["report", paths[1], "--out", str(tmp_path / "out")]) == 0
    for name, text in (("comment.md", (tmp_path / "comment.md").read_text(encoding="utf-8")),
                       ("compare --markdown", summary),
                       ("report.md", (tmp_path / "out" / "report.md").read_text(encoding="utf-8")),
                       ("report.html", (tmp_path / "out" / "report.html").read_text(encoding="utf-8"))):
        assert not set("\x00\u202e\x1b") & set(text), name
        assert "dyn\\x00amic\\u202eevil\\x1b" in text.replace("\\\\", "\\"), name
