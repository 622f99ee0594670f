"""The memory gate end to end: a leaking cache class the suite never saw, brought in by a plug-in (``-p kv_leaks``,
registered through :func:`kvcache.caches.register_cache`), judged against a baseline that holds DynamicCache's
figures for it: its counted passes and overhead pass, its memory fails the build, naming held passes."""

from __future__ import annotations

import json
from pathlib import Path

from kvrun import ROOT, run_suite

PLUGINS = Path(__file__).resolve().parent / "plugins"


def test_a_leak_fails_the_memory_gate_while_its_passes_pass(tmp_path):
    doc = json.loads((ROOT / "kv-baseline.json").read_text())
    for key in ("cpu | tiny | bfloat16", *(k for k in doc["devices"] if k.startswith("cpu | tiny | bfloat16 | torch"))):
        doc["devices"][key]["leak-previous"] = dict(doc["devices"][key]["dynamic"])  # the clean class's figures
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(doc))
    result = run_suite("-m", "counted", "--kv-model", "tiny", "--kv-caches", "leak-previous", "-p", "kv_leaks",
                       "--kv-baseline", str(baseline), "--benchmark-json", str(tmp_path / "run.json"),
                       pythonpath=[PLUGINS])
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    kv = json.loads((tmp_path / "run.json").read_text())["kv"]
    verdict = kv["verdict"]["leak-previous"]
    assert verdict["counted"]["status"] == "pass" and verdict["overhead"]["status"] == "pass"
    assert verdict["memory"]["status"] == "regression"
    assert kv["memory"]["leak-previous"]["held_passes"] == 2.0
    assert "kv-cache regression: leak-previous memory:" in result.stdout
    assert "held passes 2 is above the allowed 1.05" in result.stdout
