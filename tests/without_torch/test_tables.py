"""kvcache.analysing.tables: the one table renderer of the terminal summary and ``kvcache compare`` (text
and Markdown), and the cells it is given."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from kvcache.analysing import tables
from kvcache.analysing.tables import Table

ANALYSING = Path(__file__).resolve().parents[2] / "kvcache" / "analysing"


@pytest.mark.parametrize("value", [None, math.nan, math.inf, True, "1.5"])
def test_num_shows_missing_for_what_is_not_a_finite_number(value):
    assert tables.num(value) == tables.MISSING == "—"
    assert tables.num(value, missing="n/a") == "n/a"


def test_num_formats_with_the_spec():
    assert tables.num(3) == "3.00"
    assert tables.num(11676.65, ",.0f") == "11,677"
    assert tables.num(0.98765, ".3f") == "0.988"


def test_a_figure_with_its_interval():
    assert tables.figure(3, [2.85, 3.15]) == "3.00 [2.85, 3.15]"
    assert tables.figure(3, [None, 3.15]) == tables.figure(3, None) == tables.figure(3, []) == "3.00"
    assert tables.figure(None, [1, 2]) == tables.figure(math.nan) == tables.MISSING
    assert tables.interval_text([0.5, 1], ".3f") == "[0.500, 1.000]"
    assert tables.interval_text([math.inf, 1]) == tables.interval_text(None) == ""


def test_by_op_keeps_the_given_order():
    by_op = {"cat": 2, "scaled_dot_product_attention": 1.0}
    assert tables.by_op(by_op) == "cat 2.00, scaled_dot_product_attention 1.00"
    assert tables.by_op({"copy_": 0.25, "x": None}, ".3f") == f"copy_ 0.250, x {tables.MISSING}"
    assert tables.by_op({}) == tables.MISSING


def test_notes_number_each_distinct_reason_once():
    notes = tables.Notes()
    cells = [notes.cell("no-baseline", "no baseline for 'x'"), notes.cell("pass", "within 3.05"),
             notes.cell("no-baseline", "no baseline for 'x'"), notes.cell("pass")]
    assert cells == ["no-baseline [1]", "pass [2]", "no-baseline [1]", "pass"]
    assert notes.lines() == ["[1] no baseline for 'x'", "[2] within 3.05"]
    assert notes.texts == ["no baseline for 'x'", "within 3.05"]


def test_unique_labels_name_the_file_only_where_labels_repeat():
    labels = tables.unique_labels(["a", "b", "a"], ["/x/one.json", "/y/two.json", "three.json"])
    assert labels == ["a (one.json)", "b", "a (three.json)"]


def test_text_aligns_columns_under_a_rule_without_trailing_spaces():
    lines = tables.text(Table(["cache", "passes"], [["dynamic", "3.00"], ["static", "-"]]))
    assert lines == ["cache    passes", "-------  ------", "dynamic  3.00", "static   -"]


def test_text_with_groups_labels_each_group_and_widens_for_a_long_label():
    table = Table(["cache", "a", "b", "a", "b"], [["dyn", "1", "2", "3", "4"]],
                  groups=[("", 1), ("first run", 2), ("x", 2)])
    assert tables.text(table) == [
        "      | first run | x",
        "cache | a  b      | a  b",
        "------+-----------+-----",
        "dyn   | 1  2      | 3  4",
    ]


def test_markdown_escapes_bars_aligns_right_and_names_groups_in_bold():
    table = Table(["cache", "passes", "verdict"], [["a|b", "3.00", "pass"]], groups=[("", 1), ("5.24.0", 2)],
                  right=[1])
    assert tables.markdown(table) == [
        "| cache | **5.24.0**<br>passes | **5.24.0**<br>verdict |",
        "| :--- | ---: | :--- |",
        "| a\\|b | 3.00 | pass |",
    ]


@pytest.mark.parametrize("module", ["summary.py", "compare.py", "compare_render.py", "comment.py",
                                    "report/sections.py"])
def test_summary_and_compare_have_no_renderer_or_number_format_of_their_own(module):
    """One home: the terminal summary and compare lay out and format through tables, nothing of their own."""
    tree = ast.parse((ANALYSING / module).read_text())
    own = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert not own & {"_num", "_fmt", "_md", "_flat", "_number"}
    assert not any(isinstance(node, ast.Attribute) and node.attr == "ljust" for node in ast.walk(tree))


def test_one_missing_mark():
    """tables.MISSING is the one mark of a missing figure: no other module of the package names one of its own."""
    root = ANALYSING.parent
    own = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                    node.value.value in ("—", "-", "–", "n/a") and path.name != "tables.py":
                own += [f"{path.relative_to(root)}: {ast.unparse(node)}"]
    assert own == []
