"""``--kv-attn``: an attention function the suite never saw, registered through ``AttentionInterface`` by a ``-p``
module from the user's directory, counted exactly beside SDPA on ``tiny`` (prediction: +1.00 pass, ``sum 1.00``);
records keyed ``<cache>@<attention>``; skips with the reason; every bad value a one-line usage error."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvrun import describe, load_json, output, run_batch, run_suite

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PLUGINS = Path(__file__).resolve().parent / "plugins"
USAGE_ERROR = 4


@pytest.mark.skipif(not hasattr(transformers.modeling_utils, "AttentionInterface"),
                    reason="AttentionInterface.register is 4.51+")
def test_a_users_attention_module_is_counted_exactly(tmp_path):
    out = tmp_path / "run.json"
    done = run_suite("-m", "counted", "--kv-model", "tiny", "--kv-caches", "dynamic,static-sliced",
                     "--kv-attn", "sdpa,extra_read", "-p", "kv_extra_read", "--kv-no-gate",
                     "--benchmark-json", str(out), pythonpath=[PLUGINS])
    assert done.returncode == 0, describe(done)
    kv = load_json(out)["kv"]
    sdpa, mine = kv["traffic"]["dynamic"], kv["traffic"]["dynamic@extra_read"]
    assert mine["passes"] == pytest.approx(sdpa["passes"] + 1.0, abs=1e-6), mine
    assert mine["by_op"]["sum"] == pytest.approx(1.0, abs=1e-6), mine
    assert "counted dynamic@extra_read: 4.000 passes" in output(done), describe(done)
    skipped = {s["cache"]: s["reason"] for s in kv["skipped"]}
    assert "brings its own attention" in skipped["static-sliced@extra_read"], skipped
    assert "static-sliced" in kv["traffic"]  # its own attention, under its own name


def test_bad_attention_values_are_one_line_usage_errors():
    cases = {"unknown": ["--kv-attn", "sdpa,nonsense"], "empty": ["--kv-attn", ","],
             "in-caches": ["--kv-caches", "dynamic@nonsense"]}
    results = run_batch({name: ["-m", "counted", "--kv-model", "tiny", *args] for name, args in cases.items()})
    for done in results.values():
        assert done.returncode == USAGE_ERROR, describe(done)
        errors = [line for line in output(done).splitlines() if line.startswith("ERROR")]
        assert len(errors) == 1 and "Traceback" not in output(done), describe(done)
    assert "'nonsense'" in output(results["unknown"]) and "eager" in output(results["unknown"])
