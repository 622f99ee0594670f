"""The overhead half of the line, judged: counted overhead (ATen ops per step, weight passes) exactly, keyed by
the torch release; the timed intercept by its interval. Synthetic runs, no torch."""

from __future__ import annotations

import pytest
from fakerun import make_run

from kvcache.analysing import analysis
from kvcache.analysing.judge import baseline
from kvcache.analysing.judge.entries import BaselineEntry
from kvcache.analysing.judge.gate import failures
from kvcache.analysing.judge.judges import judge_intercept, judge_overhead
from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.records import KV, Fit, Traffic, Verdict, identity
from kvcache.analysing.records.file_formats import BaselineFile

OVERHEAD_KEY = "cpu | smollm2-135m | bfloat16 | torch 2.13.0+cpu"
TIMED_KEY = "cpu: test machine | smollm2-135m | bfloat16"


def traffic(ops=1680, weight=1.01, layers=30, calls=None) -> Traffic:
    return Traffic(passes=3.0, ops_per_step=ops, data_ops_per_step=ops - 400, weight_passes=weight, layers=layers,
                   calls=calls or {"add": 100, "mul": 200})


BASE = BaselineEntry(ops_per_step=1680, weight_passes=1.01, layers=30, op_calls={"add": 100, "mul": 200})


def test_ops_within_the_per_layer_tolerance_pass_and_one_more_per_layer_fails():
    rules = Rules()  # 0.5 ops per layer
    assert judge_overhead(traffic(ops=1680 + 15), BASE, rules=rules, key=OVERHEAD_KEY).status == "pass"
    verdict = judge_overhead(traffic(ops=1680 + 30, calls={"add": 130, "mul": 200}), BASE, rules=rules,
                             key=OVERHEAD_KEY)
    assert verdict.status == "regression"
    assert verdict.value == 1710 and verdict.allowed == 1695
    assert "ops per step 1710 is above the allowed 1695" in verdict.reason and "calls grew: add +30" in verdict.reason
    assert verdict.parts["ops_per_step"].status == "regression"
    assert verdict.parts["weight_passes"].status == "pass"


def test_a_weight_read_more_fails_on_weight_passes():
    verdict = judge_overhead(traffic(weight=1.22), BASE, rules=Rules(), key=OVERHEAD_KEY)
    assert verdict.status == "regression"
    assert "weight passes 1.220 is above the allowed 1.060" in verdict.reason
    assert judge_overhead(traffic(weight=1.22), BASE, rules=Rules(weight_passes_tolerance=0.3),
                          key=OVERHEAD_KEY).status == "pass"


def test_no_overhead_baseline_or_no_count():
    assert judge_overhead(traffic(), None, rules=Rules(), key=OVERHEAD_KEY).status == "no-baseline"
    assert OVERHEAD_KEY in judge_overhead(traffic(), None, rules=Rules(), key=OVERHEAD_KEY).reason
    assert judge_overhead(Traffic(passes=3.0), BASE, rules=Rules(), key=OVERHEAD_KEY).status == "not-measured"


def test_one_host_sync_more_per_step_fails_and_a_baseline_without_syncs_judges_none():
    """Host syncs per step (issue 48) may not rise at all: each makes a GPU's host wait for the device."""
    base = BaselineEntry(ops_per_step=1680, weight_passes=1.01, layers=30, op_calls={"add": 100, "mul": 200},
                         host_syncs_per_step=0, host_sync_calls={})
    clean = Traffic(passes=3.0, ops_per_step=1680, weight_passes=1.01, layers=30, calls={"add": 100, "mul": 200},
                    host_syncs_per_step=0, host_syncs={})
    verdict = judge_overhead(clean, base, rules=Rules(), key=OVERHEAD_KEY)
    assert verdict.status == "pass" and "host syncs per step 0" in verdict.reason
    syncing = Traffic(passes=3.0, ops_per_step=1690, weight_passes=1.01, layers=30,
                      calls={"add": 100, "mul": 200, "_local_scalar_dense": 10}, host_syncs_per_step=10,
                      host_syncs={"_local_scalar_dense": 10})
    verdict = judge_overhead(syncing, base, rules=Rules(ops_tolerance=5), key=OVERHEAD_KEY)
    assert verdict.status == "regression" and verdict.parts["ops_per_step"].status == "pass"
    assert verdict.parts["host_syncs_per_step"].status == "regression"
    assert "host syncs per step 10 is above the allowed 0" in verdict.reason
    assert "host syncs grew: _local_scalar_dense +10" in verdict.reason
    assert "host_syncs_per_step" not in judge_overhead(syncing, BASE, rules=Rules(ops_tolerance=5),
                                                       key=OVERHEAD_KEY).parts  # an older baseline: not judged


def test_recorded_overhead_keeps_the_host_syncs():
    entries, _ = baseline.entries_of_run(KV.from_json(run_kv()), "2026-11-30T00:00:00")
    assert entries[OVERHEAD_KEY]["dynamic"]["host_syncs_per_step"] == 0
    assert entries[OVERHEAD_KEY]["dynamic"]["host_sync_calls"] == {}


@pytest.mark.parametrize("option", ["ops_tolerance", "weight_passes_tolerance"])
def test_tolerances_must_be_finite(option):
    with pytest.raises(ValueError, match=option):
        Rules(**{option: float("nan")})


def run_kv(**changes) -> dict:
    kv = make_run({"dynamic": 3.0})["kv"]
    kv.update(changes)
    return kv


def test_recorded_overhead_is_keyed_by_the_torch_release():
    entries, _ = baseline.entries_of_run(KV.from_json(run_kv()), "2026-11-30T00:00:00")
    assert entries[OVERHEAD_KEY]["dynamic"]["ops_per_step"] == 1680
    assert entries[OVERHEAD_KEY]["dynamic"]["op_calls"]
    assert entries[TIMED_KEY]["dynamic"]["timed_intercept_ms"] == 30.0
    kv = run_kv()
    kv["environment"] = {**kv["environment"], "torch": "2.14.0+cpu"}
    assert identity.baseline_key(identity.of_run(KV.from_json(kv)), "overhead") == \
        "cpu | smollm2-135m | bfloat16 | torch 2.14.0+cpu"


def test_a_new_torch_release_finds_no_overhead_baseline_rather_than_a_regression():
    doc = {"schema": 2, "devices": {}}
    entries, _ = baseline.entries_of_run(KV.from_json(run_kv()), "2026-11-30T00:00:00")
    for key, by_cache in entries.items():
        doc["devices"][key] = by_cache
    kv = run_kv()
    kv["traffic"]["dynamic"] = {**kv["traffic"]["dynamic"], "ops_per_step": 5000}
    recorded = BaselineFile.from_json(doc)
    assert analysis.run_verdicts(KV.from_json(kv), recorded)["dynamic"]["overhead"].status == "regression"
    kv["environment"] = {**kv["environment"], "torch": "2.14.0+cpu"}
    verdict = analysis.run_verdicts(KV.from_json(kv), BaselineFile.from_json(doc))["dynamic"]["overhead"]
    assert verdict.status == "no-baseline" and "torch 2.14.0+cpu" in verdict.reason


FIT = {"passes": 3.0, "passes_ci": [2.9, 3.1], "r2": 0.99, "intercept_ms": 36.0, "intercept_ci": [35.0, 37.0]}


def test_the_intercept_is_judged_by_its_interval():
    def judge(ci, allowed=33.0, **kw):
        fit = Fit.from_json({**FIT, "intercept_ci": ci, **kw})
        return judge_intercept(fit, allowed=allowed, rules=Rules(), drift=None, key=TIMED_KEY)

    assert judge([34.0, 35.0]).status == "regression"
    assert judge([30.0, 32.0]).status == "pass"
    straddling = judge([32.0, 34.0])
    assert straddling.status == "inconclusive" and "straddles" in straddling.reason
    assert judge([34.0, 35.0], r2=0.5).status == "inconclusive"
    assert judge([34.0, 35.0], allowed=None).status == "no-baseline"
    assert "--kv-max-passes" not in judge([34.0, 35.0], allowed=None).reason


def test_a_slower_intercept_fails_the_build_and_drift_makes_it_inconclusive():
    doc = {"schema": 2, "devices": {TIMED_KEY: {"dynamic": {"timed_passes": 3.0, "timed_intercept_ms": 20.0}}}}
    kv = run_kv()  # intercept 30 ms, its interval below
    kv["fit"]["dynamic"]["intercept_ci"] = [29.0, 31.0]
    verdicts = analysis.run_verdicts(KV.from_json(kv), BaselineFile.from_json(doc))
    assert verdicts["dynamic"]["intercept"].status == "regression"
    assert any("dynamic intercept" in line for line in failures(verdicts))
    kv["drift"] = {**kv["drift"], "ok": False, "fraction": 0.3}
    drifted = analysis.run_verdicts(KV.from_json(kv), BaselineFile.from_json(doc))["dynamic"]["intercept"]
    assert drifted.status == "inconclusive" and "drift" in drifted.reason


def test_strict_leaves_the_exact_overhead_alone():
    verdicts = {"dynamic": {"overhead": Verdict("inconclusive", "x"), "intercept": Verdict("inconclusive", "y")}}
    lines = failures(verdicts, strict=True)
    assert len(lines) == 1 and "intercept" in lines[0]


def test_compare_judges_op_counts_on_one_torch_release_and_only_shows_them_across_releases(tmp_path, capsys):
    from fakerun import write_run

    from kvcache.analysing.compare import REGRESSED, compare
    from kvcache.analysing.records import load_run
    from kvcache.cli import main

    def run(name, ops, torch="2.13.0+cpu"):
        doc = make_run({"dynamic": 3.0})
        doc["kv"]["traffic"]["dynamic"]["ops_per_step"] = ops
        doc["kv"]["environment"]["torch"] = torch
        doc["kv"]["identity"] = identity.of_run(KV.from_json(doc["kv"])).to_json()
        return str(write_run(tmp_path / name, doc))

    base, more, other_torch = run("a.json", 1680), run("b.json", 1740), run("c.json", 1740, torch="2.14.0+cpu")
    comparison = compare([load_run(base), load_run(more)])
    cell = comparison.cells["dynamic"][1]
    assert cell.figures["ops"] == 1740 and cell.changes["ops"] == REGRESSED and cell.deltas["ops"] == 60
    assert [r.measure for r in comparison.regressions] == ["overhead"]
    assert main(["compare", base, more]) == 1
    out = capsys.readouterr().out
    assert "ops/step" in out and "1740 ▲ +60" in out
    assert main(["compare", base, more, "--ops-tolerance", "3"]) == 0
    capsys.readouterr()
    assert main(["compare", base, other_torch]) == 0  # another torch release: shown, not judged
    verdict = compare([load_run(base), load_run(other_torch)]).cells["dynamic"][1].judged["overhead"]
    assert verdict.status == "no-baseline" and "2.14.0+cpu" in verdict.reason


def test_compare_and_the_comment_mark_added_host_syncs_in_their_own_column(tmp_path, capsys):
    from fakerun import write_run

    from kvcache.analysing.compare import REGRESSED, SAME, compare
    from kvcache.analysing.records import load_run
    from kvcache.cli import main

    def run(name, syncs):
        doc = make_run({"dynamic": 3.0})
        doc["kv"]["traffic"]["dynamic"].update(host_syncs_per_step=syncs, host_syncs={"item": syncs} if syncs else {})
        return str(write_run(tmp_path / name, doc))

    base, more = run("a.json", 0), run("b.json", 60)
    cell = compare([load_run(base), load_run(more)]).cells["dynamic"][1]
    assert cell.changes["syncs"] == REGRESSED and cell.changes["ops"] == SAME and cell.deltas["syncs"] == 60
    assert main(["compare", base, more]) == 1
    out = capsys.readouterr().out
    assert "syncs/step" in out and "60 ▲ +60" in out and "host syncs grew: item +60" in out
    assert main(["comment", base, more]) == 0
    out = capsys.readouterr().out
    assert "| dynamic | host syncs per step | 0 | 60 | +60 | ▲ regression |" in out
    assert "| dynamic | ATen ops per step | 1680 | 1680 | +0 |  |" in out


def test_the_summary_and_the_report_show_the_overhead(tmp_path):
    from fakerun import RECORDED_RUN, recorded_run

    from kvcache.analysing import summary
    from kvcache.cli import main

    kv = recorded_run()["kv"]
    text = "\n".join(summary.lines(KV.from_json(kv)))
    dynamic = kv["traffic"]["dynamic"]
    assert "ops/step" in text and "weight passes" in text and "intercept verdict" in text
    assert any(line.startswith("dynamic") and f" {dynamic['ops_per_step']} " in line for line in text.splitlines())
    assert main(["report", str(RECORDED_RUN), "--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "### Per-step overhead" in report and f"| dynamic | {dynamic['ops_per_step']} |" in report
