"""The measure table (kvcache/analysing/judge/measure_table.py) is the one home of every figure: each output's list of
measures is derived from it, and a measure added as a row (with its record field) reaches every output."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
from fakerun import make_run, write_run

from kvcache.analysing import comment, compare_render, export, history, options, summary
from kvcache.analysing.judge import baseline, entries, measure_table
from kvcache.analysing.judge.measure_table import MEASURES, VERDICTS, Measure
from kvcache.analysing.records import Fit, LedgerRow, Memory, Traffic, identity, load_run
from kvcache.bisect import search
from kvcache.sentinel import figures as watched_figures

PACKAGE = Path(__file__).resolve().parents[2] / "kvcache"
RECORDS = {"traffic": Traffic, "fit": Fit, "memory": Memory, "ledger": LedgerRow}


def test_names_are_unique_and_spelled_one_way():
    names = [m.name for m in MEASURES] + [a for m in MEASURES for a in m.aliases]
    assert len(names) == len(set(names)), names
    assert len({v.name for v in VERDICTS}) == len(VERDICTS)


def test_every_row_points_at_a_real_field_option_group_and_verdict():
    verdicts = {v.name for v in VERDICTS}
    rules = {o.flag: o for o in options.OPTIONS if o.rule}
    baseline_fields = {*entries.FIGURES, *entries.OP_FIGURES, *entries.NESTED_OP_FIGURES}
    for m in MEASURES:
        if not m.path:  # a figure inside a map is read from the record's JSON
            assert m.field in {f.name for f in dataclasses.fields(RECORDS[m.section])}, m.name
        assert m.verdict is None or m.verdict in verdicts, m.name
        assert m.group is None or m.group in measure_table.GROUPS, m.name
        assert m.tolerance is None or m.tolerance in rules, m.name
        for name in (m.baseline, m.baseline_detail):
            assert name is None or name in baseline_fields, (m.name, name)
        if m.exact and m.history:
            assert m.resolution, m.name
        if m.history:
            assert m.title, m.name
    for v in VERDICTS:
        rows = measure_table.of_verdict(v.name)
        assert rows, v.name
        assert len({m.group for m in rows}) == 1, v.name  # a verdict is keyed one way
    assert set(measure_table.PRESENT) == set(measure_table.GROUPS)
    assert set(measure_table.PRESENT.values()) <= set(entries.FIGURES)


def test_every_list_of_measures_is_the_tables():
    assert identity.GROUPS is measure_table.GROUPS
    assert baseline.PRESENT is measure_table.PRESENT
    assert summary.SUMMARY_MEASURES == tuple(v.name for v in VERDICTS if v.summarised)
    assert list(history.trend_measures()) == [m.name for m in MEASURES if m.history]
    assert list(export.exported()) == [m.name for m in MEASURES if m.exported]
    assert compare_render.columns()[:-1] == [m.name for m in MEASURES if m.compared]
    assert comment.EXACT_REGRESSION_MEASURES == tuple(measure_table.VERDICT_LABELS[v]
                                                      for v in measure_table.EXACT_VERDICTS)
    bisected = {f.measure.name for f in search.bisect_measures().values()}
    assert bisected == {m.name for m in MEASURES if m.bisected}
    assert {"gpu:t4", "backend:flash", "passes", "weight"} <= set(search.bisect_measures())
    assert set(summary.SHOWN_APART) <= {m.name for m in MEASURES}


def test_no_module_keeps_a_list_of_measures_of_its_own():
    """The measure names appear as a tuple or dict of string literals only in the table: a list kept elsewhere
    would be one a new measure could miss."""
    names = {m.name for m in MEASURES} | {v.name for v in VERDICTS}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "measure_table.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                items = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            elif isinstance(node, ast.Dict):
                items = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            else:
                continue
            if len(set(items) & names) >= 4:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    # the gate's judge of each verdict (gate.judge_run, below), summary's SHOWN_APART (its tables' own columns)
    assert sorted(f.split(":")[0] for f in found) == ["analysing/judge/gate.py", "analysing/summary.py"], found


def test_the_gate_judges_every_verdict_of_the_table_in_its_order():
    from fakerun import analysed

    doc = analysed(make_run())
    for verdicts in doc["kv"]["verdict"].values():
        names = list(verdicts)
        assert names == [v.name for v in VERDICTS if v.name in names]
        assert {"counted", "timed", "intercept", "overhead", "ledger"} <= set(names)


THROWAWAY = Measure("data_ops", "data ops per step", "ops", "traffic", "data_ops_per_step", group="overhead",
                    title="ATen ops that move data, per step", header="data ops", resolution=0.5, compared=True,
                    exported=True, history=True, bisected=True, watched=True)


def test_a_new_measure_is_a_row_and_its_record_field(tmp_path, monkeypatch, capsys):
    """A measure added as one row reaches the summary, compare, history, export, bisect and the sentinel."""
    from kvcache.cli import main

    monkeypatch.setattr(measure_table, "MEASURES", (*MEASURES, THROWAWAY))
    monkeypatch.setattr(measure_table, "BY_NAME", {**measure_table.BY_NAME, THROWAWAY.name: THROWAWAY})
    doc = make_run()
    for traffic in doc["kv"]["traffic"].values():
        traffic["data_ops_per_step"] = 321
    run_path = write_run(tmp_path / "run.json", doc)
    run = load_run(run_path)
    kv = run.record

    assert any("data ops per step" in line for line in summary.lines(kv))
    assert any("321" in row for row in summary.figure_table(kv)[1][0])

    assert main(["compare", str(run_path), str(run_path)]) == 0
    assert "data ops" in capsys.readouterr().out

    assert history.figures_of(run)["dynamic"]["data_ops"] == 321
    assert "data_ops.png" in history.plot_files()

    entries_out = export.github_action_benchmark(run)
    assert {"name": "dynamic: data ops per step", "unit": "ops", "value": 321} in \
        [{k: e[k] for k in ("name", "unit", "value")} for e in entries_out]

    followed = search.bisect_measures()["data_ops"]
    assert search.figure_of(kv, followed, "dynamic").value == 321.0
    assert "traffic.dynamic.data_ops_per_step" in watched_figures.figures(kv)
    json.dumps([e for e in entries_out])  # plain JSON still


@pytest.mark.parametrize("name", ["counted", "passes", "gpu:t4", "backend:cudnn", "weight"])
def test_old_and_new_names_resolve(name):
    measure, key = measure_table.named(name)
    assert measure.bisected and (key is None) == (":" not in name)
