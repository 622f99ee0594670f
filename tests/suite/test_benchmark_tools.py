"""pytest-benchmark's own command-line tool (``pytest-benchmark compare``, the client users already have) on a run file
of the suite: every timed benchmark (decode, drift, re-measured) carries plain params (``cache``, ``context``,
``round``, ``attention``), so ``--group-by=param:<name>``, ``--csv`` and ``--histogram`` work; the same file still
loads in ``kvcache compare`` and ``kvcache report``.

One short timed run on ``tiny`` (two classes, 3 contexts, 1 round, 3 steps, one re-measured point, no ledger), the
tool run from a directory outside the project (it imports a ``conftest.py`` of its working directory). Nothing here
asserts on timing (``--kv-no-gate``)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from kvrun import describe, environment, output, run_suite

pytest.importorskip("torch")
pytest.importorskip("transformers")

CACHES = ("dynamic", "static")
CONTEXTS = (64, 128, 256)
SHORT = ("--kv-model", "tiny", "--kv-caches", ",".join(CACHES), "--kv-contexts", ",".join(map(str, CONTEXTS)),
         "--kv-rounds", "1", "--kv-steps", "3", "--kv-warmup", "1", "--kv-copy-mib", "8", "--kv-no-gate",
         "--kv-remeasure", "1", "--kv-ledger-steps", "0")
PARAMS = ("cache", "context", "round", "attention")


@pytest.fixture(scope="module")
def run_file(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("tools")
    path = tmp / "run.json"
    done = run_suite(*SHORT, "--kv-baseline", "none", "--benchmark-json", str(path))
    assert done.returncode == 0, describe(done)
    return path


def tool(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``pytest-benchmark ARGS`` (its console script's module), in ``cwd``."""
    return subprocess.run([sys.executable, "-m", "pytest_benchmark", *args], cwd=cwd, env=environment(),
                          capture_output=True, text=True, timeout=120)


def test_every_benchmark_carries_plain_params(run_file):
    text = run_file.read_text()
    assert "UNSERIALIZABLE" not in text
    benchmarks = json.loads(text)["benchmarks"]
    kinds = {b["extra_info"]["kind"] for b in benchmarks}
    assert {"timed", "drift"} <= kinds and any(b["extra_info"].get("remeasured") for b in benchmarks), kinds
    for bench in benchmarks:
        info = bench["extra_info"]
        assert bench["params"] == {"cache": info["cache"], "context": info["context"], "round": info["round"],
                                   "attention": "sdpa"}, bench["name"]
    assert {(b["params"]["cache"], b["params"]["context"]) for b in benchmarks if b["extra_info"]["kind"] == "timed"} \
        == {(c, n) for c in CACHES for n in CONTEXTS}


@pytest.mark.parametrize("param", PARAMS)
def test_compare_groups_by_each_param(run_file, tmp_path, param):
    done = tool(tmp_path, "compare", str(run_file), f"--group-by=param:{param}")
    assert done.returncode == 0, describe(done)
    assert "Traceback" not in output(done), describe(done)
    if param == "cache":
        for cache in CACHES:
            assert f"cache={cache}" in done.stdout, describe(done)


def test_compare_writes_csv_grouped_by_cache(run_file, tmp_path):
    done = tool(tmp_path, "compare", str(run_file), "--group-by=param:cache", "--csv", "table.csv")
    assert done.returncode == 0, describe(done)
    with open(tmp_path / "table.csv", newline="") as f:
        rows = list(csv.reader(f))
    names = [row[0] for row in rows[1:] if row]
    assert len(names) == len(json.loads(run_file.read_text())["benchmarks"]), rows
    assert any(name.endswith("test_decode[dynamic-64]") for name in names), names
    assert not any("UNSERIALIZABLE" in cell for row in rows for cell in row), rows


def test_compare_draws_histograms(run_file, tmp_path):
    pytest.importorskip("pygal", reason="--histogram needs pytest-benchmark[histogram] (pygal, pygaljs)")
    pytest.importorskip("pygaljs", reason="--histogram needs pytest-benchmark[histogram] (pygal, pygaljs)")
    done = tool(tmp_path, "compare", str(run_file), "--group-by=param:cache", "--histogram", "hist")
    assert done.returncode == 0, describe(done)
    drawn = sorted(p.name for p in tmp_path.glob("hist*.svg"))
    assert len(drawn) == len(CACHES), (drawn, describe(done))


def test_the_run_file_still_loads_in_kvcache_compare_and_report(run_file, tmp_path):
    compared = subprocess.run([sys.executable, "-m", "kvcache.cli", "compare", str(run_file), str(run_file)],
                              cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=120)
    assert compared.returncode == 0, describe(compared)
    assert "dynamic" in compared.stdout and "static" in compared.stdout, describe(compared)
    reported = subprocess.run([sys.executable, "-m", "kvcache.cli", "report", str(run_file), "--out",
                               str(tmp_path / "report")], cwd=tmp_path, env=environment(), capture_output=True,
                              text=True, timeout=120)
    assert reported.returncode == 0, describe(reported)
    assert (tmp_path / "report" / "report.md").is_file(), describe(reported)
