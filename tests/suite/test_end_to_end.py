"""The whole suite, ``pytest benchmarks ...`` on the ``tiny`` preset: the JSON it writes, runs with
pytest-benchmark disabled or skipped, points beyond the trained context, a failing gate, and a baseline
written and then gated against.

The two timed runs are real ``python -m pytest`` subprocesses; the cheap counted-only runs go through
one more subprocess that runs them one after another as fresh ``pytest.main`` calls (imports once). All
three run alongside each other once per module. Nothing here asserts on timing: timed runs pass
``--kv-no-gate``; the gate is exercised on counted passes, which are exact.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kvrun import check_short_fit, describe, load_json, output, run_batch, run_suite

pytest.importorskip("torch")
pytest.importorskip("transformers")

CONTEXTS = (256, 512, 1024)
SMALL = (128, 256, 512)  # the cheap runs: three contexts, the fewest a timed fit is made from
ROUNDS = 2
STEPS = 5
CACHES = ("dynamic", "static")
TINY_MAX_POSITIONS = 8192


class Runs:
    """Every run of this module, started together on first use."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        none = "none"  # never gate against a baseline lying in the project root
        self.main_json, self.beyond_json = tmp / "main.json", tmp / "beyond.json"
        self.disabled_json, self.skipped_json = tmp / "disabled.json", tmp / "skipped.json"
        self.baseline, self.rerun_json = tmp / "baseline.json", tmp / "rerun.json"
        self.remeasure_json = tmp / "remeasure.json"
        main = ("--kv-model", "tiny", "--kv-contexts", ",".join(map(str, CONTEXTS)), "--kv-steps", str(STEPS),
                "--kv-warmup", "1", "--kv-rounds", str(ROUNDS), "--kv-copy-mib", "32", "--kv-no-gate",
                "--kv-baseline", none, "--benchmark-json", str(self.main_json))
        beyond = ("-m", "timed", "--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-contexts", "8180,8190,8200",
                  "--kv-steps", "3", "--kv-warmup", "0", "--kv-rounds", "1", "--kv-copy-mib", "8", "--kv-no-gate",
                  "--kv-baseline", none, "--benchmark-json", str(self.beyond_json))
        small = ["--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-contexts", ",".join(map(str, SMALL)),
                 "--kv-steps", "3", "--kv-warmup", "0", "--kv-rounds", "1", "--kv-copy-mib", "8", "--kv-no-gate",
                 "--kv-baseline", none]
        counted = ["-m", "counted", "--kv-model", "tiny"]
        batch = {  # run in this order
            "disabled": [*small, "--benchmark-disable", "--benchmark-json", str(self.disabled_json)],
            "skipped": [*small, "--benchmark-skip", "--benchmark-json", str(self.skipped_json)],
            "gate": [*counted, "--kv-caches", "dynamic", "--kv-max-passes", "dynamic=1", "--kv-baseline", none],
            "update": [*counted, "--kv-caches", "dynamic,static", "--kv-update-baseline",
                       "--kv-baseline", str(self.baseline)],
            "rerun": [*counted, "--kv-caches", "dynamic,static", "--kv-baseline", str(self.baseline),
                      "--benchmark-json", str(self.rerun_json)],
            "remeasure": [*small, "-m", "timed", "--kv-rounds", "2", "--kv-remeasure", "1",
                          "--benchmark-json", str(self.remeasure_json)],
        }
        with ThreadPoolExecutor(max_workers=3) as pool:
            futures = {"main": pool.submit(run_suite, *main), "beyond": pool.submit(run_suite, *beyond),
                       "batch": pool.submit(run_batch, batch)}
            self.results = {name: f.result() for name, f in futures.items() if name != "batch"}
            self.results.update(futures["batch"].result())

    def __getitem__(self, name: str):
        return self.results[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("end-to-end"))


@pytest.fixture(scope="module")
def main_run(runs):
    done = runs["main"]
    assert done.returncode == 0, describe(done)
    return load_json(runs.main_json)


def timed(doc: dict) -> list[dict]:
    return [b for b in doc["benchmarks"] if b["extra_info"].get("kind") == "timed"]


# --- the main run ----------------------------------------------------------------------------------------

def test_every_point_is_in_the_json(main_run):
    points = {(b["extra_info"]["cache"], b["extra_info"]["context"], b["extra_info"]["round"]) for b in timed(main_run)}
    assert points == {(c, n, r) for c in CACHES for n in CONTEXTS for r in range(ROUNDS)}
    assert len(timed(main_run)) == len(points)
    drift = [b for b in main_run["benchmarks"] if b["extra_info"].get("kind") == "drift"]
    assert len(drift) == 1
    for bench in timed(main_run):
        assert len(bench["stats"]["data"]) == STEPS


def test_kv_section(main_run):
    kv = main_run["kv"]
    assert kv["copy_gbps"] > 0
    assert [m["label"] for m in kv["copy"]["measurements"]] == ["start", *[f"round-{r}" for r in range(1, ROUNDS)],
                                                                "end"]
    for cache in CACHES:
        fit = kv["fit"][cache]
        check_short_fit(fit, len(CONTEXTS) * ROUNDS)  # tiny's line may fall on a busy machine: then no figure, and why
        # no baseline (the file does not exist): counted has nothing to be judged against; timed either, unless
        # the fit gave no figure, which is inconclusive whatever a baseline says
        assert kv["verdict"][cache]["counted"]["status"] == "no-baseline"
        timed_verdict = kv["verdict"][cache]["timed"]
        if "error" in fit:
            assert timed_verdict["status"] == "inconclusive", timed_verdict
            assert timed_verdict["reason"].startswith(f"no timed passes figure: {fit['error']}"), timed_verdict
        else:
            assert timed_verdict["status"] == "no-baseline", timed_verdict
            assert timed_verdict["value"] == fit["passes"] and timed_verdict["allowed"] is None, timed_verdict
        assert kv["traffic"][cache]["passes"] > 0 and kv["traffic"][cache]["by_op"]
        probe = kv["probe"][cache]
        assert probe["calls"] == 2 and probe["attention"]  # one attention call per layer of tiny
    assert kv["traffic"]["dynamic"]["passes"] == pytest.approx(3.0, abs=0.05)
    assert kv["traffic"]["dynamic"]["by_op"]["cat"] == pytest.approx(2.0, abs=0.02)
    assert isinstance(kv["drift"]["fraction"], float)
    assert {p["cache"] for p in kv["points"]} == set(CACHES) and len(kv["points"]) == len(timed(main_run))
    assert kv["settings"]["caches"] == list(CACHES) and kv["model"]["name"] == "tiny"
    assert "kv_environment" in main_run["machine_info"]


def test_extra_info(main_run):
    env = main_run["kv"]["environment"]
    for bench in timed(main_run):
        info = bench["extra_info"]
        assert info["cache"] in CACHES and info["context"] in CONTEXTS
        assert info["bytes_per_token"] == 2 * 2 * 3 * 64 * 2  # K and V, 2 layers, 3 KV heads, 64 dims, bf16
        assert info["kv_bytes"] == pytest.approx(info["bytes_per_token"] * (info["context"] + 1 + (STEPS + 1) / 2))
        assert info["device"] == "cpu" and info["dtype"] == "bfloat16"
        assert info["transformers"] == env["transformers"] and info["torch"] == env["torch"]
        assert info["beyond_trained_context"] is False
        starts = info["step_start_ns"]
        assert len(starts) == STEPS and all(isinstance(t, int) for t in starts)
        assert all(a < b for a, b in zip(starts, starts[1:])), starts
        assert info["counted_bytes"] > 0
        # one achieved-bandwidth rule: extra_info has the bandwidth, its share of the copy is kv.points' alone
        assert info["achieved_gbps"] > 0 and "achieved_fraction" not in info
    kv = main_run["kv"]
    for point in kv["points"]:
        assert point["achieved_fraction"] == pytest.approx(point["achieved_gbps"] / kv["copy_gbps"])


def test_points_run_in_the_measuring_order(main_run):
    """Round after round (each point's step clock tells when it ran), then the drift re-measurement last."""
    def started(bench: dict) -> int:
        return bench["extra_info"]["step_start_ns"][0]

    in_order = sorted(timed(main_run), key=started)
    assert [b["extra_info"]["round"] for b in in_order] == sorted(b["extra_info"]["round"] for b in in_order)
    drift = next(b for b in main_run["benchmarks"] if b["extra_info"].get("kind") == "drift")
    assert started(drift) > started(in_order[-1])
    first = in_order[0]["extra_info"]
    assert (drift["extra_info"]["cache"], drift["extra_info"]["context"]) == (first["cache"], first["context"])


# --- pytest-benchmark disabled or skipped ------------------------------------------------------------------

def test_benchmark_disable(runs):
    done = runs["disabled"]
    assert done.returncode == 0, describe(done)
    assert "Traceback" not in output(done)
    kv = load_json(runs.disabled_json)["kv"]
    assert kv["traffic"]["dynamic"]["passes"] == pytest.approx(3.0, abs=0.05)
    assert kv["fit"] == {} and kv["verdict"]["dynamic"]["timed"]["status"] == "not-measured"


def test_benchmark_skip(runs):
    done = runs["skipped"]
    assert done.returncode == 0, describe(done)
    assert "Traceback" not in output(done)
    doc = load_json(runs.skipped_json)
    assert doc["benchmarks"] == []
    kv = doc["kv"]
    assert kv["traffic"]["dynamic"]["passes"] == pytest.approx(3.0, abs=0.05)
    assert kv["points"] == [] and kv["copy_gbps"] > 0
    assert "fraction" not in kv["drift"] and kv["drift"]["reason"]


# --- beyond the trained context --------------------------------------------------------------------------

def test_points_beyond_the_trained_context_are_flagged(runs):
    done = runs["beyond"]
    assert done.returncode == 0, describe(done)
    doc = load_json(runs.beyond_json)
    assert doc["kv"]["model"]["max_position_embeddings"] == TINY_MAX_POSITIONS
    flags = {b["extra_info"]["context"]: b["extra_info"]["beyond_trained_context"] for b in timed(doc)}
    # the last step of a point sits at position context + warm-up + steps - 1 (warm-up 0, 3 steps)
    assert flags == {8180: False, 8190: True, 8200: True}
    assert {p["context"]: p["beyond_trained_context"] for p in doc["kv"]["points"]} == flags


# --- the gate ----------------------------------------------------------------------------------------------

def test_gate_failure_exits_1_naming_the_cache_and_the_numbers(runs):
    done = runs["gate"]
    assert done.returncode == 1, describe(done)
    lines = [line for line in output(done).splitlines() if line.startswith("kv-cache regression:")]
    assert len(lines) == 1, describe(done)
    assert lines[0].startswith("kv-cache regression: dynamic counted: counted passes 3 is above the allowed 1; "
                               "by op now: cat 2.00, scaled_dot_product_attention 1.00"), describe(done)
    last = done.stdout.strip().splitlines()[-1]  # pytest's own last line says the gate failed, as its exit does
    assert "1 failed" in last and "1 passed" in last, describe(done)
    assert "FAILED kv-cache gate - kv-cache regression: dynamic counted" in output(done), describe(done)


def test_update_baseline_then_rerun_passes(runs):
    update, rerun = runs["update"], runs["rerun"]
    assert update.returncode == 0, describe(update)
    assert f"baseline written to {runs.baseline}" in output(update)
    baseline = load_json(runs.baseline)
    assert baseline["schema"] == 2
    by_type = baseline["devices"]["cpu | tiny | bfloat16"]
    assert by_type["dynamic"]["counted_passes"] == pytest.approx(3.0, abs=0.05)
    assert by_type["static"]["counted_passes"] == pytest.approx(1.0, abs=0.05)
    assert by_type["dynamic"]["counted_by_op"]["cat"] == pytest.approx(2.0, abs=0.02)
    # counted passes key on the device type, counted overhead on it and the torch release; no timed point ran
    assert [key for key in baseline["devices"] if key != "cpu | tiny | bfloat16"] == [
        key for key in baseline["devices"] if key.startswith("cpu | tiny | bfloat16 | torch ")]
    assert len(baseline["devices"]) == 2
    assert rerun.returncode == 0, describe(rerun)
    verdicts = load_json(runs.rerun_json)["kv"]["verdict"]
    for cache in ("dynamic", "static"):
        counted = verdicts[cache]["counted"]
        assert counted["status"] == "pass", counted
        assert counted["allowed"] == pytest.approx(by_type[cache]["counted_passes"] + 0.05)
        assert verdicts[cache]["overhead"]["status"] == "pass", verdicts[cache]["overhead"]
    assert "kv-cache regression" not in output(rerun)


def test_remeasure_adds_a_round_to_the_noisiest_point(runs):
    """--kv-remeasure 1: after the rounds, the noisiest point is measured once more as round 2, and fitted."""
    assert runs["remeasure"].returncode == 0, describe(runs["remeasure"])
    doc = load_json(runs.remeasure_json)
    again = [b for b in timed(doc) if b["extra_info"].get("remeasured")]
    assert len(again) == 1 and again[0]["extra_info"]["round"] == 2
    assert doc["kv"]["fit"]["dynamic"]["n_points"] == 2 * len(SMALL) + 1


def test_the_ledger_lines_up_time_with_counted_ops(main_run):
    """Profiled steps after the timed rounds: per class, each op the counter names has a timed row with an
    interval, plus the unattributed and whole profiled-step rows; the ledger is judged (no baseline here)."""
    kv = main_run["kv"]
    assert {p["cache"] for p in kv["ledger_points"]} == set(CACHES)
    assert {p["context"] for p in kv["ledger_points"]} == set(CONTEXTS)
    for cache in CACHES:
        rows = kv["ledger"][cache]
        assert set(kv["traffic"][cache]["by_op"]) <= set(rows), rows
        assert {"(unattributed)", "(profiled step)"} <= set(rows)
        assert all(len(row["timed_ci"]) == 2 and row["ms"] >= 0 for row in rows.values())
        assert kv["verdict"][cache]["ledger"]["status"] == "no-baseline"
    profiled = next(p for p in kv["ledger_points"] if p["cache"] == "dynamic")
    assert len(profiled["step_s"]) == kv["settings"]["ledger_steps"] and "cat" in profiled["ops_s"]
    assert all(s > 0 for s in profiled["step_s"])
