"""The fixtures of tests/fakerun.py against a real run (tests/data/tiny-run.json): re-analysing the recorded run
reproduces what the plugin wrote, and synthetic runs have the recorded run's layout, key for key."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from fakerun import RECORDED_RUN, analysed, make_run, recorded_run

from kvcache.analysing import analysis
from kvcache.analysing.judge import baseline, gate
from kvcache.analysing.records import KV, SCHEMA, load_run


@pytest.fixture(scope="module")
def written():
    """The run as the plugin wrote it."""
    return json.loads(RECORDED_RUN.read_text())


@pytest.fixture(scope="module")
def again():
    """The same run, its kv section computed afresh by the real analysis (the run's own 2000 resamples)."""
    return recorded_run()


def test_recorded_run_is_small_and_real(written):
    assert RECORDED_RUN.stat().st_size < 200_000
    kv = written["kv"]
    assert kv["schema"] == 2 and kv["model"]["name"] == "tiny"  # an older schema: it loads through upgrade_kv
    assert load_run(RECORDED_RUN).record.schema == SCHEMA
    assert kv["settings"]["caches"] == ["dynamic", "static"] and kv["settings"]["contexts"] == [512, 2048, 8192]
    assert kv["traffic"]["dynamic"]["by_op"] == {"cat": 2.0, "scaled_dot_product_attention": 1.0}
    assert len(kv["points"]) == 2 * 3 * 2 and all(len(p["samples_ms"]) == 5 for p in kv["points"])


def test_reanalysis_reproduces_what_the_plugin_wrote(written, again):
    """Same records, settings and seed: the same fits (bootstrap interval included), traffic, points and verdicts."""
    old, new = written["kv"], again["kv"]
    assert set(new) == set(old)
    for key in ("fit", "traffic", "probe", "points", "identity", "copy", "copy_gbps", "skipped", "session"):
        assert new[key] == old[key], key
    assert {c: {m: v["status"] for m, v in ms.items()} for c, ms in new["verdict"].items()} == \
        {c: {m: v["status"] for m, v in ms.items()} for c, ms in old["verdict"].items()}
    # the drift point's own step times are not in the JSON: pytest-benchmark's times of the same steps stand in
    assert (new["drift"]["cache"], new["drift"]["context"]) == (old["drift"]["cache"], old["drift"]["context"])
    assert new["drift"]["last_ms"] == pytest.approx(old["drift"]["last_ms"], rel=0.05)


def test_synthetic_runs_have_the_recorded_layout(written):
    """make_run writes every key the plugin writes, in the same places (kv.points only when asked for)."""
    real, fake = written, make_run(points=True, memory=True)
    assert set(fake["kv"]) == set(real["kv"])
    real_kv, fake_kv = real["kv"], fake["kv"]
    assert set(fake_kv["settings"]) == set(real_kv["settings"])
    assert set(fake_kv["environment"]) == set(real_kv["environment"])
    assert set(fake_kv["model"]) == set(real_kv["model"])
    assert set(fake_kv["identity"]) == set(real_kv["identity"])
    assert set(fake_kv["session"]) == set(real_kv["session"])
    assert set(fake_kv["copy"]) == set(real_kv["copy"])
    assert set(fake_kv["copy"]["measurements"][0]) == set(real_kv["copy"]["measurements"][0])
    assert set(fake_kv["traffic"]["dynamic"]) == set(real_kv["traffic"]["dynamic"])
    assert set(fake_kv["traffic"]["dynamic"]["by_op"]) == set(real_kv["traffic"]["dynamic"]["by_op"])
    assert set(fake_kv["probe"]["dynamic"]) == set(real_kv["probe"]["dynamic"])
    assert fake_kv["probe"]["dynamic"]["attention"] == real_kv["probe"]["dynamic"]["attention"]
    measures = {"counted", "timed", "overhead", "intercept", "ledger", "memory"}
    assert set(fake_kv["verdict"]["dynamic"]) == set(real_kv["verdict"]["dynamic"]) == measures
    assert set(fake_kv["verdict"]["dynamic"]["counted"]) == set(real_kv["verdict"]["dynamic"]["counted"])
    assert set(fake_kv["points"][0]) == set(real_kv["points"][0])
    assert set(fake_kv["drift"]) == set(real_kv["drift"])
    assert set(fake_kv["fit"]["dynamic"]) <= set(real_kv["fit"]["dynamic"])  # the written-down line: its core keys
    timed = [b for b in real["benchmarks"] if b["extra_info"].get("kind") == "timed"]
    assert set(fake["benchmarks"][0]["extra_info"]) == set(timed[0]["extra_info"])
    assert set(fake["benchmarks"][0]) <= set(timed[0]) and set(fake["benchmarks"][0]["stats"]) <= set(timed[0]["stats"])
    assert set(analysed(fake)["kv"]) == set(real_kv)


def test_a_synthetic_run_with_points_reads_like_one_without(tmp_path):
    with_points, plain = tmp_path / "points.json", tmp_path / "plain.json"
    with_points.write_text(json.dumps(make_run(points=True)))
    plain.write_text(json.dumps(make_run()))
    from_points, from_benchmarks = load_run(with_points).points, load_run(plain).points
    def timing(p):  # kv.points adds the achieved bandwidth, which a benchmarks[] entry does not hold
        return replace(p, samples_s=(), achieved_gbps=None, achieved_fraction=None)

    assert [timing(p) for p in from_points] == [timing(p) for p in from_benchmarks]
    for a, b in zip(from_points, from_benchmarks):
        assert a.samples_s == pytest.approx(b.samples_s, rel=1e-12)  # ms and back


def test_relabelled_recorded_run(again):
    other = recorded_run(transformers="5.25.0", device_name="cpu: another machine", resamples=200)
    assert other["kv"]["environment"]["transformers"] == "5.25.0"
    assert other["kv"]["identity"]["device_name"] == "cpu: another machine"
    assert other["kv"]["traffic"] == again["kv"]["traffic"]


def test_planted_counted_rise_is_judged_a_regression_naming_the_op(tmp_path, again):
    """A recorded run with +2 counted passes planted in dynamic, judged against the recorded run as baseline."""
    path = tmp_path / "baseline.json"
    baseline.record(path, KV.from_json(again["kv"]), "2026-11-29T00:00:00")
    planted = recorded_run(counted={"dynamic": 5.0}, resamples=200, baseline=baseline.load(path))
    verdict = planted["kv"]["verdict"]["dynamic"]["counted"]
    assert verdict["status"] == "regression", verdict
    assert verdict["grew"] == {"clone": pytest.approx(2.0)}
    assert planted["kv"]["verdict"]["static"]["counted"]["status"] == "pass"
    lines = gate.failures(KV.from_json(planted["kv"]).verdict)
    assert lines == [f"kv-cache regression: dynamic counted: {verdict['reason']}"]
    fewer = recorded_run(counted={"dynamic": 1.5}, resamples=200, baseline=baseline.load(path))
    assert fewer["kv"]["traffic"]["dynamic"]["by_op"] == {"cat": 1.0, "scaled_dot_product_attention": 0.5}
    assert fewer["kv"]["verdict"]["dynamic"]["counted"]["status"] == "pass"
    assert analysis.gate_failures(KV.from_json(fewer["kv"])) == []
