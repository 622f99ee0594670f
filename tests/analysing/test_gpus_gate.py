"""Counted passes per GPU class (--kv-gpus) in the gate: judged like counted passes against the baseline's figure of
each class, recorded per class, merged class by class into the baseline. Stdlib only."""

from __future__ import annotations

import json

from kvcache.analysing import baseline
from kvcache.analysing.entries import BaselineEntry, entry_problems
from kvcache.analysing.judges import judge_gpus
from kvcache.analysing.records import Counted

T4_MATH = {"clone": 8.0, "bmm": 6.09, "mul": 6.0, "to": 3.0, "cat": 2.0}


def test_each_class_is_judged_against_its_own_baseline_with_the_ops_that_grew():
    base = BaselineEntry(counted_passes=3.0, gpu_passes={"t4": 9.0, "a100": 3.0},
                         gpu_by_op={"t4": {"reshape": 4.0, "scaled_dot_product_attention": 3.0, "cat": 2.0},
                                    "a100": {"cat": 2.0, "scaled_dot_product_attention": 1.0}})
    run = {"t4": Counted(25.26, T4_MATH), "a100": Counted(3.0, {"cat": 2.0, "scaled_dot_product_attention": 1.0})}
    verdict = judge_gpus(run, base, tolerance=0.05, key="cpu | smollm2-135m | bfloat16")
    assert verdict.status == "regression"
    assert verdict.parts["t4"].status == "regression" and verdict.parts["a100"].status == "pass"
    assert verdict.reason.startswith("t4: counted passes 25.3 is above the allowed 9.05; grew: clone +8.00")
    assert verdict.parts["t4"].allowed == 9.05


def test_no_baseline_and_not_predicted():
    run = {"t4": Counted(25.26, T4_MATH), "h100": Counted(None, {}, "not predicted: its attention is eager")}
    verdict = judge_gpus(run, None, tolerance=0.05, key="k")
    assert verdict.parts["t4"].status == "no-baseline" and verdict.parts["h100"].status == "not-measured"
    assert "not predicted: its attention is eager" in verdict.reason
    assert judge_gpus({}, None, tolerance=0.05, key="k").status == "not-measured"


def test_recording_merges_gpu_classes(tmp_path):
    path = tmp_path / "b.json"
    first = {"cpu | tiny | bfloat16": {"dynamic": {"counted_passes": 3.0, "gpu_passes": {"t4": 25.26, "a100": 3.0},
                                                   "gpu_by_op": {"t4": T4_MATH, "a100": {"cat": 2.0}}}}}
    baseline.update(path, first)
    baseline.update(path, {"cpu | tiny | bfloat16": {"dynamic": {"counted_passes": 3.0, "gpu_passes": {"t4": 9.0},
                                                                 "gpu_by_op": {"t4": {"reshape": 4.0}}}}})
    entry = json.loads(path.read_text())["devices"]["cpu | tiny | bfloat16"]["dynamic"]
    assert entry["gpu_passes"] == {"t4": 9.0, "a100": 3.0}
    assert entry["gpu_by_op"] == {"t4": {"reshape": 4.0}, "a100": {"cat": 2.0}}


def test_gpu_figures_out_of_range_are_refused():
    assert "gpu_passes" in entry_problems({"gpu_passes": {"t4": -1}})
    assert "gpu_by_op" in entry_problems({"gpu_by_op": {"t4": {"clone": "8"}}})
    assert "gpu_by_op" in entry_problems({"gpu_by_op": {"t4": 8}})
    assert entry_problems({"gpu_passes": {"t4": 25.26}, "gpu_by_op": {"t4": T4_MATH}}) == {}
