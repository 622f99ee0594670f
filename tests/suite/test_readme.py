"""The README's registration example works as written: a user's cache class plugs in without editing
the project (the example is taken from README.md, loaded with ``-p`` and counted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Your own cache class", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_registration_example_runs(tmp_path):
    (tmp_path / "my_caches.py").write_text(readme_example())
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-p", "my_caches", "-m", "counted", "--kv-model", "tiny",
           "--kv-caches", "mine", "--kv-no-gate", "-p", "no:cacheprovider", "-q",
           "--benchmark-json", str(tmp_path / "run.json")]
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "counted mine: 3.000 passes" in done.stdout
