"""Issue 48's counting fixes end to end on ``tiny``, counted only (no timing): against the clean twin's baseline a
class that gathers every K/V row twice fails the counted gate (``gather`` charged for the rows it reads: +4.00), a
class that reads a number back to the host twice per layer fails the overhead gate on host syncs per step, a class
whose step does not grow with context is skipped with the reason (never an assertion error, never in the
baseline), and a class with a declared period reports its passes amortised over the period in the summary."""

from __future__ import annotations

import json

import pytest
from kvrun import describe, load_json, output, run_batch

pytest.importorskip("torch")
pytest.importorskip("transformers")

PLANTED = ("planted-double-gather", "planted-syncs", "planted-fixed-window", "planted-periodic")


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """A run recording twin-clean's baseline, then the planted classes judged against it (their entries are the
    clean twin's, as the gate-power tool plants them)."""
    tmp = tmp_path_factory.mktemp("counting-gates")
    base = tmp / "baseline.json"
    recorded = run_batch({"record": ["-m", "counted", "--kv-model", "tiny", "--kv-caches", "twin-clean",
                                     "--kv-update-baseline", "--kv-baseline", str(base)]})["record"]
    assert recorded.returncode == 0, describe(recorded)
    doc = json.loads(base.read_text())
    for entries in doc["devices"].values():
        for cache in PLANTED:
            entries[cache] = dict(entries["twin-clean"])
    base.write_text(json.dumps(doc))
    result = run_batch({"judge": ["-m", "counted", "--kv-model", "tiny", "--kv-caches", ",".join(PLANTED),
                                  "--kv-baseline", str(base), "--benchmark-json", str(tmp / "run.json")]})["judge"]
    return result, load_json(tmp / "run.json")["kv"]


def test_two_gathers_fail_the_counted_gate_by_the_rows_they_read(judged):
    result, kv = judged
    assert result.returncode == 1, describe(result)
    verdict = kv["verdict"]["planted-double-gather"]["counted"]
    assert verdict["status"] == "regression", verdict
    assert kv["traffic"]["planted-double-gather"]["by_op"]["gather"] == pytest.approx(4.0, abs=0.05)
    lines = [line for line in output(result).splitlines() if line.startswith("kv-cache regression")]
    assert any("planted-double-gather counted" in line and "gather +4.0" in line for line in lines), lines


def test_host_syncs_fail_the_overhead_gate_and_are_summarised(judged):
    result, kv = judged
    traffic = kv["traffic"]["planted-syncs"]
    assert traffic["host_syncs_per_step"] == 4 and traffic["host_syncs"] == {"item": 4}
    overhead = kv["verdict"]["planted-syncs"]["overhead"]
    assert overhead["status"] == "regression" and "host syncs per step 4 is above the allowed 0" in overhead["reason"]
    assert kv["verdict"]["planted-syncs"]["counted"]["status"] == "pass"
    assert "counted planted-syncs: 4 host syncs per step (each makes a GPU's host wait) = item 4" in output(result)


def test_a_step_that_does_not_grow_is_skipped_with_the_reason(judged):
    result, kv = judged
    assert "AssertionError" not in output(result) and "planted-fixed-window" in output(result)
    assert kv["traffic"]["planted-fixed-window"]["passes"] is None
    assert "does not grow with context" in kv["traffic"]["planted-fixed-window"]["not_growing"]
    skips = [s for s in kv["skipped"] if s["cache"] == "planted-fixed-window"]
    assert skips and "does not grow with context" in skips[0]["reason"]
    assert kv["verdict"]["planted-fixed-window"]["counted"]["status"] == "not-measured"


def test_a_declared_period_is_amortised_in_the_summary(judged):
    result, kv = judged
    amortised = kv["traffic"]["planted-periodic"]["amortised"]
    assert amortised["passes"] == pytest.approx(3.5) and amortised["periodic_by_op"] == {"clone": 0.5}
    assert kv["traffic"]["planted-periodic"]["passes"] == pytest.approx(3.5)
    assert ("counted planted-periodic: amortised over 4 steps (period 4, declared): one steady step 3.000 + periodic "
            "0.500 = clone 0.50 per step") in output(result)
    assert kv["verdict"]["planted-periodic"]["counted"]["status"] == "regression"  # 3.5 against the clean 3.0
