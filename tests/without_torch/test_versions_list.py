"""One release list: the Transformers releases of ``.github/workflows/versions.yml``'s matrix are
``scripts/versions.py``'s ``RELEASES``, in the same order (read with a small parser: no YAML package needed)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "versions.yml"


def versions_script():
    spec = importlib.util.spec_from_file_location("versions_list_script", ROOT / "scripts" / "versions.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is made
    spec.loader.exec_module(module)
    return module


def block_list(text: str, *keys: str) -> list[str]:
    """The items of the YAML block list under the nested ``keys`` (``- item`` lines, quotes removed); each key
    is looked for below the previous one. Comments and blank lines are skipped; ValueError if a key is absent."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    start, indent = 0, -1
    for key in keys:
        for i in range(start, len(lines)):
            depth = len(lines[i]) - len(lines[i].lstrip())
            if depth <= indent:  # left the block of the key before
                raise ValueError(f"no {key!r} in {' > '.join(keys)}")
            if lines[i].strip() == f"{key}:":
                start, indent = i + 1, depth
                break
        else:
            raise ValueError(f"no {key!r} in {' > '.join(keys)}")
    items = []
    for line in lines[start:]:
        item = re.match(r"^(\s*)-\s+(.*?)\s*(#.*)?$", line)
        if not item or len(item.group(1)) <= indent:
            break
        items.append(item.group(2).strip("\"'"))
    return items


def test_block_list_reads_nested_items_and_stops_at_the_next_key():
    text = 'a:\n  m:\n    # note\n    t:\n      - "1.0"\n      - \'2.0\'  # newest\n    other: x\n  t:\n    - no\n'
    assert block_list(text, "a", "m", "t") == ["1.0", "2.0"]
    with pytest.raises(ValueError):
        block_list(text, "a", "missing")


def test_the_workflow_matrix_is_the_scripts_release_list():
    releases = versions_script().RELEASES
    matrix = block_list(WORKFLOW.read_text(), "jobs", "measure", "strategy", "matrix", "transformers")
    paste = "\n".join(f'          - "{r}"' for r in releases)
    assert matrix == releases, f"versions.yml's matrix differs from scripts/versions.py RELEASES; its list:\n{paste}"


def test_the_baseline_release_is_in_the_list():
    """The workflow gates counted passes against kv-baseline.json only on BASELINE_RELEASE: it must be measured."""
    found = re.search(r'^\s*BASELINE_RELEASE:\s*"([^"]+)"', WORKFLOW.read_text(), re.M)
    assert found, "no BASELINE_RELEASE in versions.yml"
    assert found.group(1) in versions_script().RELEASES


def test_the_workflows_a_b_runs_under_the_recommended_cpu_timed_configuration():
    """The versions workflow's A/B passes ``options.CPU_TIMED`` as it stands (a workflow cannot import it)."""
    from kvcache.analysing.options import CPU_TIMED

    ab_line = next(line for line in WORKFLOW.read_text().splitlines() if "--out-dir ab-logs --" in line)
    assert " ".join(CPU_TIMED) in ab_line
