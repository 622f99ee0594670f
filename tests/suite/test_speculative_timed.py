"""Timed passes per generated token of a speculative key (issue 46), on ``tiny`` through generate: each timed point
says how many tokens a step gained (a lookup of K = 2 accepts every candidate: 3), and the fit per step over them is
``kv.fit.<cache>.passes_per_token``. The steps' seconds are made up (``-p kv_ab_figures``: a line that grows with the
context), so the fit has a figure on any machine; nothing here asserts on timing."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvrun import describe, load_json, output, run_suite

from kvcache.analysing.records import KV, json_schema

pytest.importorskip("torch")
pytest.importorskip("transformers")

KEY = "dynamic#prompt-lookup:2"
PLUGINS = Path(__file__).resolve().parent / "plugins"


def test_a_lookup_key_times_its_passes_per_generated_token(tmp_path):
    out = tmp_path / "run.json"
    done = run_suite("--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-driver", "generate", "--kv-decoding",
                     "prompt-lookup:2", "--kv-contexts", "128,256,384", "--kv-rounds", "1", "--kv-steps", "3",
                     "--kv-warmup", "1", "--kv-copy-mib", "8", "--kv-ledger-steps", "0", "--kv-no-gate",
                     "--kv-baseline", "none", "-p", "kv_ab_figures", "--benchmark-json", str(out),
                     pythonpath=[PLUGINS])
    assert done.returncode == 0, describe(done)
    doc = load_json(out)
    kv = doc["kv"]
    assert [p["tokens_per_step"] for p in kv["points"]] == [3, 3, 3], kv["points"]
    # the KV bytes a point held: a prompt of c + 1 tokens (the context and the next token), 3 tokens a step, the
    # prefill iteration then 3 timed ones: the sequence's length at their starts, c + 4, c + 7, c + 10, averaged: c + 7
    # (one token a step would say c + 3)
    per_token = kv["model"]["bytes_per_token"]
    assert [p["kv_bytes"] / per_token - p["context"] for p in kv["points"]] == [7, 7, 7], kv["points"]
    fit = kv["fit"][KEY]
    assert fit["tokens_per_step"] == 3, fit
    assert fit["passes_per_token"] == pytest.approx(fit["passes"] / 3), fit
    assert fit["passes_per_token_ci"] == pytest.approx([bound / 3 for bound in fit["passes_ci"]]), fit
    assert kv["traffic"][KEY]["tokens_per_step"] == 3  # the counted iteration gained as many
    assert "timed passes per generated token" in output(done), describe(done)
    assert KV.from_json(kv).to_json() == kv
    jsonschema = pytest.importorskip("jsonschema")
    assert [e.message for e in jsonschema.Draft202012Validator(json_schema()).iter_errors(doc)] == []
