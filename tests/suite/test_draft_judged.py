"""The draft of ``assisted:self:K`` is judged by the session-end gate: ``--kv-update-baseline`` records its passes per
KV byte of the draft's own cache (``draft_passes``) and per generated token (``draft_per_token``) in the key's
counted entry, and a run whose draft moves 2 passes more than that entry fails (exit 1) for the assisted key alone."""

from __future__ import annotations

import json

import pytest
from kvrun import describe, load_json, output, run_suite

pytest.importorskip("torch")
pytest.importorskip("transformers")

SELF = "dynamic#assisted:self:2"
ARGS = ["-m", "counted", "--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-driver", "generate",
        "--kv-decoding", "greedy,beam:2,assisted:self:2"]


def test_a_draft_two_passes_above_its_baseline_fails_the_gate_for_its_key_only(tmp_path):
    baseline = tmp_path / "baseline.json"
    done = run_suite(*ARGS, "--kv-baseline", str(baseline), "--kv-update-baseline")
    assert done.returncode == 0, describe(done)
    doc = json.loads(baseline.read_text())
    (counted,) = [entries for key, entries in doc["devices"].items() if "torch" not in key]
    entry = counted[SELF]
    assert entry["draft_passes"] > 0 and entry["draft_per_token"] == pytest.approx(entry["draft_passes"] / 3)
    assert "draft_passes" not in counted["dynamic"] and "draft_passes" not in counted["dynamic#beam:2"]
    out = tmp_path / "same.json"
    done = run_suite(*ARGS, "--kv-baseline", str(baseline), "--benchmark-json", str(out))
    assert done.returncode == 0, describe(done)
    assert load_json(out)["kv"]["verdict"][SELF]["decoding"]["status"] == "pass"

    entry["draft_passes"] -= 2.0  # the run's draft now moves 2.0 passes of its own cache more than the baseline
    baseline.write_text(json.dumps(doc))
    out = tmp_path / "planted.json"
    done = run_suite(*ARGS, "--kv-baseline", str(baseline), "--benchmark-json", str(out))
    assert done.returncode == 1, describe(done)
    verdicts = load_json(out)["kv"]["verdict"]
    decoding = verdicts[SELF]["decoding"]
    assert decoding["status"] == "regression", decoding
    assert [n for n, p in decoding["parts"].items() if p["status"] == "regression"] == ["draft"], decoding
    assert decoding["reason"].startswith("draft "), decoding
    assert f"kv-cache regression: {SELF} decoding: draft " in output(done), describe(done)
    for key in ("dynamic", "dynamic#beam:2"):
        assert "regression" not in {v["status"] for v in verdicts[key].values()}, verdicts[key]
