"""``kvcache ab`` end to end on the tiny model: an A/B (items paired ABBA, both sides' runs, verdicts in the allowed
set, read back by compare; B the layout twin, same counted bytes) whose B worker is killed before its last item (the
finished pairs kept, the failed side named), and bad input (a side that cannot import the suite, sides that differ
in dtype). Nothing here depends on timing: the driver's clock ticks (``tests/abdriver.py``), so each side's seconds
alone in an item are readings of it, and the verdicts are only checked to be verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.abdriver import command
from tests.kvrun import ROOT, environment

PLUGINS = Path(__file__).resolve().parent / "plugins"
COMMON = ["--", "--kv-model", "tiny", "--kv-contexts", "256,512", "--kv-steps", "3", "--kv-warmup", "1",
          "--kv-copy-mib", "8", "--kv-caches", "dynamic", "--kv-counted-contexts", "64,128"]
STATUSES = {"pass", "regression", "improvement", "inconclusive"}


def kvcache_ab(tmp_path: Path, *args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = command("--out-dir", str(tmp_path / "logs"), *args)
    return subprocess.run(cmd, cwd=cwd, env=environment([PLUGINS]), capture_output=True, text=True, timeout=timeout)


def test_an_ab_run_pairs_every_item_abba_and_a_worker_killed_at_the_end_keeps_every_finished_pair(tmp_path):
    """One run for three checks (CI time): side B is gate power's layout twin (``dynamic`` kept token-major, handed
    to attention as transposed views: the counted bytes of DynamicCache, 4 more view ops a layer), and it kills
    itself when its drift re-measurement starts (the last item)."""
    out = tmp_path / "ab.json"
    done = kvcache_ab(tmp_path, "--json", str(out), "--b-args", "-p kv_ab_die -p kvcache.testing.twin_layout",
                      "--b-env", "KV_AB_DIE_AT=test_drift", *COMMON, "--kv-rounds", "1", "--kv-ledger-steps", "3")
    assert done.returncode == 1, (done.stdout[-1500:], done.stderr[-1500:])  # the overhead regression, exact
    doc = json.loads(out.read_text())
    run = doc["ab_run"]
    assert run["failed"] == ["b"] and "test_drift" in run["sides"]["b"]["failed"] and "side B failed" in done.stdout
    kept = [p["item"] for p in run["pairs"]]
    assert len(kept) == run["items"] - 1 and not any("test_drift" in item for item in kept)
    paired = [p for p in run["pairs"] if p["first"] is not None]
    assert [p["first"] for p in paired] == ["a", "b"] * (len(paired) // 2) + ["a"] * (len(paired) % 2)  # ABBA
    assert any("test_ledger" in item for item in kept) and any("copy_bandwidth" in item for item in kept)
    assert all(set(p["seconds"]) == {"a", "b"} for p in run["pairs"])  # each side's wall time per item
    timed = [p for p in run["pairs"] if "test_decode[" in p["item"] or "test_ledger[" in p["item"]]
    assert timed and all(min(p["seconds"].values()) > 0 for p in timed)  # each stopped at its stages: measured alone
    assert set(run["phase_seconds"]) == {"start", "drive", "finish", "judge"}
    assert doc["kv"]["points"] and doc["side_a"]["kv"]["points"]  # both sides' whole runs, B's kept
    assert doc["kv"]["session"]["interrupted"] is True and doc["kv"]["ledger_points"]
    verdicts = doc["ab"]["dynamic"]
    for measure in ("timed", "intercept"):
        assert verdicts[measure]["status"] in STATUSES and "ratio_ci" in verdicts[measure]
    assert verdicts["counted"]["status"] == "pass" and verdicts["overhead"]["status"] == "regression"
    by_op = [{op: round(v, 2) for op, v in kv["traffic"]["dynamic"]["by_op"].items() if v}
             for kv in (doc["side_a"]["kv"], doc["kv"])]
    assert by_op[0] == by_op[1] == {"cat": 2.0, "scaled_dot_product_attention": 1.0}  # no counted byte added
    assert "B/A [interval]" in done.stdout
    compared = subprocess.run([sys.executable, "-m", "kvcache.cli", "compare", str(out)], cwd=ROOT,
                              capture_output=True, text=True, env=environment())
    assert compared.returncode == 1 and f"{out.name}[A]" in compared.stdout, compared.stderr  # B's +4 ops a layer


def test_a_side_that_cannot_import_the_suite_is_one_line_before_measuring(tmp_path):
    broken = tmp_path / "broken" / "kvcache"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this side has no kvcache')\n")
    done = kvcache_ab(tmp_path, "--b-env", f"PYTHONPATH={broken.parent}", *COMMON, cwd=tmp_path)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("kvcache ab:")]
    assert len(lines) == 1 and "side B cannot run the suite" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_sides_that_differ_in_dtype_are_refused_and_bad_options_are_one_line(tmp_path):
    done = kvcache_ab(tmp_path, "--b-args", "--kv-dtype float32", *COMMON)
    assert done.returncode == 2 and "differ in dtype" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    for args, words in ((["--a-env", "NOEQUALS"], "NAME=VALUE"), (["--tolerance", "x"], "--tolerance"),
                        (["--", "--kv-update-baseline"], "not allowed"), (["--b-release", "5.x"], "--b-release")):
        bad = kvcache_ab(tmp_path, *args)
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr

