"""--kv-compile in the analysing wing (no torch): the run identity, the counted figure the gate judges and records
(the fused one), and a recompile inside the timed steps making the timed verdict inconclusive."""

from __future__ import annotations

import copy

from fakerun import make_run

from kvcache.analysing.analysis import run_verdicts
from kvcache.analysing.judge import baseline
from kvcache.analysing.records import KV, identity

COMPILED = {"mode": "default", "runs_as": "default", "fullgraph": True,
            "unfused": {"passes": 11.0, "by_op": {"clone": 4.0, "scaled_dot_product_attention": 3.0}},
            "fused": {"passes": 8.0, "by_kernel": {"kernel clone": 4.0, "extern scaled_dot_product_attention": 3.0},
                      "step_bytes": {"256": 100, "512": 200}},
            "kernels_per_step": 57, "graphs_per_step": 1, "compile_s": 1.0}


def compiled_kv() -> dict:
    kv = copy.deepcopy(make_run(points=True)["kv"])
    kv["settings"]["compile"] = "default"
    for entry in kv["traffic"].values():
        entry["compiled"] = copy.deepcopy(COMPILED)
    return kv


def test_compile_mode_is_part_of_the_identity_only_when_on():
    eager = KV.from_json(make_run()["kv"])
    assert "compile" not in identity.of_run(eager).to_json()
    kv = KV.from_json(compiled_kv())
    ident = identity.of_run(kv)
    assert ident.compile == "default"
    assert identity.baseline_key(ident, "counted").endswith("| compile=default")
    assert "compile" not in identity.baseline_key(identity.of_run(eager), "counted")  # an eager run keeps its key
    assert identity.mismatches([identity.of_run(eager), ident], ["counted"]) == {"compile": ["off", "default"]}


def test_the_gated_counted_figure_is_the_fused_one():
    kv = KV.from_json(compiled_kv())
    assert kv.traffic["dynamic"].counted().passes == 8.0
    verdicts = run_verdicts(kv, None, max_passes={"dynamic": 7.5})
    assert verdicts["dynamic"]["counted"].status == "regression"
    assert verdicts["dynamic"]["counted"].value == 8.0
    entries, _ = baseline.entries_of_run(kv, "now")
    counted = entries[identity.baseline_key(identity.of_run(kv), "counted")]["dynamic"]
    assert counted["counted_passes"] == 8.0 and "kernel clone" in counted["counted_by_op"]


def test_a_class_that_does_not_compile_is_not_measured_with_the_reason():
    kv = compiled_kv()
    kv["traffic"]["dynamic"]["compiled"] = {"mode": "default", "error": "does not compile (graph break)"}
    verdict = run_verdicts(KV.from_json(kv), None)["dynamic"]["counted"]
    assert verdict.status == "not-measured" and "graph break" in verdict.reason


def test_a_recompile_in_the_timed_steps_makes_the_timed_verdict_inconclusive():
    kv = compiled_kv()
    for p in kv["points"]:
        p["compiled"] = {"mode": "default", "recompiles": 0, "graph_calls_per_step": 1.0, "problem": None}
    cache = kv["points"][0]["cache"]
    kv["points"][0]["compiled"].update(recompiles=3, problem="3 recompile(s) during the timed steps")
    bound = kv["fit"][cache]["passes"] * 10
    verdict = run_verdicts(KV.from_json(kv), None, max_passes={cache: bound})[cache]["timed"]
    assert verdict.status == "inconclusive"
    assert "3 recompile(s) during the timed steps" in verdict.reason
    assert baseline.timed_problem(KV.from_json(kv), cache).startswith("compiled run:")


def test_compare_shows_the_judged_counted_figure_of_a_compiled_run(tmp_path):
    """compare judged the fused count of a compiled run but showed the eager one (1.00 beside a fused 7.01)."""
    from fakerun import write_run

    from kvcache.analysing.compare import compare
    from kvcache.analysing.records import load_run

    run = make_run(points=True)
    run["kv"] = compiled_kv()
    path = write_run(tmp_path / "compiled.json", run)
    comparison = compare([load_run(path), load_run(path)])
    for cache, row in comparison.cells.items():
        assert [cell.counted for cell in row] == [8.0, 8.0], cache
