"""scripts/field_replays.py on the installed release (no installs, no network): beam search reorders a Mamba's
recurrent state (2.00 passes of it per reorder, since 5.13.0, transformers #46612) and, with optimum-quanto, a
QuantizedCache's quantized states on the next update (since 5.19.0, PR #48700); an unknown replay is a usage error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "field_replays.py"


def child(name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--child", name], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_recurrent_cache_is_reordered_by_beam_search():
    out = child("recurrent")
    assert out["reorder_calls"] == out["beam_steps"] == 6, out
    assert out["state_bytes"] == 81920, out
    assert out["reorder_bytes"] == 6 * (2 * 81920 + 64), out  # each reorder reads and writes the whole state


def test_a_quantized_cache_reorders_its_quantized_states():
    pytest.importorskip("optimum.quanto")
    out = child("quantized")
    assert out["quantized_reordered"] is True and out["generate"] == "ran", out
    assert out["next_update_index_select_bytes"] == 2 * out["quantized_full_precision_bytes"] + 128, out


def test_an_unknown_replay_is_a_usage_error():
    done = subprocess.run([sys.executable, str(SCRIPT), "--replays", "nope"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "unknown replay 'nope'" in done.stderr, done.stderr
