"""kvcache.analysing.summary: the terminal summary of a run's records never fails on a figure that is not known, and
says each verdict's reason once."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakerun import make_run

from kvcache.analysing import summary
from kvcache.analysing.records import KV
from kvcache.analysing.tables import MISSING


def test_a_class_without_counted_passes_or_an_interval_is_summarised():
    """``passes`` is optional in ``kv.traffic.<cache>`` (and null in JSON): it was formatted with ``:.3f``."""
    kv = make_run()["kv"]
    kv["traffic"]["dynamic"]["passes"] = None
    kv["fit"]["static"]["passes_ci"] = [None, None]
    lines = summary.lines(KV.from_json(kv))
    assert any(line.startswith(f"counted dynamic: {MISSING} passes") for line in lines), lines
    assert any(line.startswith("counted static: 1.000 passes") for line in lines), lines


def test_verdicts_are_statuses_with_each_reason_said_once():
    """Two classes judged against no baseline share the reason of each measure: the table's cells name the status
    and the number of the reason, and each reason is printed once, under the table."""
    kv = KV.from_json(make_run()["kv"])
    lines = summary.lines(kv)
    header = next(i for i, line in enumerate(lines) if line.startswith("cache") and "counted verdict" in line)
    rows = {line.split()[0]: line.split()[1:] for line in lines[header + 2:header + 4]}
    assert set(rows) == {"dynamic", "static"}
    assert rows["dynamic"][:2] == rows["static"][:2] == ["no-baseline", "[1]"], rows
    reasons = {v.reason for verdicts in kv.verdict.values() for v in verdicts.values() if v.reason}
    notes = [line.strip() for line in lines[header + 4:]]
    assert sorted(note.split("] ", 1)[1] for note in notes) == sorted(reasons), notes
    assert not any("no baseline for" in line for line in lines[:header]), lines  # no reason but in the notes


def test_verdict_table_orders_the_measures_and_marks_a_measure_a_class_lacks():
    kv = KV.from_json(make_run()["kv"])
    del kv.verdict["static"]["ledger"]
    table, notes = summary.verdict_table(kv.verdict)
    assert table.header[:4] == ["cache", "counted verdict", "timed verdict", "intercept verdict"]
    ledger = table.header.index("ledger verdict")
    assert table.rows[1][ledger] == MISSING and table.rows[0][ledger].startswith("not-measured [")
    assert len(notes.texts) == len(set(notes.texts))


def test_compiled_and_memory_lines_read_their_records():
    """``--kv-compile`` (the compiled step counted unfused and fused; the points' compilation) and counted memory
    (per allocated byte, past every window) in the summary, from the typed records."""
    run = make_run(memory=True)
    kv = run["kv"]
    unfused = {**kv["traffic"]["dynamic"], "passes": 3.0}
    kv["traffic"]["dynamic"]["compiled"] = {
        "mode": "default", "runs_as": "default", "fullgraph": True, "unfused": unfused,
        "fused": {"passes": 2.5, "by_kernel": {"triton_poi_fused_cat_0": 2.5}}, "kernels_per_step": 40,
        "graphs_per_step": 1, "compile_s": 3.2}
    kv["traffic"]["static"]["compiled"] = {"mode": "default", "error": "does not compile here"}
    kv["points"] = [{"cache": "dynamic", "context": c, "kv_bytes": 1.0, "median_ms": 31.0,
                     "compiled": {"mode": "default", "compile_s": s, "graphs_compiled": 1, "recompiles": 0,
                                  "graph_calls_per_step": 1, "problem": None}} for c, s in ((512, 2.0), (1024, 0.5))]
    kv["memory"]["dynamic"]["per_allocated"] = {"allocated_passes": 0.5, "peak_passes": 0.01, "held_passes": 0.9}
    kv["memory"]["dynamic"]["beyond"] = {"contexts": [4096, 8192], "held_growth_bytes": 0}
    text = "\n".join(summary.lines(KV.from_json(kv)))
    assert ("compiled dynamic (default, runs as default): counted unfused 3.000 passes = cat 2.00, "
            "scaled_dot_product_attention 1.00; fused (gated) 2.500 passes = triton_poi_fused_cat_0 2.50; "
            "40 kernels and 1 graph(s) per step") in text
    assert "compiled static (default): not counted: does not compile here" in text
    assert ("compile dynamic: 2.5 s compiling in untimed warm-ups (first point 2.0 s), 2 graph(s) compiled; "
            "recompiles during timed steps 0; compiled graph calls per step 1") in text
    assert "(per allocated KV byte: allocated 0.500, peak 0.010, held 0.900)" in text
    assert "memory dynamic: past every sliding window (4096, 8192 tokens) the bytes held grew by 0 B" in text


def test_the_profiled_step_against_the_plain_steps_is_said_per_context_and_judged_against_15_percent():
    """``over_plain`` on a class's ``(profiled step)`` row: each context's gap, and the contexts beyond ±15%; a key
    that is not a number of tokens (a file's) is shown as it is, never a traceback."""
    kv = make_run()["kv"]
    kv["ledger"] = {"dynamic": {"(profiled step)": {"timed": 3.1, "over_plain": {"1024": 0.06, "16384": 0.02}}},
                    "static": {"(profiled step)": {"timed": 1.1, "over_plain": {"1024": 0.21, "<b>": -0.3}}}}
    lines = [line for line in summary.lines(KV.from_json(kv)) if "plain steps between" in line]
    assert lines == [
        "ledger dynamic: profiled step against the plain steps between them, per context: 1,024 +6.0%, 16,384 +2.0% "
        "(within ±15% at every context)",
        "ledger static: profiled step against the plain steps between them, per context: 1,024 +21.0%, <b> -30.0% "
        "(beyond ±15% at 1,024, <b> tokens: there the op figures describe a step the instrument changed)"]


@pytest.mark.parametrize("with_baseline", [False, True])
def test_a_poor_fit_is_flagged_not_to_be_quoted_with_or_without_a_baseline(tmp_path, with_baseline):
    """Issue 49 item 5: a timed figure whose R² is below --kv-min-r2 was flagged only against a baseline (the
    judge's inconclusive); with none it was shown as any other figure. The summary, the report and the verdict's
    reason say it is not to be quoted either way."""
    from fakerun import write_run

    from kvcache.analysing import analysis, summary
    from kvcache.analysing.judge import baseline
    from kvcache.analysing.records import KV, load_run
    from kvcache.analysing.report.documents import to_html, to_markdown
    from kvcache.analysing.report.sections import build_doc

    doc = make_run({"dynamic": 3.0, "static": 1.0})
    doc["kv"]["fit"]["dynamic"]["r2"] = 0.31
    kv = KV.from_json(doc["kv"])
    stored = None
    if with_baseline:
        path = tmp_path / "baseline.json"
        baseline.record(path, KV.from_json(make_run({"dynamic": 3.0, "static": 1.0})["kv"]), "2026-11-29T00:00:00")
        stored = baseline.load(path)
    kv.verdict = analysis.run_verdicts(kv, stored)
    flag = "dynamic: poor fit: R² 0.31 < 0.90 (--kv-min-r2): its timed passes and intercept are not to be quoted"
    lines = summary.lines(kv)
    assert f"timed {flag}" in lines
    assert not any(line.startswith("timed static:") for line in lines)
    assert "poor fit" in next(line for line in lines if line.startswith("dynamic ") and "0.310" in line)
    assert "poor fit: R² 0.31 < 0.90" in kv.verdict["dynamic"]["timed"].reason
    assert kv.verdict["dynamic"]["timed"].status == ("inconclusive" if with_baseline else "no-baseline")
    doc["kv"]["verdict"] = kv.to_json()["verdict"]
    built = build_doc([load_run(write_run(tmp_path / "run.json", doc))])
    assert "0.310 poor fit" in to_markdown(built) and "not to be quoted" in to_markdown(built)
    assert "not to be quoted" in to_html(built)


def test_gpu_backend_lines_are_introduced_as_a_cuda_gpus_prediction():
    """A CPU run's summary names GPU backends (``b200: Flash Attention does not support non-null attn_mask``): one
    line above them says they are what a CUDA GPU would run, from torch's rules; without them, no such line."""
    from kvcache.analysing.records import BackendCount

    kv = KV.from_json(make_run()["kv"])
    assert summary.BACKENDS_NOTE not in summary.lines(kv)
    kv.traffic["static"].update(backends={"cudnn": BackendCount.of(passes=1.01), "flash": BackendCount.of(
        error="torch's rules reject flash for this step on every GPU class (b200: Flash Attention does not support "
              "non-null attn_mask.)")})
    lines = summary.lines(kv)
    at = lines.index(summary.BACKENDS_NOTE)
    assert lines[at + 1].startswith("backends static: cudnn 1.01 · flash — (torch's rules reject flash"), lines
    assert "CUDA GPU" in summary.BACKENDS_NOTE and "torch's backend rules" in summary.BACKENDS_NOTE
    page = Path(__file__).resolve().parents[2] / "docs" / "gpu-backends.md"
    assert summary.BACKENDS_NOTE in " ".join(page.read_text(encoding="utf-8").split())  # the page quotes it
