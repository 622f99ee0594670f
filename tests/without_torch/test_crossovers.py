"""``kv.crossovers``: the contexts at which the cache holds as many bytes as the weights, and at which a step's
cache traffic (timed and counted passes) equals one read of the weights; one rule
(:func:`kvcache.analysing.bandwidth.crossover_context`), shown in the terminal summary. Numbers of the default model
(SmolLM2-135M geometry, bf16): 269,030,016 B of weights, 23,040 B of KV cache per token."""

from __future__ import annotations

import pytest
from fakerun import BYTES_PER_TOKEN, WEIGHT_BYTES, analysed, make_run

from kvcache.analysing import summary
from kvcache.analysing.bandwidth import crossover_context
from kvcache.analysing.records import KV


def test_the_default_models_crossovers():
    assert round(crossover_context(WEIGHT_BYTES, BYTES_PER_TOKEN)) == 11_677  # the cache holds the weights' bytes
    assert round(crossover_context(WEIGHT_BYTES, BYTES_PER_TOKEN, 3.0)) == 3_892  # DynamicCache's 3.00 counted


@pytest.mark.parametrize("passes", [None, 0, -1.0, float("nan"), float("inf")])
def test_no_crossover_without_a_positive_finite_figure(passes):
    assert crossover_context(WEIGHT_BYTES, BYTES_PER_TOKEN, passes) is None
    assert crossover_context(None, BYTES_PER_TOKEN) is None


def crossovers_of(run: dict) -> dict:
    return analysed(run)["kv"]["crossovers"]


def test_the_analysis_records_all_three_crossovers():
    kv = analysed(make_run({"dynamic": 3.0, "static": 1.0}, noise=0.0))["kv"]
    crossovers = kv["crossovers"]
    assert set(crossovers) == {"cache_holds_weights_tokens", "dynamic", "static"}
    assert round(crossovers["cache_holds_weights_tokens"]) == 11_677
    assert set(crossovers["dynamic"]) == {"timed_tokens", "counted_tokens"}
    assert round(crossovers["dynamic"]["counted_tokens"]) == 3_892
    assert round(crossovers["static"]["counted_tokens"]) == 11_677
    # the timed crossover is the fit's, by the same rule: 3 timed passes here too
    assert crossovers["dynamic"]["timed_tokens"] == pytest.approx(kv["fit"]["dynamic"]["crossover_tokens"])
    assert crossovers["dynamic"]["timed_tokens"] == pytest.approx(3_892, rel=0.01)


def test_a_class_without_a_timed_figure_keeps_its_counted_crossover():
    crossovers = crossovers_of(make_run({"dynamic": -3.0}, counted={"dynamic": 3.0}))
    assert crossovers["dynamic"]["timed_tokens"] is None
    assert round(crossovers["dynamic"]["counted_tokens"]) == 3_892


def test_a_counted_only_class_has_no_timed_crossover():
    run = make_run({"dynamic": 3.0}, counted={"dynamic": 3.0, "static": 1.0})
    assert crossovers_of(run)["static"] == {"timed_tokens": None, "counted_tokens": pytest.approx(11_676.65, abs=0.01)}


def test_the_summary_shows_the_crossovers():
    lines = summary.lines(KV.from_json(analysed(make_run({"dynamic": 3.0, "static": 1.0}, noise=0.0))["kv"]))
    traffic = "a step's cache traffic equals one read of the weights at"
    assert [line for line in lines if line.startswith("crossover")] == [
        "crossover: the cache holds as many bytes as the weights at 11,677 tokens",
        f"crossover dynamic: {traffic} 3,892 tokens timed, 3,892 counted",
        f"crossover static: {traffic} 11,677 tokens timed, 11,677 counted",
    ]


def test_the_summary_shows_a_dash_where_there_is_no_timed_crossover():
    lines = summary.lines(KV.from_json(analysed(make_run({"dynamic": -3.0}, counted={"dynamic": 3.0}))["kv"]))
    assert "crossover dynamic: a step's cache traffic equals one read of the weights at — tokens timed, 3,892 counted" \
        in lines
