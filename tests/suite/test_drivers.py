"""``--kv-driver generate`` with ``--kv-batch 3 --kv-ragged``: one real run of the suite on ``tiny`` (two contexts,
one round, a few steps, a short ledger), shared by every test here, beside a counted-only loop run of the same
batch. Nothing asserts on timing (``--kv-no-gate``)."""

from __future__ import annotations

import pytest
from kvrun import describe, load_json, output, run_suite

from kvcache.analysing.records import KV, json_schema

pytest.importorskip("torch")
pytest.importorskip("transformers")

STEPS = 4
BATCH = ["--kv-batch", "3", "--kv-ragged"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("drivers")
    common = ["--kv-model", "tiny", "--kv-copy-mib", "8", "--kv-no-gate", "--kv-baseline", "none"]
    done = run_suite(*common, *BATCH, "--kv-driver", "generate", "--kv-contexts", "256,384,512", "--kv-rounds", "1",
                     "--kv-steps", str(STEPS), "--kv-warmup", "2", "--kv-ledger-steps", "3",
                     "--benchmark-json", str(tmp / "generate.json"))
    assert done.returncode == 0, describe(done)
    loop = run_suite(*common, *BATCH, "-m", "counted", "--benchmark-json", str(tmp / "loop.json"))
    assert loop.returncode == 0, describe(loop)
    return {"generate": load_json(tmp / "generate.json"), "loop": load_json(tmp / "loop.json"),
            "paths": {"generate": tmp / "generate.json", "loop": tmp / "loop.json"}, "text": output(done)}


def test_generate_points_time_the_steps_asked(runs):
    kv = runs["generate"]["kv"]
    assert kv["settings"]["driver"] == "generate" and kv["settings"]["batch"] == 3 and kv["settings"]["ragged"]
    for cache in ("dynamic", "static"):
        points = [p for p in kv["points"] if p["cache"] == cache]
        assert len(points) == 3
        for p in points:
            assert len(p["samples_ms"]) == STEPS
            assert p["kv_bytes"] < p["kv_bytes_allocated"]  # ragged: the live bytes are fewer than allocated
        assert kv["ledger"][cache], f"no ledger for {cache}"


def test_counted_per_live_and_allocated_byte(runs):
    for run in ("generate", "loop"):
        for cache in ("dynamic", "static"):
            t = runs[run]["kv"]["traffic"][cache]
            assert t["batch"] == {"size": 3, "ragged": True}
            live, allocated = t["passes"], t["allocated_passes"]
            lo, hi = t["contexts"]
            share = ((t["kv_bytes"][str(hi)] - t["kv_bytes"][str(lo)])
                     / (t["allocated_bytes"][str(hi)] - t["allocated_bytes"][str(lo)]))
            assert allocated == pytest.approx(live * share)
            assert share < 1
    # generate adds its own per-step appends (input ids, attention mask): a little more than the loop, per class
    for cache in ("dynamic", "static"):
        assert runs["generate"]["kv"]["traffic"][cache]["passes"] > runs["loop"]["kv"]["traffic"][cache]["passes"]


def test_identity_schema_and_compare(runs):
    jsonschema = pytest.importorskip("jsonschema")
    doc = runs["generate"]
    ident = doc["kv"]["identity"]
    assert (ident["driver"], ident["batch"], ident["ragged"]) == ("generate", 3, True)
    assert "driver" not in runs["loop"]["kv"]["identity"] and runs["loop"]["kv"]["identity"]["batch"] == 3
    jsonschema.Draft202012Validator(json_schema()).validate(doc)
    assert KV.from_json(doc["kv"]).to_json() == doc["kv"]
    assert not [k for k in KV.from_json(doc["kv"]).unknown_keys("kv") if "alloc" in k or "batch" in k]
    import subprocess
    import sys
    paths = [str(runs["paths"][k]) for k in ("loop", "generate")]
    refused = subprocess.run([sys.executable, "-m", "kvcache.cli", "compare", *paths], capture_output=True, text=True)
    assert refused.returncode != 0 and "differ in driver" in refused.stderr
    shown = subprocess.run([sys.executable, "-m", "kvcache.cli", "compare", *paths, "--allow-mismatch"],
                           capture_output=True, text=True)
    assert "dynamic" in shown.stdout and "counted passes" in shown.stdout
