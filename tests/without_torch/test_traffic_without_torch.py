"""``kvcache traffic`` where torch (or Transformers) is not installed: one line naming the missing package and how to
install it, exit 2, never a traceback. Simulated with ``sys.modules[name] = None`` in a subprocess (the import then
fails as it does where the package is absent), so it holds with torch installed too."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("missing", ["torch", "transformers"])
def test_traffic_without_a_measuring_package_is_one_line_and_exit_2(missing):
    # the first package missing is named: in CI's environment without torch that is torch whatever is simulated
    named = next(n for n in ("torch", "transformers") if n == missing or importlib.util.find_spec(n) is None)
    code = (f"import sys; sys.modules[{missing!r}] = None; from kvcache.cli import main; "
            "sys.exit(main(['traffic', '--model', 'tiny']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    line = done.stderr.strip()
    assert line.startswith(f"kvcache traffic: {named} is not installed"), line
    assert "pip install" in line and "'.[bench]'" in line, line
    assert done.stdout == ""


def test_a_traffic_run_that_counted_nothing_is_not_measured(capsys):
    """Every class skipped (offloaded on a machine without CUDA, a class whose package is missing): exit 3, the
    skips and their reasons on one stderr line; one class counted is a pass. No torch: the decision is on the
    classes' outcomes."""
    from kvcache import exits
    from kvcache.commands.traffic import exit_status

    skipped = {"offloaded": {"skipped": "offloaded runs on cuda only, not cpu"},
               "quantized-quanto": {"skipped": "needs optimum-quanto (pip install optimum-quanto)"}}
    assert exit_status(skipped) == exits.NOT_MEASURED == 3
    err = capsys.readouterr().err
    assert err == ("kvcache traffic: nothing measured, every class was skipped (offloaded: offloaded runs on cuda "
                   "only, not cpu; quantized-quanto: needs optimum-quanto (pip install optimum-quanto))\n")
    assert exit_status({**skipped, "dynamic": {"traffic": {}, "probe": None}}) == exits.PASS
    assert capsys.readouterr().err == ""
    assert exit_status({"x\x1b[2J": {"skipped": "\r"}}) == 3
    assert capsys.readouterr().err == "kvcache traffic: nothing measured, every class was skipped (x\\x1b[2J: \\r)\n"
