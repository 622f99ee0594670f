"""A class that hooks the model, in real runs of the suite on ``tiny``: the fake press of
:mod:`kvcache.testing.press` (kvpress-like: keeps half of the prefilled context) counted under the default synthetic
fill is prefilled, says so, and reports 1.50 passes per logical byte and 3.00 per stored byte in the summary (never
dynamic's 3.00 silently); under ``--kv-driver generate`` it is skipped with the reason; a planted press that gathers
the cache twice per step fails the counted gate."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvrun import describe, load_json, output, run_suite

pytest.importorskip("torch")
pytest.importorskip("transformers")

PLUGINS = Path(__file__).resolve().parent / "plugins"


def test_a_press_counted_under_the_default_fill_is_prefilled_and_reports_both_figures(tmp_path):
    out = tmp_path / "run.json"
    done = run_suite("--kv-model", "tiny", "--kv-caches", "dynamic,fake-press", "-m", "counted", "--kv-no-gate",
                     "--benchmark-json", str(out))
    assert done.returncode == 0, describe(done)
    kv = load_json(out)["kv"]
    press = kv["traffic"]["fake-press"]
    assert press["passes"] == pytest.approx(1.5, abs=0.01) and press["stored_passes"] == pytest.approx(3.0, abs=0.01)
    assert press["fill"] == "prefill" and "fill" not in kv["traffic"]["dynamic"]
    assert "fill" not in kv["identity"]  # the run's fill is synthetic; the class says it was prefilled
    text = output(done)
    assert "counted fake-press: 1.500 passes" in text
    assert "counted fake-press: filled by prefill: the class needs a real prefill" in text
    row = next(line for line in text.splitlines() if line.startswith("fake-press ") and "3.000" in line)
    assert row.split() == ["fake-press", "3.000"]  # the figures table: counted passes per stored byte


def test_the_generate_driver_skips_a_press_with_the_reason(tmp_path):
    out = tmp_path / "run.json"
    done = run_suite("--kv-model", "tiny", "--kv-caches", "fake-press", "-m", "counted", "--kv-no-gate",
                     "--kv-driver", "generate", "--benchmark-json", str(out))
    kv = load_json(out)["kv"] if out.exists() else {}
    skipped = [s["reason"] for s in kv.get("skipped", []) if s["cache"] == "fake-press"]
    assert skipped and "hooks the model" in skipped[0] and "uncompressed" in skipped[0], describe(done)
    assert "fake-press" not in kv.get("traffic", {})


def test_a_planted_press_that_gathers_twice_fails_the_counted_gate(tmp_path):
    bounds = "fake-press=1.5,press-twice=1.5"
    done = run_suite("--kv-model", "tiny", "--kv-caches", "fake-press,press-twice", "-m", "counted", "-p",
                     "kv_press_twice", "--kv-baseline", "none", "--kv-max-passes", bounds,
                     "--benchmark-json", str(tmp_path / "run.json"), pythonpath=[PLUGINS])
    assert done.returncode == 1, describe(done)
    kv = load_json(tmp_path / "run.json")["kv"]
    assert kv["verdict"]["fake-press"]["counted"]["status"] == "pass"
    assert kv["verdict"]["press-twice"]["counted"]["status"] == "regression"
    assert "gather" in kv["traffic"]["press-twice"]["by_op"]
    assert any(line.startswith("kv-cache regression: press-twice counted") for line in output(done).splitlines()), \
        describe(done)
