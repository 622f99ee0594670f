"""pytest-benchmark's own saving and comparing on the suite: two runs on the same machine compare without the
``machine_info`` warning, and a ``--benchmark-storage`` outside the working directory works (saving, comparing,
and comparing against a run from another machine, which warns but must not crash).

Three short timed runs on ``tiny`` (3 contexts, 1 round, 3 steps), one after another into one storage folder
in the temporary directory, outside the project. Nothing here asserts on timing (``--kv-no-gate``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvrun import ROOT, check_short_fit, describe, output, run_suite

pytest.importorskip("torch")
pytest.importorskip("transformers")

SHORT = ("--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-contexts", "64,128,256", "--kv-rounds", "1",
         "--kv-steps", "3", "--kv-warmup", "1", "--kv-copy-mib", "8", "--kv-no-gate")
WARNING = "machine_info"  # pytest-benchmark's "Benchmark machine_info is different. ..."


class Runs:
    """first: autosave; second: autosave and compare with the first; foreign: compare with a saved run whose
    machine_info was changed (another machine)."""

    def __init__(self, tmp: Path) -> None:
        self.storage = tmp / "storage"
        common = (*SHORT, "--kv-baseline", "none",
                  "--benchmark-storage", self.storage.as_uri())
        self.first = run_suite(*common, "--benchmark-autosave")
        self.saved_first = self.saved()
        self.second = run_suite(*common, "--benchmark-autosave", "--benchmark-compare")
        self.machine_infos = [json.loads(p.read_text())["machine_info"] for p in self.saved()]
        self.foreign = None
        if len(self.saved()) == 2:
            first = self.saved_first[0]
            doc = json.loads(first.read_text())
            doc["machine_info"]["node"] = "another-machine"
            first.write_text(json.dumps(doc))
            self.foreign = run_suite(*common, "--benchmark-compare=0001")

    def saved(self) -> list[Path]:
        return sorted(self.storage.rglob("*.json"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("interop")
    assert not tmp.resolve().is_relative_to(ROOT.resolve())  # the storage must lie outside the working directory
    return Runs(tmp)


def test_storage_outside_the_working_directory(runs):
    for done in (runs.first, runs.second):
        assert done.returncode == 0, describe(done)
        assert "INTERNALERROR" not in output(done), describe(done)
    assert len(runs.saved_first) == 1, describe(runs.first)
    assert len(runs.saved()) == 2, describe(runs.second)
    assert "Comparing against benchmarks from" in output(runs.second) or "0001_" in output(runs.second)


def test_same_machine_compares_without_machine_info_warning(runs):
    done = runs.second
    assert done.returncode == 0, describe(done)
    assert WARNING not in output(done), describe(done)
    first, second = runs.machine_infos
    assert first == second
    assert first["kv_environment"]["device_type"] == "cpu"  # the device and library facts stay


def test_another_machine_warns_without_crashing(runs):
    """A real difference is still reported; with the storage outside the working directory pytest-benchmark
    5.3.1 crashes while writing that warning (its storage ``location`` is relative to the cwd)."""
    done = runs.foreign
    assert done is not None, describe(runs.second)
    assert done.returncode == 0, describe(done)
    assert "INTERNALERROR" not in output(done), describe(done)
    assert "Benchmark machine_info is different" in output(done), describe(done)
    assert "another-machine" in output(done)


def test_saved_run_has_the_timed_fit(runs):
    """A saved run (without ``--benchmark-save-data``, without ``--benchmark-json``) still carries the timed
    fit: the analysis uses every step, not the saved file's stripped statistics. Three 3-step points on a
    tiny model are noise, so the line may come out flat or falling: then the fit says so (an error, judged
    inconclusive), and it is still the fit of every point."""
    doc = json.loads(runs.saved()[-1].read_text())
    fit = doc["kv"]["fit"].get("dynamic") or {}
    check_short_fit(fit, 3)  # 3 contexts x 1 round, each from its own steps
    assert doc["kv"]["verdict"]["dynamic"]["timed"]["status"] != "not-measured"
