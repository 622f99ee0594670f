"""``--kv-compile``: one real compiled run of the suite on ``tiny`` (three contexts, one round, a few steps), shared
by every test here. The session counts first (eager counter, then the counting compiles) and times afterwards, so
the run itself shows that counting leaves the timed run compiled. Nothing asserts on timing (``--kv-no-gate``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvrun import describe, load_json, output, run_batch, run_suite

from kvcache.analysing.records import KV, json_schema

pytest.importorskip("torch")
pytest.importorskip("transformers")

CLASSES = ("static", "dynamic", "planted-recompile", "planted-graph-break")


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory) -> tuple[dict, str]:
    tmp = tmp_path_factory.mktemp("compiled")
    path = tmp / "run.json"
    done = run_suite("--kv-model", "tiny", "--kv-compile", "default", "--kv-caches", ",".join(CLASSES),
                     "--kv-contexts", "256,512,1024", "--kv-rounds", "1", "--kv-steps", "5", "--kv-warmup", "2",
                     "--kv-copy-mib", "8", "--kv-no-gate", "--kv-baseline", "none",
                     "--benchmark-json", str(path))
    assert done.returncode == 0, describe(done)
    return load_json(Path(path)), output(done)


def points(doc: dict, cache: str) -> list[dict]:
    return [p for p in doc["kv"]["points"] if p["cache"] == cache]


def test_counted_both_ways_and_printed(compiled_run):
    doc, text = compiled_run
    for cache in ("static", "dynamic"):
        c = doc["kv"]["traffic"][cache]["compiled"]
        assert c["mode"] == "default" and c["fullgraph"] is True
        assert c["unfused"]["passes"] > 0 and c["fused"]["passes"] > 0
        assert c["graphs_per_step"] == 1 and c["kernels_per_step"] > 0
        assert set(c["fused"]["step_bytes"]) == {"256", "512"}
        assert f"compiled {cache} (default" in text
    dynamic = doc["kv"]["traffic"]["dynamic"]["compiled"]
    assert dynamic["unfused"]["by_op"] == {"cat": 2.0, "scaled_dot_product_attention": 1.0}  # the eager ops, unfused
    assert dynamic["fused"]["passes"] == pytest.approx(3.0, abs=0.01)


def test_fused_count_is_what_the_kernels_load_and_store(compiled_run):
    """StaticCache compiled: 1 + 2g passes (g = 3 query heads per KV head on tiny): the kernel that expands K/V to
    every query head reads them once and writes g copies, attention reads the g copies. Inductor's own count_bytes
    also charges the kernel that adds 1 to the position counters the whole K and V buffers it is only ordered
    after (8.01): no kernel of the fused count is charged that."""
    doc, _ = compiled_run
    fused = doc["kv"]["traffic"]["static"]["compiled"]["fused"]
    assert fused["passes"] == pytest.approx(7.0, abs=0.02)
    assert sorted(fused["by_kernel"].values()) == pytest.approx([3.0, 4.0], abs=0.01)
    assert set(fused["origins"]) == set(fused["by_kernel"])
    assert "scaled_dot_product_attention" in fused["origins"]["extern scaled_dot_product_attention"]
    assert fused["inductor_passes"] >= fused["passes"]


def test_timed_steps_ran_compiled_after_counting(compiled_run):
    """Counting (eager counter and counting compiles) ran first in this session; every timed step of the classes
    that compile still called one compiled graph, and nothing compiled during the timed steps."""
    doc, _ = compiled_run
    for cache in ("static", "dynamic"):
        infos = [p["compiled"] for p in points(doc, cache)]
        assert len(infos) == 3
        assert all(i["graph_calls_per_step"] == 1 and i["recompiles"] == 0 and i["problem"] is None for i in infos)
        assert infos[0]["graphs_compiled"] >= 1  # the class compiled in the first point's untimed preparation
        assert doc["kv"]["verdict"][cache]["timed"]["status"] != "inconclusive" or \
            "recompile" not in doc["kv"]["verdict"][cache]["timed"]["reason"]


def test_no_eager_ledger_in_a_compiled_run(compiled_run):
    doc, text = compiled_run
    assert not doc["kv"].get("ledger")
    assert "the ledger times eager ATen ops" in doc["kv"]["ledger_errors"]["static"]
    assert "ledger static: not profiled under --kv-compile default" in text


def test_planted_recompile_is_caught(compiled_run):
    doc, text = compiled_run
    infos = [p["compiled"] for p in points(doc, "planted-recompile")]
    assert any(i["recompiles"] > 0 for i in infos)
    verdict = doc["kv"]["verdict"]["planted-recompile"]["timed"]
    assert verdict["status"] in ("inconclusive", "no-baseline") and "recompile(s) during the timed steps" in \
        verdict["reason"]
    assert "recompiles during timed steps" in text


def test_planted_graph_break_is_skipped_with_the_reason(compiled_run):
    doc, text = compiled_run
    skips = [s for s in doc["kv"]["skipped"] if s["cache"] == "planted-graph-break"]
    assert skips and all("graph break" in s["reason"] for s in skips)
    assert "graph break" in doc["kv"]["traffic"]["planted-graph-break"]["compiled"]["error"]


def test_identity_and_schema(compiled_run):
    jsonschema = pytest.importorskip("jsonschema")
    doc, _ = compiled_run
    assert doc["kv"]["identity"]["compile"] == "default"
    jsonschema.Draft202012Validator(json_schema()).validate(doc)
    assert KV.from_json(doc["kv"]).to_json() == doc["kv"]
    assert not [k for k in KV.from_json(doc["kv"]).unknown_keys("kv") if "compile" in k]  # known to the records


def test_bad_compile_mode_and_reduce_overhead_on_cpu(tmp_path):
    done = run_batch({
        "bad": ["--kv-compile", "fast", "--co"],
        "cudagraphs": ["--kv-model", "tiny", "--kv-compile", "reduce-overhead", "--kv-device", "cpu",
                       "--kv-caches", "dynamic", "-m", "counted", "--kv-no-gate",
                       "--kv-baseline", "none", "--benchmark-json", str(tmp_path / "r.json")],
    })
    assert done["bad"].returncode == 4
    assert "--kv-compile 'fast' is not one of off, default, reduce-overhead, max-autotune" in output(done["bad"])
    assert done["cudagraphs"].returncode == 0, describe(done["cudagraphs"])
    compiled = load_json(tmp_path / "r.json")["kv"]["traffic"]["dynamic"]["compiled"]
    assert "CUDA graphs" in compiled["error"]
