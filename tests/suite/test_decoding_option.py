"""``--kv-decoding``: strategies crossed with the classes, records keyed ``<cache>#<strategy>``, counted exactly on
``tiny``: beam search through generate (DynamicCache 3.00 -> 5.00 in forward + reorder, StaticCache 1.00 -> 3.00,
its buffer left in new storage every step), a planted regression in a class's ``reorder_cache`` that fails the
counted gate for ``#beam:N`` and not for greedy, chunked prefill's prefill measure, and every bad value a one-line
usage error."""

from __future__ import annotations

import json

import pytest
from kvrun import assert_one_line_usage_error, describe, load_json, output, run_batch, run_suite

pytest.importorskip("torch")
pytest.importorskip("transformers")

TINY = ["-m", "counted", "--kv-model", "tiny"]


def test_beam_search_through_generate_is_counted_by_phase_and_op(tmp_path):
    out = tmp_path / "run.json"
    done = run_suite(*TINY, "--kv-caches", "dynamic,static", "--kv-driver", "generate", "--kv-decoding",
                     "greedy,beam:4", "--kv-baseline", "none", "--benchmark-json", str(out))
    assert done.returncode == 0, describe(done)
    kv = load_json(out)["kv"]
    assert set(kv["traffic"]) == {"dynamic", "static", "dynamic#beam:4", "static#beam:4"}
    for key, forward in (("dynamic#beam:4", 3.0), ("static#beam:4", 1.0)):
        t = kv["traffic"][key]
        assert t["strategy"] == "beam:4" and t["rows"] == 4 and t["tokens_per_step"] == 1, t
        assert t["phases"]["reorder"]["passes"] == pytest.approx(2.0, abs=1e-9), t["phases"]
        assert t["phases"]["reorder"]["by_op"] == {"index_select": 2.0}, t["phases"]
        assert t["phases"]["forward"]["passes"] == pytest.approx(forward, abs=0.01), t["phases"]
        assert t["phases"]["forward"]["passes"] + t["phases"]["reorder"]["passes"] == \
            pytest.approx(forward + 2.0, abs=0.01)
        assert t["by_op"]["index_select"] == pytest.approx(2.0, abs=1e-9), t
    memory = kv["memory"]
    assert memory["static#beam:4"]["held_new_passes"] == pytest.approx(1.0, abs=0.05), memory  # reallocated
    assert memory["static"]["held_new_passes"] == pytest.approx(0.0, abs=0.05), memory
    assert memory["static#beam:4"]["allocated_by_op"]["index_select"] == pytest.approx(1.0, abs=1e-6)
    text = output(done)
    assert "decoding dynamic#beam:4: 5.094 passes a step" in text, describe(done)
    assert "reorder 2.00 (index_select 2.00)" in text, describe(done)
    assert "decoding static#beam:4 memory:" in text and "(static: 0.01)" in text, describe(done)


def test_a_reorder_that_copies_twice_fails_the_gate_for_beam_only(tmp_path):
    """The baseline of ``twin-clean`` (DynamicCache) stands for ``twin-reorder``'s (its keys renamed): the planted
    class moves exactly what DynamicCache moves greedily, and 2 more passes in every beam step's reorder."""
    baseline = tmp_path / "baseline.json"
    strategies = ["--kv-decoding", "greedy,beam:2"]
    done = run_suite(*TINY, "--kv-caches", "twin-clean", *strategies, "--kv-baseline", str(baseline),
                     "--kv-update-baseline")
    assert done.returncode == 0, describe(done)
    baseline.write_text(baseline.read_text().replace("twin-clean", "twin-reorder"))
    out = tmp_path / "planted.json"
    done = run_suite(*TINY, "--kv-caches", "twin-reorder", *strategies, "--kv-baseline", str(baseline),
                     "--benchmark-json", str(out))
    assert done.returncode == 1, describe(done)
    kv = load_json(out)["kv"]
    assert kv["verdict"]["twin-reorder"]["counted"]["status"] == "pass", kv["verdict"]
    assert kv["verdict"]["twin-reorder#beam:2"]["counted"]["status"] == "regression", kv["verdict"]
    reorder = kv["traffic"]["twin-reorder#beam:2"]["phases"]["reorder"]
    assert reorder["passes"] == pytest.approx(4.0, abs=1e-9), reorder
    assert reorder["by_op"] == {"clone": 2.0, "index_select": 2.0}, reorder


def test_chunked_prefill_counts_the_prefill_chunked_and_not(tmp_path):
    out = tmp_path / "run.json"
    done = run_suite(*TINY, "--kv-caches", "dynamic", "--kv-counted-contexts", "512,1024", "--kv-decoding",
                     "chunked-prefill:256", "--kv-baseline", "none", "--benchmark-json", str(out))
    assert done.returncode == 0, describe(done)
    t = load_json(out)["kv"]["traffic"]["dynamic#chunked-prefill:256"]
    prefill = t["prefill"]
    assert prefill["chunks"] == 4 and prefill["context"] == 1024, prefill
    # DynamicCache cats every chunk onto the cache so far: 2 x (256 + 512 + 768 + 1024) / 1024 = 5 cache sizes
    # against 2 (one cat onto the empty cache) unchunked; its decode step is greedy's
    assert prefill["extra_by_op"]["cat"] == pytest.approx(3.0, abs=1e-6), prefill
    assert t["passes"] == pytest.approx(3.0, abs=1e-6), t
    assert "prefill dynamic#chunked-prefill:256: 1024 tokens in 4 chunks of 256" in output(done), describe(done)


def test_bad_decoding_values_are_one_line_usage_errors():
    cases = {"unknown": ["--kv-decoding", "greedy,sampling"], "one-beam": ["--kv-decoding", "beam:1"],
             "no-draft-tokens": ["--kv-decoding", "prompt-lookup:0"], "empty": ["--kv-decoding", ","],
             "chunk": ["--kv-decoding", "chunked-prefill:4096", "--kv-counted-contexts", "256,512"],
             "in-caches": ["--kv-caches", "dynamic#beam:x"],
             "compiled": ["--kv-decoding", "greedy,beam:2", "--kv-compile", "default"]}
    results = run_batch({name: [*TINY, *args] for name, args in cases.items()})
    for done in results.values():
        assert_one_line_usage_error(done)
    assert "'sampling'" in output(results["unknown"]) and "beam:N" in output(results["unknown"])
    assert "beams 1 is below 2" in output(results["one-beam"])
    assert "larger than the context 256" in output(results["chunk"])
    assert "--kv-compile default: not supported" in output(results["compiled"])


def test_a_strategy_no_module_measures_is_a_skip_with_the_reason(tmp_path):
    out = tmp_path / "run.json"
    done = run_suite(*TINY, "--kv-caches", "dynamic", "--kv-decoding", "greedy,assisted:self:3", "--kv-no-gate",
                     "--kv-baseline", "none", "--benchmark-json", str(out))
    assert done.returncode == 0, describe(done)
    skipped = {s["cache"]: s["reason"] for s in load_json(out)["kv"]["skipped"]}
    if "dynamic#assisted:self:3" in skipped:  # unregistered, or (registered) not under the loop driver
        reason = skipped["dynamic#assisted:self:3"]
        assert "no strategy registered" in reason or "--kv-driver generate" in reason, skipped
    assert json.dumps(skipped) and "dynamic" not in skipped
