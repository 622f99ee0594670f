"""The counted overhead gate end to end: a class that adds three tiny ops per layer and no cache traffic keeps
its counted passes, shows +3 ops per layer per step, and fails the build against its clean twin's baseline, on
``tiny`` (what CI gates) and on the default model; the clean twin passes. Counted only: no timing."""

from __future__ import annotations

import json

import pytest
from kvrun import describe, load_json, output, run_batch

pytest.importorskip("torch")
pytest.importorskip("transformers")

TWINS = ["--kv-caches", "twin-clean,twin-extra-ops"]
MODELS = ("tiny", "smollm2-135m")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per model: a run recording the clean twin's baseline, then a run of both twins judged against it (the
    extra-ops twin's entries are the clean twin's, as the gate-power tool plants them)."""
    tmp = tmp_path_factory.mktemp("overhead-gate")
    record = {model: ["-m", "counted", "--kv-model", model, "--kv-caches", "twin-clean", "--kv-update-baseline",
                      "--kv-baseline", str(tmp / f"{model}.json")] for model in MODELS}
    recorded = run_batch(record)
    for model in MODELS:
        assert recorded[model].returncode == 0, describe(recorded[model])
        path = tmp / f"{model}.json"
        doc = json.loads(path.read_text())
        for entries in doc["devices"].values():
            entries["twin-extra-ops"] = dict(entries["twin-clean"])
        path.write_text(json.dumps(doc))
    judge = {model: ["-m", "counted", "--kv-model", model, *TWINS, "--kv-baseline", str(tmp / f"{model}.json"),
                     "--benchmark-json", str(tmp / f"{model}-run.json")] for model in MODELS}
    return tmp, recorded, run_batch(judge)


@pytest.mark.parametrize("model", MODELS)
def test_three_ops_per_layer_fail_the_overhead_gate_and_the_clean_twin_passes(runs, model):
    tmp, recorded, judged = runs
    result = judged[model]
    assert result.returncode == 1, describe(result)
    kv = load_json(tmp / f"{model}-run.json")["kv"]
    clean, extra = kv["traffic"]["twin-clean"], kv["traffic"]["twin-extra-ops"]
    assert extra["passes"] == pytest.approx(clean["passes"], abs=1e-9)  # no cache traffic added
    assert extra["ops_per_step"] - clean["ops_per_step"] == 3 * clean["layers"]
    assert extra["data_ops_per_step"] - clean["data_ops_per_step"] == 3 * clean["layers"]
    verdicts = kv["verdict"]
    assert verdicts["twin-clean"]["overhead"]["status"] == "pass"
    assert verdicts["twin-extra-ops"]["overhead"]["status"] == "regression"
    assert verdicts["twin-extra-ops"]["counted"]["status"] == "pass"
    failing = [line for line in output(result).splitlines() if line.startswith("kv-cache regression")]
    assert len(failing) == 1 and "twin-extra-ops overhead" in failing[0], failing
    n = clean["layers"]
    assert f"sum +{n}" in failing[0] and f"add +{n}" in failing[0] and f"mul +{n}" in failing[0]


def test_the_overhead_baseline_is_kept_per_torch_release(runs):
    tmp = runs[0]
    doc = json.loads((tmp / "tiny.json").read_text())
    overhead = [key for key in doc["devices"] if "torch" in key]
    assert overhead == [f"cpu | tiny | bfloat16 | torch {doc['devices'][overhead[0]]['twin-clean']['torch']}"]
    assert doc["devices"][overhead[0]]["twin-clean"]["ops_per_step"] > 0
