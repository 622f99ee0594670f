"""``--kv-decoding`` assisted decoding and prompt lookup, counted exactly on ``tiny`` through generate: one assisted
iteration a step, split into the main model's forward (verify), the crop and the draft; a self-draft and a lookup
accept every candidate (K + 1 tokens a step), a random draft none (1 token a step); the draft's own passes per byte of
its own cache beside the main ones; a class that cannot crop skipped with the release's reason; the loop driver
skipped; a draft with another vocabulary, or none the suite loads, a one-line usage error."""

from __future__ import annotations

import pytest
from kvrun import assert_one_line_usage_error, describe, load_json, output, run_suite

from kvcache.analysing.records import KV, json_schema

pytest.importorskip("torch")
pytest.importorskip("transformers")

TINY = ["-m", "counted", "--kv-model", "tiny", "--kv-baseline", "none"]


def test_assisted_and_prompt_lookup_are_counted_by_phase_with_the_draft_apart(tmp_path):
    out = tmp_path / "run.json"
    done = run_suite(*TINY, "--kv-caches", "dynamic,static,quantized-fp8", "--kv-driver", "generate",
                     "--kv-decoding", "assisted:self:2,assisted:tiny@layers=1:2,prompt-lookup:2",
                     "--benchmark-json", str(out))
    assert done.returncode == 0, describe(done)
    kv = load_json(out)["kv"]
    traffic = kv["traffic"]
    for cache in ("dynamic", "static"):
        own, random, lookup = (traffic[f"{cache}#{s}"] for s in
                               ("assisted:self:2", "assisted:tiny@layers=1:2", "prompt-lookup:2"))
        assert own["tokens_per_step"] == 3 and lookup["tokens_per_step"] == 3, (own, lookup)
        assert random["tokens_per_step"] == 1, random
        assert own["draft"]["acceptance"] == 1 and random["draft"]["acceptance"] == 0, (own, random)
        assert own["draft"]["drafted"] == random["draft"]["drafted"] == lookup["draft"]["drafted"] == 2
        for t in (own, random, lookup):
            phases = t["phases"]
            assert t["passes_per_token"] == pytest.approx(t["passes"] / t["tokens_per_step"]), t
            assert sum(p["passes"] for p in phases.values()) == pytest.approx(t["passes"], abs=1e-6), phases
            assert "scaled_dot_product_attention" in phases["forward"]["by_op"], phases
            assert phases.get("crop", {"passes": 0.0})["passes"] == pytest.approx(0.0, abs=1e-9), phases
        # the draft's cache: a self-draft's is as large as the model's, the one-layer draft's half of it
        assert own["draft"]["bytes_per_token"] == 2 * random["draft"]["bytes_per_token"], (own, random)
        assert own["draft"]["passes"] == pytest.approx(own["phases"]["draft"]["passes"]), own
        assert random["draft"]["passes"] == pytest.approx(2 * random["phases"]["draft"]["passes"]), random
        assert lookup["draft"].get("passes") is None and lookup["draft"].get("cache") is None, lookup
        assert own["draft"]["cache"] == "DynamicCache", own  # generate's own for the assistant, whatever the class
    for key in ("dynamic#assisted:self:2", "static#prompt-lookup:2"):  # the probe: the verifying forward
        seen = kv["probe"][key]  # 1 + K queries, a mask, K/V repeated to every query head (the forward's reshape)
        assert seen["query"][2] == 3 and seen["mask"][-2] == 3 and seen["attention"].startswith("expanded"), seen
    skipped = {s["cache"]: s["reason"] for s in kv["skipped"]}
    for strategy in ("assisted:self:2", "prompt-lookup:2"):
        assert "cannot crop" in skipped[f"quantized-fp8#{strategy}"], skipped
        assert "Assisted decoding requires a cache that can be cropped" in skipped[f"quantized-fp8#{strategy}"]
    assert "decoding dynamic#assisted:self:2:" in output(done), describe(done)
    doc = load_json(out)  # the records know the draft: the schema validates it, the records give it back
    assert KV.from_json(doc["kv"]).to_json()["traffic"] == doc["kv"]["traffic"]
    jsonschema = pytest.importorskip("jsonschema")
    errors = [e.message for e in jsonschema.Draft202012Validator(json_schema()).iter_errors(doc)]
    assert errors == []


def test_the_loop_driver_skips_speculative_strategies_with_the_reason(tmp_path):
    out = tmp_path / "run.json"
    done = run_suite(*TINY, "--kv-caches", "dynamic", "--kv-decoding", "greedy,prompt-lookup:2",
                     "--benchmark-json", str(out))
    assert done.returncode == 0, describe(done)
    kv = load_json(out)["kv"]
    skipped = {s["cache"]: s["reason"] for s in kv["skipped"]}
    assert "--kv-driver generate" in skipped["dynamic#prompt-lookup:2"], skipped
    assert "dynamic" in kv["traffic"], kv["traffic"]


@pytest.mark.parametrize("value, expected", [
    ("assisted:smollm2-135m:2", ["assisted:smollm2-135m:2", "49152", "2048", "self"]),
    ("assisted:no-such-model:2", ["assisted:no-such-model:2", "no-such-model", "not a preset"]),
])
def test_a_draft_that_cannot_draft_is_a_one_line_usage_error(value, expected):
    done = run_suite(*TINY, "--kv-caches", "dynamic", "--kv-driver", "generate", "--kv-decoding", value)
    assert_one_line_usage_error(done, expected)


def test_prompt_lookup_accepts_the_stated_share_at_every_context(tmp_path):
    """``prompt-lookup:K:P``: the prompt puts a token the model rejects P·K places into the lookup's candidates, so
    every step accepts P·K of them (P·K + 1 tokens a step) at both counted contexts; P = 1 is the plain key."""
    out = tmp_path / "run.json"
    done = run_suite(*TINY, "--kv-caches", "dynamic", "--kv-driver", "generate",
                     "--kv-decoding", "prompt-lookup:4:0.5,prompt-lookup:4:0,prompt-lookup:4:100%",
                     "--benchmark-json", str(out))
    assert done.returncode == 0, describe(done)
    traffic = load_json(out)["kv"]["traffic"]
    assert set(traffic) == {"dynamic#prompt-lookup:4:0.5", "dynamic#prompt-lookup:4:0", "dynamic#prompt-lookup:4"}
    for key, accepted in (("dynamic#prompt-lookup:4:0.5", 2), ("dynamic#prompt-lookup:4:0", 0),
                          ("dynamic#prompt-lookup:4", 4)):
        t = traffic[key]
        assert t["tokens_per_step"] == accepted + 1, (key, t)
        assert t["draft"]["drafted"] == 4 and t["draft"]["acceptance"] == accepted / 4, (key, t["draft"])
        assert t["passes_per_token"] == pytest.approx(t["passes"] / (accepted + 1)), (key, t)
