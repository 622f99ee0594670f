"""Timed passes per generated token (issue 46): a speculative key's timed points say how many tokens a step gained
(``kv.points[].tokens_per_step``); its fit per step over those tokens is ``kv.fit.<cache>.passes_per_token`` with its
interval, where every point gained the same, and no figure (the reason instead) where they differ. Made-up step times
(tests/fakerun.py): nothing here is timed."""

from __future__ import annotations

import copy

import pytest
from fakerun import BYTES_PER_TOKEN, WEIGHT_BYTES, analysed, make_run, write_run

from kvcache.analysing import compare_render, export, summary
from kvcache.analysing.fit import fit_passes
from kvcache.analysing.judge import measure_table
from kvcache.analysing.records import KV, Fit, Point, json_schema, load_run, points_from_benchmarks

CONTEXTS = (512, 1024, 2048, 4096)
PER_TOKEN = measure_table.BY_NAME["timed_per_token"]


def speculative_run(tokens: dict[int, float] | float | None) -> dict:
    """A made-up run of one class whose timed points gained ``tokens`` per step (per context, or the same at all)."""
    run = make_run({"dynamic": 3.0}, contexts=CONTEXTS, rounds=2, steps=8)
    for bench in run["benchmarks"]:
        info = bench["extra_info"]
        if info.get("kind") == "timed" and tokens is not None:
            info["tokens_per_step"] = tokens if isinstance(tokens, float) else tokens[info["context"]]
    return run


def fitted(tokens: dict[int, float] | float | None) -> Fit:
    points = points_from_benchmarks(speculative_run(None)["benchmarks"])
    for p in points:
        p.tokens_per_step = tokens if not isinstance(tokens, dict) else tokens[p.context]
    return fit_passes(points, [20.0] * 5, bytes_per_token=BYTES_PER_TOKEN, weight_bytes=WEIGHT_BYTES)


def test_points_that_gained_the_same_tokens_give_the_fit_per_token_and_its_interval():
    fit = fitted(5.0)
    assert fit.tokens_per_step == 5.0
    assert fit.passes_per_token == pytest.approx(fit.passes / 5)
    assert fit.passes_per_token_ci == pytest.approx([bound / 5 for bound in fit.passes_ci])
    assert fit.per_token_problem is None
    written = fit.to_json()
    assert {"tokens_per_step", "passes_per_token", "passes_per_token_ci"} <= set(written)
    assert "per_token_problem" not in written
    assert Fit.from_json(written).to_json() == written


def test_points_that_gained_different_tokens_give_no_figure_and_say_why():
    fit = fitted({512: 5.0, 1024: 5.0, 2048: 4.5, 4096: 5.0})
    assert fit.passes is not None  # the fit per step stands
    assert (fit.tokens_per_step, fit.passes_per_token, fit.passes_per_token_ci) == (None, None, None)
    assert "tokens per step differ between points: 5 at 512 (round 0), 4.5 at 2048 (round 0)" in fit.per_token_problem
    written = fit.to_json()
    assert "passes_per_token" not in written and "tokens_per_step" not in written
    assert Fit.from_json(written).to_json() == written


def test_one_token_a_step_writes_no_per_token_field():
    written = fitted(None).to_json()
    assert not {"tokens_per_step", "passes_per_token", "passes_per_token_ci", "per_token_problem"} & set(written)


def test_a_point_round_trips_its_tokens_per_step_and_leaves_it_out_when_none():
    point = Point.of(cache="dynamic#prompt-lookup:4", context=512, kv_bytes=1e6, samples_s=[0.01, 0.02],
                     tokens_per_step=5.0)
    written = point.to_json()
    assert written["tokens_per_step"] == 5.0
    assert Point.from_json(written).to_json() == written
    assert "tokens_per_step" not in Point.of(cache="dynamic", context=512, kv_bytes=1e6, samples_s=[0.01]).to_json()
    assert "tokens_per_step" not in Point(cache="dynamic", context=512, kv_bytes=1e6, samples_s=[0.01]).to_json()


def test_the_analysis_carries_it_to_the_file_the_schema_and_every_output(tmp_path, capsys):
    """Through the session-end analysis: the points keep their tokens, the fit has its figure per token; the schema
    validates the run; the summary's figures table, compare and export show it."""
    from kvcache.cli import main

    run = analysed(speculative_run(3.0))
    kv = run["kv"]
    assert {p.get("tokens_per_step") for p in kv["points"]} == {3.0}
    fit = kv["fit"]["dynamic"]
    assert fit["tokens_per_step"] == 3.0 and fit["passes_per_token"] == pytest.approx(fit["passes"] / 3)
    assert KV.from_json(copy.deepcopy(kv)).to_json() == kv
    jsonschema = pytest.importorskip("jsonschema")
    assert [e.message for e in jsonschema.Draft202012Validator(json_schema()).iter_errors(run)] == []

    record = KV.from_json(kv)
    assert measure_table.value_of(record, PER_TOKEN, "dynamic") == pytest.approx(fit["passes"] / 3)
    header, rows = summary.figure_table(record)
    assert PER_TOKEN.label in header
    assert rows[0][header.index(PER_TOKEN.label)] == f"{fit['passes_per_token']:.3f}"

    path = write_run(tmp_path / "run.json", run)
    assert main(["compare", str(path), str(path)]) == 0
    assert compare_render.column_header(PER_TOKEN.name) in capsys.readouterr().out
    entries = export.github_action_benchmark(load_run(path))
    assert "dynamic: timed passes per generated token" in [e["name"] for e in entries]


def test_a_greedy_run_shows_no_per_token_column_and_a_mixed_one_says_why():
    greedy = KV.from_json(analysed(speculative_run(None))["kv"])
    assert PER_TOKEN.label not in summary.figure_table(greedy)[0]
    assert all("tokens per step" not in line for line in summary.lines(greedy))
    mixed = KV.from_json(analysed(speculative_run({512: 3.0, 1024: 3.0, 2048: 2.0, 4096: 3.0}))["kv"])
    assert PER_TOKEN.label not in summary.figure_table(mixed)[0]
    said = [line for line in summary.lines(mixed) if "tokens per step differ between points" in line]
    assert said and said[0].startswith("timed dynamic: "), said
