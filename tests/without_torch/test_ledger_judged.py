"""The per-op ledger analysed and judged (no torch): fits of synthetic profiles with known slopes, the rows it
keeps, and the ledger verdict (new ops, renamed ops, drift)."""

from __future__ import annotations

import random

import pytest

from kvcache.analysing import ledger
from kvcache.analysing.judge.entries import BaselineEntry
from kvcache.analysing.judge.judges import judge_ledger
from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.records import KV, Drift, LedgerPoint, LedgerRow, RunSettings, Speed

COPY_GBPS = 20.0
PER_TOKEN = 23_040
SETTINGS = RunSettings(confidence=0.95, resamples=400, seed=0)


def profile(slopes: dict[str, float], *, base_s: float = 0.002, unattributed_passes: float = 0.5, steps: int = 10,
            contexts=(512, 2048, 8192, 16384), noise: float = 0.01, seed: int = 0) -> list[LedgerPoint]:
    """Ledger records whose op ``o`` costs base_s + slopes[o] passes × kv_bytes / copy bandwidth per step."""
    rng = random.Random(seed)
    records = []
    for context in contexts:
        kv_bytes = context * PER_TOKEN
        ops = {op: [(base_s + passes * kv_bytes / (COPY_GBPS * 1e9)) * (1 + rng.gauss(0, noise))
                    for _ in range(steps)] for op, passes in slopes.items()}
        outside = [base_s + unattributed_passes * kv_bytes / (COPY_GBPS * 1e9) for _ in range(steps)]
        step = [sum(values[i] for values in ops.values()) + outside[i] for i in range(steps)]
        records.append(LedgerPoint(cache="dynamic", context=context, kv_bytes=float(kv_bytes), step_s=step, ops_s=ops))
    return records


def test_each_op_slope_is_its_timed_passes():
    rows = ledger.class_rows(profile({"scaled_dot_product_attention": 20.0, "cat": 2.0, "linear": 0.0}),
                                [COPY_GBPS] * 5, {"cat": 2.0, "scaled_dot_product_attention": 1.0}, SETTINGS)
    assert rows["scaled_dot_product_attention"].timed == pytest.approx(20.0, rel=0.03)
    assert rows["cat"].timed == pytest.approx(2.0, rel=0.05)
    lo, hi = rows["cat"].timed_ci
    assert lo < 2.0 < hi
    assert rows[ledger.UNATTRIBUTED].timed == pytest.approx(0.5, abs=0.05)
    assert rows[ledger.PROFILED_STEP].timed == pytest.approx(22.5, rel=0.03)
    assert "linear" not in rows and rows[ledger.OTHER].timed == pytest.approx(0.0, abs=0.05)  # folded: flat
    assert list(rows)[:2] == ["scaled_dot_product_attention", "cat"]  # largest first, then the special rows
    assert list(rows)[-3:] == [ledger.OTHER, ledger.UNATTRIBUTED, ledger.PROFILED_STEP]  # no plain steps recorded
    assert rows[ledger.PROFILED_STEP].over_plain is None


def test_the_plain_steps_between_the_profiled_ones_give_a_row_and_the_gap_per_context():
    """A profiled step 10% above the plain steps of its point at 512 tokens, 0% at the others: ``(plain step)`` is
    fitted like the profiled one, and ``over_plain`` says, per context, what the instrument did to the step."""
    records = profile({"scaled_dot_product_attention": 20.0, "cat": 2.0})
    for record in records:
        record.plain_s = [s / (1.10 if record.context == 512 else 1.0) for s in record.step_s]
    rows = ledger.class_rows(records, [COPY_GBPS] * 5, {"cat": 2.0}, SETTINGS)
    assert list(rows)[-2:] == [ledger.PROFILED_STEP, ledger.PLAIN_STEP]
    assert rows[ledger.PLAIN_STEP].timed == pytest.approx(rows[ledger.PROFILED_STEP].timed, rel=0.02)
    gaps = rows[ledger.PROFILED_STEP].over_plain
    assert list(gaps) == ["512", "2048", "8192", "16384"]
    assert gaps["512"] == pytest.approx(0.10) and gaps["16384"] == pytest.approx(0.0)
    assert LedgerRow.from_json(rows[ledger.PROFILED_STEP].to_json()) == rows[ledger.PROFILED_STEP]
    assert "over_plain" not in rows["cat"].to_json()  # the other rows: left out, not null


def test_an_op_absent_from_some_steps_counts_zero_there():
    records = profile({"cat": 2.0})
    for record in records[:2]:
        record.ops_s["clone"] = [0.0] * 10
    records[2].ops_s["clone"] = [0.01] * 10  # only some contexts have it; others do not at all
    rows = ledger.class_rows(records, [COPY_GBPS], {}, SETTINGS)
    assert "clone" in rows


def test_too_few_contexts_or_no_copy_bandwidth_give_no_ledger():
    found, errors = ledger.ledger_rows(profile({"cat": 2.0}, contexts=(512, 1024)), [COPY_GBPS], {}, SETTINGS)
    assert found == {} and "at least 3 distinct contexts" in errors["dynamic"]
    found, errors = ledger.ledger_rows(profile({"cat": 2.0}), [], {}, SETTINGS)
    assert found == {} and "no copy bandwidth" in errors["dynamic"]


def rows_of(**ops: tuple[float, float, float]) -> dict[str, LedgerRow]:
    return {op: LedgerRow(timed=v, timed_ci=[lo, hi]) for op, (v, lo, hi) in ops.items()}


BASE = {"scaled_dot_product_attention": 20.0, "cat": 2.0, "(unattributed)": 0.5, "(profiled step)": 22.5}
COUNTED = {"scaled_dot_product_attention": 1.0, "cat": 2.0, "clone": 2.0, "sum": 1.0}


def judge(now: dict, base: dict | None = BASE, **kw):
    return judge_ledger(now, base, rules=Rules(), drift=kw.pop("drift", None), key="k",
                        counted_by_op=kw.pop("counted_by_op", COUNTED), **kw)


def test_a_new_op_with_clearly_positive_time_is_a_regression():
    now = rows_of(scaled_dot_product_attention=(20.5, 19.0, 21.5), cat=(2.0, 1.8, 2.2), clone=(2.4, 1.9, 2.9))
    verdict = judge(now)
    assert verdict.status == "regression"
    assert verdict.parts["clone"].status == "regression" and verdict.parts["clone"].allowed == 0.5
    assert verdict.parts["clone"].new and not verdict.parts["cat"].new
    assert verdict.parts["scaled_dot_product_attention"].status == "pass"
    assert "clone (new): timed passes 2.4" in verdict.reason


def test_a_known_op_above_its_allowed_value_is_inconclusive_not_red():
    now = rows_of(scaled_dot_product_attention=(20.0, 19.0, 21.0), cat=(7.1, 6.7, 7.6))
    verdict = judge(now)
    assert verdict.status == "inconclusive" and verdict.parts["cat"].status == "inconclusive"
    assert "not judged" in verdict.parts["cat"].reason


def test_within_tolerance_passes_and_a_straddle_is_inconclusive():
    now = rows_of(scaled_dot_product_attention=(20.5, 19.0, 21.5), cat=(2.1, 1.8, 2.4))
    assert judge(now).status == "pass"
    wide = rows_of(scaled_dot_product_attention=(21.0, 18.0, 24.0), cat=(2.0, 1.8, 2.2))
    verdict = judge(wide)
    assert verdict.status == "inconclusive" and "scaled_dot_product_attention" in verdict.reason
    small_new = rows_of(scaled_dot_product_attention=(20.0, 19.0, 21.0), cat=(2.0, 1.9, 2.1), sum=(0.1, -0.1, 0.3))
    assert judge(small_new).status == "pass"


def test_ops_that_move_no_cache_bytes_are_shown_not_judged():
    now = rows_of(scaled_dot_product_attention=(20.0, 19.0, 21.0), cat=(2.0, 1.9, 2.1), linear=(3.0, 2.0, 4.0))
    now["(unattributed)"] = LedgerRow(timed=4.0, timed_ci=[3.0, 5.0])
    verdict = judge(now)
    assert verdict.status == "pass" and set(verdict.parts) == {"scaled_dot_product_attention", "cat"}


def test_a_renamed_op_is_matched_by_its_counted_passes_and_a_vanished_one_reported():
    now = rows_of(scaled_dot_product_attention=(20.0, 19.0, 21.0), concat=(2.1, 1.9, 2.3))
    verdict = judge_ledger(now, BASE, rules=Rules(), drift=None, key="k",
                           counted_by_op={"concat": 2.0, "scaled_dot_product_attention": 1.0},
                           base_counted_by_op={"cat": 2.0, "scaled_dot_product_attention": 1.0})
    assert verdict.status == "pass"
    assert verdict.parts["concat"].was == "cat" and "cat is now concat" in verdict.reason
    gone = judge(rows_of(scaled_dot_product_attention=(20.0, 19.0, 21.0)))
    assert "gone since the baseline: cat" in gone.reason


def test_drift_makes_known_ops_inconclusive_but_still_catches_a_new_op():
    drift = Drift(ok=False, fraction=0.3, max_fraction=0.1, cache="dynamic", context=512)
    known = rows_of(scaled_dot_product_attention=(30.0, 28.0, 32.0), cat=(2.0, 1.9, 2.1))
    assert judge(known, drift=drift).status == "inconclusive"  # 30 vs 20: the machine, or the op? unknown
    new = rows_of(scaled_dot_product_attention=(20.0, 19.0, 21.0), cat=(2.0, 1.9, 2.1), clone=(2.4, 1.9, 2.9))
    verdict = judge(new, drift=drift)
    assert verdict.status == "regression" and verdict.parts["clone"].allowed == pytest.approx(0.65)
    faint = rows_of(scaled_dot_product_attention=(20.0, 19.0, 21.0), sum=(0.7, 0.55, 0.9))
    assert judge(faint, drift=drift).parts["sum"].status == "inconclusive"  # above 0.5, not above 0.65


def test_no_baseline_or_no_ledger_never_accuse():
    now = rows_of(clone=(5.0, 4.0, 6.0))
    assert judge(now, None).status == "no-baseline"
    assert judge(None).status == "not-measured"


def test_a_machine_slower_than_when_the_baseline_was_recorded_makes_timed_verdicts_inconclusive():
    from kvcache.analysing.judge.gate import judge_run, speed_shift

    assert speed_shift(Speed(weights_ms=55.0), 51.0, 0.10) is None
    shift = speed_shift(Speed(weights_ms=63.0), 51.0, 0.10)
    assert shift.ok is False and "+24%" in shift.problem
    kv = KV.from_json({
        "schema": 3, "settings": {"caches": ["dynamic"], "max_drift": 0.10}, "speed": {"weights_ms": 63.0},
        "drift": {"ok": True, "fraction": 0.02, "max_fraction": 0.1, "cache": "dynamic", "context": 1024},
        "fit": {"dynamic": {"passes": 37.0, "passes_ci": [33.3, 39.2], "r2": 0.98, "intercept_ms": 70.0,
                            "intercept_ci": [65.0, 75.0]}},
        "traffic": {"dynamic": {"passes": 5.0, "by_op": {**COUNTED, "sum": 0.0}}}})
    kv.ledger = {"dynamic": rows_of(scaled_dot_product_attention=(31.0, 30.0, 32.0), cat=(7.8, 7.0, 8.5),
                                    clone=(2.4, 1.9, 2.9))}
    base = {"timed": {"dynamic": BaselineEntry(timed_passes=29.9, timed_intercept_ms=61.7, timed_weights_ms=51.0,
                                               timed_ledger=BASE)}, "counted": {}, "overhead": {}}
    keys = {"timed": "t", "counted": "c", "overhead": "o"}
    verdicts = judge_run(kv, base, Rules(), keys)["dynamic"]
    assert verdicts["timed"].status == "inconclusive" and "between the sessions" in verdicts["timed"].reason
    assert verdicts["intercept"].status == "inconclusive"
    assert verdicts["ledger"].status == "regression"  # the new op is still caught
    assert set(p.status for p in verdicts["ledger"].parts.values() if not p.new) == {"inconclusive"}
    kv.speed = Speed(weights_ms=52.0)
    again = judge_run(kv, base, Rules(), keys)["dynamic"]["timed"]
    assert again.status == "regression", again  # the same speed: red


def test_the_whole_step_rows_are_not_judged_as_ops_even_where_a_file_counts_them():
    """``(profiled step)`` and ``(plain step)`` are the step, which timed passes judge; never a new op of 23 passes."""
    now = rows_of(scaled_dot_product_attention=(20.0, 19.0, 21.0), cat=(2.0, 1.8, 2.2),
                  **{"(profiled step)": (23.0, 22.0, 24.0), "(plain step)": (22.5, 21.5, 23.5)})
    verdict = judge(now, counted_by_op={**COUNTED, "(profiled step)": 3.0, "(plain step)": 3.0})
    assert verdict.status == "pass" and not {"(profiled step)", "(plain step)"} & set(verdict.parts)
