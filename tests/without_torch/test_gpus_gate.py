"""Counted passes per GPU class (--kv-gpus) in the gate: judged like counted passes against the baseline's figure of
each class, recorded per class, merged class by class into the baseline. Stdlib only."""

from __future__ import annotations

import json

import pytest

from kvcache.analysing.judge import baseline
from kvcache.analysing.judge.entries import BaselineEntry, entry_problems
from kvcache.analysing.judge.judges import judge_gpus
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


def _with_gpus(doc: dict, t4: float) -> dict:
    doc = json.loads(json.dumps(doc))
    by_op = T4_MATH if t4 > 20 else {"reshape": 4.0, "scaled_dot_product_attention": 3.0, "cat": 2.0}
    doc["kv"]["traffic"]["dynamic"]["gpus"] = {
        "t4": {"backend": "math", "rejected": {"flash": "Flash attention only supports gpu architectures in the range "
                                                        "[sm80, sm121]. Attempting to run on a sm 7.5 gpu."},
               "passes": t4, "by_op": by_op},
        "a100": {"backend": "flash", "rejected": {}, "passes": 3.0, "by_op": {"cat": 2.0}}}
    return doc


def test_compare_and_comment_judge_each_gpu_class(tmp_path):
    from fakerun import make_run, write_run

    from kvcache.analysing.comment import counted_rows
    from kvcache.analysing.compare import compare
    from kvcache.analysing.compare_render import cell_texts
    from kvcache.analysing.records import load_run

    base = tmp_path / "base.json"
    head = tmp_path / "head.json"
    write_run(base, _with_gpus(make_run(), 9.0))
    write_run(head, _with_gpus(make_run(), 25.26))
    runs = [load_run(base), load_run(head)]
    comparison = compare(runs)
    assert [r.measure for r in comparison.regressions] == ["counted passes per GPU class"]
    assert "t4: counted passes 25.3 is above the allowed 9.05; grew: clone +8.00" in comparison.regressions[0].reason
    head_cell = comparison.cells["dynamic"][1]
    assert cell_texts(head_cell, ["gpu"]) == ["t4 25.26 ▲ · a100 3.00"]
    rows = {tuple(r[:2]): r for r in counted_rows(comparison, *runs)}
    assert rows[("dynamic", "counted passes on t4")][2:] == ["9.00", "25.26", "+16.26", "▲ regression"]


def test_bisect_takes_a_gpu_class_as_its_figure():
    from kvcache.analysing.records import KV
    from kvcache.bisect import search

    doc = _with_gpus({"kv": {"schema": 2, "settings": {"caches": ["dynamic"]}, "traffic": {"dynamic": {
        "passes": 3.0, "by_op": {"cat": 2.0}}}, "skipped": []}}, 25.26)
    kv = KV.from_json(doc["kv"])
    figure = search.figure_of(kv, search.bisect_measures()["gpu:t4"], "dynamic")
    assert figure.value == 25.26 and figure.detail["clone"] == 8.0
    missing = search.figure_of(kv, search.bisect_measures()["gpu:h100"], "dynamic")
    assert missing.value is None and "counted passes on h100" in missing.reason


def test_the_report_shows_backends_and_gpu_classes(tmp_path):
    from fakerun import make_run, write_run

    from kvcache.analysing.records import load_run
    from kvcache.analysing.report.documents import to_html, to_markdown
    from kvcache.analysing.report.sections import build_doc

    doc = _with_gpus(make_run(), 25.26)
    doc["kv"]["traffic"]["dynamic"]["backends"] = {
        "math": {"passes": 25.26, "by_op": T4_MATH},
        "flash": {"passes": None, "by_op": {}, "error": "torch's rules reject flash: <mask>"}}
    built = build_doc([load_run(write_run(tmp_path / "run.json", doc))])
    text = to_markdown(built)
    assert "### SDPA backends" in text and "### GPU classes" in text
    assert "| dynamic | t4 | math | 25.26 | flash: Flash attention only supports gpu architectures" in text
    assert "<mask>" not in text and "<mask>" not in to_html(built)  # escaped


def test_the_versions_table_has_a_column_per_class_and_gpu_class(tmp_path):
    from fakerun import make_run, write_run

    from kvcache.bisect.versions_table import counted_table

    doc = _with_gpus(make_run(), 25.26)
    doc["kv"]["traffic"]["static"]["gpus"] = {"t4": {"backend": None, "passes": None, "error": "not predicted: x"}}
    text = counted_table([write_run(tmp_path / "counted-5.24.0.json", doc)])
    header = text.splitlines()[0]
    assert "| dynamic on t4 | dynamic on a100 |" in header and "static on t4" in header
    assert "| 25.26 (math) | 3.00 (flash) |" in text and "not predicted: x" in text


@pytest.mark.parametrize("t4", ["missing", None, float("nan"), float("inf"), "x", 30.0])
def test_a_gpu_figure_head_drops_or_spoils_fails_the_pull_request_gate(tmp_path, capsys, t4):
    """Issue 49 item 2: HEAD's t4 figure missing, null, NaN, infinite or text passed compare --require-classes --rules
    first (exit 0) and the comment said "no regression" (or "inconclusive"); only t4 at 30 was caught."""
    from fakerun import make_run, write_run

    from kvcache.cli import main

    base = write_run(tmp_path / "base.json", _with_gpus(make_run(), 9.0))
    doc = _with_gpus(make_run(), 9.0)
    if t4 == "missing":
        del doc["kv"]["traffic"]["dynamic"]["gpus"]["t4"]
    else:
        doc["kv"]["traffic"]["dynamic"]["gpus"]["t4"]["passes"] = t4
    head = write_run(tmp_path / "head.json", doc)
    assert main(["compare", str(base), str(head), "--require-classes", "--rules", "first"]) == 1
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("regression:")]
    assert "counted passes per GPU class: t4: " in line, line
    assert main(["comment", str(base), str(head)]) == 0
    body = capsys.readouterr().out
    assert body.splitlines()[0] == "### ▲ KV-cache passes: regression: dynamic", body
    t4_row = next(x for x in body.splitlines() if x.startswith("| dynamic | counted passes on t4 | 9.00 |"))
    assert t4_row.endswith("▲ regression |"), t4_row
    assert "| dynamic | counted passes on a100 | 3.00 | 3.00 | +0.00 |  |" in body


def test_a_gpu_figure_head_lacks_passes_plain_compare_as_a_missing_class_does(tmp_path):
    """Without --require-classes a GPU class the head does not predict is not judged (as a class it skips), while a
    figure that is there but not a number fails whatever the options."""
    from fakerun import make_run, write_run

    from kvcache.cli import main

    base = write_run(tmp_path / "base.json", _with_gpus(make_run(), 9.0))
    doc = _with_gpus(make_run(), 9.0)
    doc["kv"]["traffic"]["dynamic"]["gpus"]["t4"]["passes"] = None
    assert main(["compare", str(base), str(write_run(tmp_path / "null.json", doc))]) == 0
    doc["kv"]["traffic"]["dynamic"]["gpus"]["t4"]["passes"] = "x"
    assert main(["compare", str(base), str(write_run(tmp_path / "x.json", doc))]) == 1
