"""A class registered under a name made of terminal controls (``-p kv_hostile``) reaches the suite's terminal
summary shown, never obeyed: every line of it, the counted line, the verdict table and pytest's own, print ESC as
``\\x1b`` and the carriage return as ``\\r`` (:func:`kvcache.analysing.tables.terminal_text`); the run file keeps
the name as it is."""

from __future__ import annotations

import json
from pathlib import Path

from kvrun import run_suite

PLUGINS = Path(__file__).resolve().parent / "plugins"
NAME = "dyn\x1b[2J\x1b[31mamic\rregression: none"  # kv_hostile.NAME


def test_a_hostile_class_name_reaches_the_summary_shown(tmp_path):
    run = tmp_path / "run.json"
    result = run_suite("-m", "counted", "--kv-model", "tiny", "--kv-caches", NAME, "-p", "kv_hostile",
                       "--kv-baseline", "none", "--benchmark-json", str(run), pythonpath=[PLUGINS])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "\x1b" not in result.stdout and "\r" not in result.stdout, result.stdout[-3000:]
    shown = "dyn\\x1b[2J\\x1b[31mamic\\rregression: none"
    assert f"counted {shown}: 3.000 passes" in result.stdout, result.stdout[-3000:]
    assert not any(line.startswith("regression: none") for line in result.stdout.splitlines())
    assert NAME in json.loads(run.read_text())["kv"]["traffic"]  # measured results keep the name
