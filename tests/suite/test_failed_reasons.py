"""A class whose count fails is named in ``kv.session.failed`` with the first line of its error in
``kv.session.reasons``, which ``scripts/versions.py``'s table and ``kvcache bisect`` read (not the pytest log)."""

from __future__ import annotations

import json
from pathlib import Path

from kvrun import run_suite

PLUGINS = Path(__file__).parent / "plugins"


def test_a_failed_count_carries_its_reason_into_the_run(tmp_path):
    out = tmp_path / "run.json"
    done = run_suite("-m", "counted", "-p", "kv_boom", "--kv-model", "tiny", "--kv-caches", "dynamic,boom",
                     "--kv-no-gate", "--benchmark-json", str(out), pythonpath=[PLUGINS])
    assert done.returncode == 1, done.stdout[-2000:]
    session = json.loads(out.read_text())["kv"]["session"]
    assert session["failed"] == ["boom"]
    assert "ValueError: boom: this class cannot update" in session["reasons"]["boom"]
