"""The README keeps up with the code: its registration example works as written (a user's cache class plugs in
without editing the project: taken from README.md, loaded with ``-p`` and counted), and its Options table lists
exactly the ``--kv-*`` options the plugin registers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from kvrun import environment

from kvcache import plugin

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
    done = subprocess.run(cmd, cwd=ROOT, env=environment([tmp_path]), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "counted mine: 3.000 passes" in done.stdout


def readme_options() -> set[str]:
    """Every ``--kv-*`` named in the first column of the README's Options table."""
    section = (ROOT / "README.md").read_text().split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `--")]
    return {name for row in rows for name in re.findall(r"`(--kv-[a-z0-9-]+)`", row.split("|")[1])}


class OptionRecorder:
    """Stands in for pytest's parser and its option group: records the names ``pytest_addoption`` adds."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def getgroup(self, *args, **kwargs) -> OptionRecorder:
        return self

    def addoption(self, *names, **kwargs) -> None:
        self.names.update(names)


def test_readme_options_table_lists_every_plugin_option():
    registered = OptionRecorder()
    plugin.pytest_addoption(registered)
    assert {"--kv-seed", "--kv-strict", "--kv-model"} <= registered.names
    documented = readme_options()
    assert not registered.names - documented, f"not in the README's Options table: {registered.names - documented}"
    assert not documented - registered.names, f"in the table, not an option: {documented - registered.names}"
