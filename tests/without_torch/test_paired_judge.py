"""The A/B judge (kvcache.analysing.judge.paired) on synthetic paired data: regression, improvement, pass and
inconclusive, shared drift against drift that differs between the sides, the ledger per op, and an A/B file read back by
compare's
loader as its two sides. No torch."""

from __future__ import annotations

import json

import numpy as np

from kvcache.analysing.judge import paired as ab
from kvcache.analysing.records import KV, SCHEMA, Verdict
from kvcache.analysing.records.ab_document import PAIRED_STATUSES, ab_section_json, ab_statuses, read_ab_section

CONTEXTS = (1024, 4096, 16384)
BYTES_PER_TOKEN = 1000.0


def side(slope_s_per_byte: float, intercept_s: float, *, seed: int, rounds: int = 3, drift: float = 0.0,
         round_speed: tuple[float, ...] = (), noise: float = 0.01, ledger: dict[str, float] | None = None,
         cache: str = "dynamic") -> KV:
    """A ``kv`` section (its records): timed points of ``cache`` (each round slowed by ``round_speed[r]``: drift both
    sides share), its drift, and optional ledger points with ops {op: slope}."""
    rng = np.random.default_rng(seed)
    points = []
    for r in range(rounds):
        speed = round_speed[r] if r < len(round_speed) else 1.0
        for c in CONTEXTS:
            kv_bytes = c * BYTES_PER_TOKEN
            base = (intercept_s + slope_s_per_byte * kv_bytes) * speed
            samples = base * (1 + noise * rng.standard_normal(10))
            points.append({"cache": cache, "context": c, "round": r, "kv_bytes": kv_bytes,
                           "samples_ms": [x * 1e3 for x in samples]})
    kv = {"points": points, "settings": {"max_drift": 0.10, "ledger_tolerance": 0.5, "resamples": 400,
                                         "confidence": 0.95, "seed": 0},
          "drift": {"fraction": drift, "ok": abs(drift) <= 0.10}}
    if ledger:
        def steps(s: float, c: int) -> list[float]:
            return list(s * c * BYTES_PER_TOKEN * (1 + noise * rng.standard_normal(8)) + 1e-4)
        kv["ledger_points"] = [{"cache": cache, "context": c, "kv_bytes": c * BYTES_PER_TOKEN,
                                "ops_s": {op: steps(s, c) for op, s in ledger.items()}} for c in CONTEXTS]
        kv["ledger"] = {cache: {op: {"timed": s * 1e10, "timed_ci": [s * 0.9e10, s * 1.1e10]}
                                for op, s in ledger.items()}}
    return KV.from_json({"schema": SCHEMA, **kv})


def judged(a: KV, b: KV, **kw) -> dict:
    """The class's verdicts as the ``ab`` section writes them."""
    return ab_section_json(ab.judge(a, b, resamples=400, **kw))["dynamic"]


def test_a_slower_slope_on_b_is_a_regression_and_the_verdict_has_the_judges_shape():
    v = judged(side(1e-9, 2e-3, seed=1), side(1.6e-9, 2e-3, seed=2))["timed"]
    assert v["status"] == "regression", v
    assert {"status", "value", "allowed", "reason", "ratio", "ratio_ci", "a", "b"} <= set(v)
    assert 1.45 < v["ratio"] < 1.75 and v["ratio_ci"][0] > 1.1 and v["allowed"] == 1.1


def test_a_faster_b_is_an_improvement_and_the_same_is_a_pass():
    assert judged(side(1e-9, 2e-3, seed=1), side(0.6e-9, 2e-3, seed=2))["timed"]["status"] == "improvement"
    same = judged(side(1e-9, 2e-3, seed=1), side(1e-9, 2e-3, seed=2))
    assert same["timed"]["status"] == "pass", same["timed"]
    assert same["intercept"]["status"] == "pass", same["intercept"]


def test_an_intercept_below_zero_on_b_is_no_improvement():
    """The layout twin of docs/ab.md: B's slope about doubles and its fitted intercept falls below zero (its time bends
    upward with the context). A ratio with a negative intercept would call B "faster": inconclusive, with why."""
    v = judged(side(1e-9, 2e-3, seed=1), side(2e-9, -1e-3, seed=2))
    assert v["timed"]["status"] == "regression", v["timed"]
    assert v["intercept"]["status"] == "inconclusive", v["intercept"]
    assert "B's intercept is not above zero in 100% of the resamples" in v["intercept"]["reason"]


def test_a_wide_interval_is_inconclusive_with_the_reason():
    v = judged(side(1e-9, 2e-3, seed=1, noise=0.3), side(1.1e-9, 2e-3, seed=2, noise=0.3))["timed"]
    assert v["status"] == "inconclusive" and v["reason"]


def test_drift_both_sides_share_leaves_the_verdict_but_drift_that_differs_makes_it_inconclusive():
    slow = (1.0, 1.25, 1.5)  # the machine slowed down round by round, for both sides alike
    shared = judged(side(1e-9, 2e-3, seed=1, drift=0.5, round_speed=slow),
                    side(1.6e-9, 2e-3, seed=2, drift=0.5, round_speed=slow))["timed"]
    assert shared["status"] == "regression", shared
    differing = judged(side(1e-9, 2e-3, seed=1), side(1.6e-9, 2e-3, seed=2, round_speed=(1.0, 1.15, 1.3)))["timed"]
    assert differing["status"] == "inconclusive" and "drift differs" in differing["reason"], differing
    assert "+30" in differing["reason"] or "+29" in differing["reason"], differing["reason"]


def with_drift(kv: KV, first_ms: float, last_ms: float) -> KV:
    """``kv`` with its drift check on its first point (dynamic at the first context): ``first_ms`` -> ``last_ms``."""
    doc = kv.to_json()
    doc["drift"] = {"cache": "dynamic", "context": CONTEXTS[0], "first_ms": first_ms, "last_ms": last_ms,
                    "fraction": last_ms / first_ms - 1, "ok": abs(last_ms / first_ms - 1) <= 0.10}
    return KV.from_json(doc)


def test_paired_drift_is_the_median_over_contexts_so_one_noisy_re_measurement_does_not_decide():
    a, b = side(1e-9, 2e-3, seed=1), side(1.6e-9, 2e-3, seed=2)
    first_b = float(np.median(b.points[0].samples_ms))
    first_a = float(np.median(a.points[0].samples_ms))
    # B's single re-measurement at the end came out 30% slow, A's not: the other contexts' pairs did not move
    noisy_a, noisy_b = with_drift(a, first_a, first_a), with_drift(b, first_b, first_b * 1.3)
    assert abs(ab.paired_drift(noisy_a, noisy_b, "dynamic")) < 0.05
    v = judged(noisy_a, noisy_b)["timed"]
    assert v["status"] == "regression", v
    # the re-measured pair counts for its context: with every context moved, the verdict is inconclusive
    moved = side(1.6e-9, 2e-3, seed=2, round_speed=(1.0, 1.2, 1.3))
    v = judged(noisy_a, with_drift(moved, float(np.median(moved.points[0].samples_ms)), first_b * 1.3))["timed"]
    assert v["status"] == "inconclusive" and "drift differs" in v["reason"], v


def test_paired_drift_compares_halves_so_pooled_rounds_settle_one_slowed_pair_but_not_a_trend():
    """With 8 rounds, B's last pair alone slowed by 25% (a neighbour's moment) is no drift: each end is the median
    of 4 pairs. The same 25% reached by a steady trend is. With 2 rounds, the halves are the first and last pair."""
    a = side(1e-9, 2e-3, seed=1, rounds=8)
    one_slow = side(1.6e-9, 2e-3, seed=2, rounds=8, round_speed=(1.0,) * 7 + (1.25,))
    assert abs(ab.paired_drift(a, one_slow, "dynamic")) < 0.05
    assert judged(a, one_slow)["timed"]["status"] == "regression"
    trend = side(1.6e-9, 2e-3, seed=2, rounds=8, round_speed=tuple(1.0 + 0.25 * r / 7 for r in range(8)))
    assert ab.paired_drift(a, trend, "dynamic") > 0.10
    assert "drift differs" in judged(a, trend)["timed"]["reason"]
    two_a, two_b = side(1e-9, 2e-3, seed=1, rounds=2), side(1.6e-9, 2e-3, seed=2, rounds=2, round_speed=(1.0, 1.2))
    assert 0.17 < ab.paired_drift(two_a, two_b, "dynamic") < 0.23


def test_too_few_paired_contexts_and_no_points_are_inconclusive():
    a = side(1e-9, 2e-3, seed=1)
    b = side(1e-9, 2e-3, seed=2)
    b.points = [p for p in b.points if p.context == CONTEXTS[0]]
    assert judged(a, b)["timed"]["status"] == "inconclusive"


def test_the_ledger_is_judged_per_op():
    a = side(1e-9, 2e-3, seed=1, ledger={"scaled_dot_product_attention": 1e-9, "cat": 4e-10, "tiny": 1e-12})
    b = side(1e-9, 2e-3, seed=2, ledger={"scaled_dot_product_attention": 2e-9, "cat": 4e-10, "tiny": 3e-12})
    ledger = judged(a, b)["ledger"]
    assert ledger["scaled_dot_product_attention"]["status"] == "regression"
    assert ledger["cat"]["status"] == "pass"
    assert ledger["tiny"]["status"] == "pass" and "not judged" in ledger["tiny"]["reason"]  # under the tolerance
    assert all(v["status"] in PAIRED_STATUSES for _, _, v in ab_statuses({"dynamic": judged(a, b)}))


def test_a_small_op_one_side_folded_into_other_ops_is_not_judged():
    """Gate power, clean run 9: ``mean`` (0.05 timed passes) had a row on B only, A had folded it into ``(other
    ops)`` (under ledger.KEEP); its noisy ratio ×3.6 [1.2, 20.7] was called a regression of a clean B side."""
    a = side(1e-9, 2e-3, seed=1, ledger={"cat": 4e-10, "mean": 1e-12}, noise=0.01)
    b = side(1e-9, 2e-3, seed=2, ledger={"cat": 4e-10, "mean": 4e-12}, noise=0.01)
    doc = a.to_json()
    del doc["ledger"]["dynamic"]["mean"]  # A's ledger folded it; its profiled steps still time it
    ledger = judged(KV.from_json(doc), b)["ledger"]
    assert ledger["mean"]["status"] == "pass" and "not judged" in ledger["mean"]["reason"], ledger["mean"]


def test_one_profiled_point_per_context_moving_between_contexts_is_no_verdict():
    """Identical sides, 2026-12-02: one profiled point per context and side, so each context's paired ratio moved by
    itself (B/A 0.82, 0.96, 0.97, 0.85, 1.25 from 1024 to 16384 tokens for ``scaled_dot_product_attention``) while
    the steps within a point varied by about 1%. Resampling steps alone gave ×1.26 [1.15, 1.31], a regression of B
    against itself; the contexts are drawn too, and the interval holds 1."""
    contexts, ratios, slope = (1024, 2048, 4096, 8192, 16384), (0.818, 0.962, 0.970, 0.852, 1.248), 1e-9
    rng = np.random.default_rng(3)

    op = "scaled_dot_product_attention"

    def kv(factors: tuple[float, ...]) -> KV:
        points = [{"cache": "dynamic", "context": c, "kv_bytes": c * BYTES_PER_TOKEN,
                   "ops_s": {op: list(slope * c * BYTES_PER_TOKEN * f * (1 + 0.01 * rng.standard_normal(8)))}}
                  for c, f in zip(contexts, factors)]
        return KV.from_json({"schema": SCHEMA, "settings": {"ledger_tolerance": 0.5, "seed": 0},
                             "ledger_points": points, "ledger": {"dynamic": {op: {"timed": 10, "timed_ci": [8, 12]}}}})
    a, b = kv((1.0,) * len(contexts)), kv(ratios)
    verdict = ab.judge_paired_ledger(a, b, "dynamic", tolerance=0.10, ledger_tolerance=0.5, max_drift=0.10,
                                     resamples=2000)[op]
    assert verdict.status == "inconclusive" and verdict.ratio_ci[0] < 1 < verdict.ratio_ci[1], verdict


def test_counted_and_overhead_verdicts_are_kept_and_a_regression_is_listed():
    a, b = side(1e-9, 2e-3, seed=1), side(1e-9, 2e-3, seed=2)
    counted = {"dynamic": {"counted": Verdict(status="regression", reason="counted passes 5.00 above 3.05", value=5.0,
                                              allowed=3.05)}}
    found = ab.judge(a, b, resamples=200, counted=counted)
    assert found["dynamic"]["counted"] is counted["dynamic"]["counted"]  # kept as the gate judged it, no copy
    assert ab_section_json(found)["dynamic"]["counted"] == counted["dynamic"]["counted"].to_json()
    assert read_ab_section(ab_section_json(found))["dynamic"]["counted"].status == "regression"
    assert any("counted" in line for line in ab.regressions(found))


def test_an_ab_file_is_read_by_compare_as_its_two_sides(tmp_path):
    from kvcache.analysing.records import load_runs

    data = json.loads((__import__("pathlib").Path(__file__).parent.parent / "data" / "tiny-run.json").read_text())
    doc = {**data, "ab": {}, "ab_run": {}, "side_a": data}
    path = tmp_path / "ab.json"
    path.write_text(json.dumps(doc))
    runs = load_runs(path)
    assert [r.path for r in runs] == [f"{path}[A]", f"{path}[B]"]
    plain = tmp_path / "run.json"
    plain.write_text(json.dumps(data))
    assert len(load_runs(plain)) == 1


def test_the_section_reads_back_as_records_and_rows():
    """The ``ab`` section as written (JSON) reads back as PairedVerdict records, every key kept; the summary rows
    show its ratio and interval."""
    verdicts = ab.judge(side(1e-9, 2e-3, seed=1), side(1.6e-9, 2e-3, seed=2), resamples=200)
    section = json.loads(json.dumps(ab_section_json(verdicts)))
    assert list(section["dynamic"]) == ["timed", "intercept", "ledger"]  # the ledger's object even when empty
    timed = read_ab_section(section)["dynamic"]["timed"]
    assert timed.status == "regression" and timed.to_json() == section["dynamic"]["timed"]
    assert read_ab_section(section) == verdicts  # what was judged is what is read back
    (row,) = [r for r in ab.summary_rows(read_ab_section(section)) if r[1] == "timed"]
    assert ab.summary_rows(verdicts) == ab.summary_rows(read_ab_section(section))
    assert row[4] == ab.ratio_text(timed) and row[4].startswith("×1.") and row[5] == "regression"
