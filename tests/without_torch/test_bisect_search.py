"""``kvcache bisect``'s search and judging, with probes made up here (no git, no suite, no torch): which commit it
names, what it skips, when it goes on, which class and figure it follows, and the probe cache."""

from __future__ import annotations

import json

import pytest

from kvcache.analysing import releases
from kvcache.analysing.records import KV, SCHEMA
from kvcache.bisect import plan as bisect_plan
from kvcache.bisect import probing, search, walk
from kvcache.bisect import report as bisect_report
from kvcache.commands import bisect as bisect_cli

LAYERS = 2


def kv(passes: dict[str, float] | None = None, ops: dict[str, int] | None = None, **settings) -> dict:
    """A run's kv section with counted passes (all of it in ``cat`` but 1.00 in attention) and ops per step."""
    passes = passes if passes is not None else {"dynamic": 3.0, "static": 1.0}
    traffic = {}
    for cache, value in passes.items():
        by_op = {"scaled_dot_product_attention": 1.0}
        if value > 1:
            by_op["cat"] = value - 1.0
        count = (ops or {}).get(cache, 132)
        traffic[cache] = {"passes": value, "by_op": by_op, "ops_per_step": count, "calls": {"view": count - 100},
                          "weight_passes": 1.01, "layers": LAYERS}
    return {"schema": SCHEMA, "settings": {"caches": list(passes), "counted_tolerance": 0.05, "ops_tolerance": 0.5,
                         "weight_passes_tolerance": 0.05, **settings},
            "traffic": traffic, "model": {"layers": LAYERS}, "skipped": [],
            "environment": {"transformers": "5.24.0.dev0"}}


class FakeRunner:
    """Probes from a table: index -> kv section, or a string (the reason the commit cannot run)."""

    def __init__(self, table):
        self.table, self.asked = table, []

    def measure(self, item):
        self.asked.append(item.name)
        found = self.table[item.name]
        if isinstance(found, str):
            return probing.ProbeResult(item, reason=found)
        return probing.ProbeResult(item, kv=KV.from_json(found), transformers="5.24.0.dev0")

    def close(self):
        pass


def run(figures, measure="passes", cls=None, cache=None):
    """Bisect over commits ``c0 .. c{n-1}`` after the good end ``g``; ``figures`` maps names to kv sections or skip
    reasons. Returns (exit, json document, lines, runner)."""
    names = [n for n in figures if n != "g"]
    items = [probing.Revision(n, n, f"subject of {n}", "2026-01-01") for n in names]
    runner = FakeRunner(figures)
    plan = walk.Plan((probing.Revision("g", "g"), items[-1]), items, runner,
                           cache or probing.ProbeCache(None, {"options": []}), search.bisect_measures()[measure], cls,
                           "test", [])
    said = []
    bisect = walk.Bisect(plan, said.append)
    result = bisect.run()
    lines, doc = bisect_report.report(bisect, result)
    return result.exit, doc, said + lines, runner


def series(values, skip=()):
    """Figures of dynamic for the good end and c0.. (static stays 1.00); indices in ``skip`` cannot run."""
    table = {"g": kv({"dynamic": values[0], "static": 1.0})}
    for i, value in enumerate(values[1:]):
        table[f"c{i}"] = f"ImportError: broken at c{i}" if i in skip else kv({"dynamic": value, "static": 1.0})
    return table


@pytest.mark.parametrize("first", range(8))
def test_names_the_first_bad_commit_in_about_log2_probes(first):
    values = [3.0] + [3.0 if i < first else 5.0 for i in range(8)]
    code, doc, lines, runner = run(series(values))
    assert code == 0 and doc["first_bad"] == f"c{first}"
    assert doc["before"] == 3.0 and doc["after"] == 5.0 and doc["ops"] == {"cat": 2.0}
    assert doc["parent"] == ("g" if first == 0 else f"c{first - 1}")
    assert len(runner.asked) <= 2 + 3  # the ends, then log2(8)
    assert doc["measure"] == {"name": "counted", "label": "counted passes", "unit": "passes", "class": "dynamic",
                              "tolerance": 0.05}
    assert doc["others"]["static"] == {"good": 1.0, "bad": 1.0, "tolerance": 0.05, "changed": False, "reason": None}
    assert f"first bad commit: c{first}" in lines


def test_a_commit_that_cannot_run_is_skipped_never_blamed():
    values = [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 5.0, 5.0, 5.0]
    code, doc, lines, runner = run(series(values, skip={3}))
    assert code == 0 and doc["first_bad"] == "c5"
    probes = {p["item"]: p for p in doc["probes"]}
    assert probes["c3"]["verdict"] == "skip" and probes["c3"]["reason"] == "ImportError: broken at c3"
    assert runner.asked[:3] == ["g", "c7", "c3"] and runner.asked[3] == "c4"  # the later neighbour of a skip
    assert any("skip: ImportError: broken at c3" in line for line in lines)


def test_only_skipped_commits_left_lists_them_and_exits_3():
    values = [3.0, 3.0, 3.0, 3.0, 5.0, 5.0, 5.0, 5.0, 5.0]
    code, doc, lines, _ = run(series(values, skip={1, 2}))
    assert code == probing.EXIT_AMBIGUOUS and doc["first_bad"] is None
    assert doc["changes"][0]["candidates"] == ["c1", "c2", "c3"]
    assert "first bad commit: one of 3 (the others could not be measured): c1, c2, c3" in lines


def test_a_change_in_two_steps_names_both():
    values = [3.0, 3.0, 4.0, 4.0, 4.0, 4.0, 5.0, 5.0, 5.0]
    code, doc, lines, _ = run(series(values))
    assert code == 0 and doc["first_bad"] == "c1" and doc["accounts_for_all"] is False
    assert [(c["first_bad"], c["before"], c["after"]) for c in doc["changes"]] == [("c1", 3.0, 4.0), ("c5", 4.0, 5.0)]
    assert any("does not account for the whole change: 2 changes found" in line for line in lines)


def test_a_drop_is_bisected_as_well_and_the_other_way_is_said():
    values = [9.0, 9.0, 12.0, 9.0, 9.0, 3.0, 3.0, 3.0, 3.0]  # c1 went up first: taken as good, and noted
    code, doc, _, _ = run(series(values))
    assert code == 0 and doc["first_bad"] == "c4" and doc["before"] == 9.0 and doc["after"] == 3.0
    assert doc["ops"] == {"cat": -6.0}
    noted = [p for p in doc["probes"] if p.get("note")]
    assert all(p["item"] == "c1" for p in noted)


def test_within_the_counted_tolerance_is_no_change_and_exit_1_with_a_hint():
    table = {"g": kv({"dynamic": 3.0, "static": 1.0}), "c0": kv({"dynamic": 3.04, "static": 1.0}),
             "c1": kv({"dynamic": 3.04, "static": 1.0}, ops={"static": 162})}
    code, doc, lines, runner = run(table)
    assert code == 1 and doc["first_bad"] is None and runner.asked == ["g", "c1"]
    assert any("no change in counted passes between the ends: dynamic 3.00 -> 3.04; static 1.00 -> 1.00" in line
               for line in lines)
    assert doc["hint"] == "ATen ops per step of static did change (132 -> 162): --measure ops bisects it"


def test_ops_per_step_follow_the_ops_tolerance_per_layer():
    # +1 op over 2 layers is within 0.5 per layer; +30 is not.
    table = {"g": kv(), "c0": kv(ops={"dynamic": 133}), "c1": kv(ops={"dynamic": 162}), "c2": kv(ops={"dynamic": 162})}
    code, doc, lines, _ = run(table, measure="ops")
    assert code == 0 and doc["first_bad"] == "c1" and doc["measure"]["tolerance"] == 1.0
    assert doc["ops"] == {"view": 29.0}
    assert "  ATen ops per step of dynamic: 133 -> 162 (+29) against its parent c0" in lines


def test_class_follows_the_first_that_changed_or_the_one_asked_for():
    table = {"g": kv({"dynamic": 3.0, "static": 7.0, "quantized": 2.0}),
             "c0": kv({"dynamic": 3.0, "static": 1.0, "quantized": 2.0}),
             "c1": kv({"dynamic": 5.0, "static": 1.0, "quantized": 2.0})}
    code, doc, lines, _ = run(table)  # the run's own order: dynamic first
    assert doc["measure"]["class"] == "dynamic" and doc["first_bad"] == "c1"
    assert doc["others"]["static"]["changed"] is True and doc["others"]["quantized"]["changed"] is False
    assert ("other classes: static 7.00 -> 1.00 (changed too: --class static bisects it); quantized 2.00 -> 2.00 "
            "(unchanged)") in lines
    code, doc, _, _ = run(table, cls="static")
    assert doc["measure"]["class"] == "static" and doc["first_bad"] == "c0" and list(doc["others"]) == [
        "dynamic", "quantized"]
    code, doc, lines, _ = run(table, cls="quantized")
    assert code == 1 and ("no change in counted passes between the ends: quantized 2.00 -> 2.00 (tolerance ±0.05 "
                          "passes)") in lines
    assert doc["hint"] == "counted passes of dynamic did change (3.00 -> 5.00): --class dynamic bisects it"


def test_a_figure_the_runs_do_not_have_is_an_error():
    with pytest.raises(probing.BisectError, match=r"--measure held: no class has memory held passes at both "
                                                     r"ends \(the run has no memory figures \(kv.memory\)\)"):
        run(series([3.0, 5.0]), measure="held")
    table = series([3.0, 5.0])
    for name, held in (("g", 1.0), ("c0", 2.0)):
        table[name]["memory"] = {"dynamic": {"held_passes": held, "allocated_by_op": {"cat": held}}}
    code, doc, _, _ = run(table, measure="held")
    assert code == 0 and doc["first_bad"] == "c0" and not doc["ops"]  # held bytes: no op to name


def test_an_end_that_cannot_be_measured_is_an_error():
    table = {"g": "ImportError: old", "c0": kv()}
    with pytest.raises(probing.BisectError, match="the good end g cannot be measured: ImportError: old"):
        run(table)


def test_probe_cache_round_trip_by_item_and_identity(tmp_path):
    table = series([3.0, 3.0, 5.0, 5.0])
    cache = probing.ProbeCache(tmp_path, {"options": ["--kv-model", "tiny"]})
    run(table, cache=cache)
    assert (tmp_path / cache.identity_hash / "identity.json").is_file()
    code, doc, _, runner = run(table, cache=probing.ProbeCache(tmp_path, {"options": ["--kv-model", "tiny"]}))
    assert runner.asked == [] and all(p["cached"] for p in doc["probes"]) and doc["first_bad"] == "c1"
    other = probing.ProbeCache(tmp_path, {"options": ["--kv-model", "smollm2-135m"]})
    assert other.get(probing.Revision("c0", "c0")) is None  # another identity: its own folder
    probe = probing.ProbeResult(probing.Revision("c9", "c9"), reason="timed out", cacheable=False)
    cache.put(probe)
    assert cache.get(probe.item) is None
    stored = json.loads((tmp_path / cache.identity_hash / "c0.json").read_text())
    assert stored["kv"]["traffic"]["dynamic"]["passes"] == 3.0


def test_search_steps():
    assert search.next_probe(-1, 7, {}) == 3
    assert search.next_probe(-1, 7, {3: search.SKIP}) == 4
    assert search.next_probe(-1, 7, {3: search.GOOD}) == 5
    assert search.next_probe(-1, 7, {3: search.BAD, 1: search.GOOD}) == 2
    assert search.next_probe(-1, 0, {}) is None
    assert search.outcome(-1, 7, {3: search.GOOD, 4: search.SKIP, 5: search.BAD}) == (3, 5, [4])
    assert search.good_or_bad(5.0, 3.0, 5.0, 0.05) == search.BAD
    assert search.good_or_bad(3.05, 3.0, 5.0, 0.05) == search.GOOD  # at the tolerance: unchanged, as the gate judges
    assert search.good_or_bad(None, 3.0, 5.0, 0.05) == search.SKIP
    assert search.good_or_bad(2.0, 3.0, 5.0, 0.05) == search.GOOD and search.moved_away(2.0, 3.0, 5.0, 0.05)
    assert search.op_changes({"cat": 2.0, "x": 1.0}, {"cat": 2.0, "clone": 2.0}) == {"clone": 2.0, "x": -1.0}


def test_failure_reason_is_the_exception_pytest_showed():
    log = ("INTERNALERROR> Traceback\nINTERNALERROR>   File \"x.py\", line 1\n"
           "INTERNALERROR> ImportError: cannot import name 'nope' from 'transformers.utils'\n")
    assert probing.failure_reason(log, 3) == "ImportError: cannot import name 'nope' from 'transformers.utils'"
    assert probing.failure_reason("E   ModuleNotFoundError: No module named 'x'\nERROR x\n", 2) == \
        "ModuleNotFoundError: No module named 'x'"
    assert probing.failure_reason("ERROR: usage: unrecognized arguments: --kv-x\n", 4) == \
        "pytest exited 4: ERROR: usage: unrecognized arguments: --kv-x"


@pytest.mark.parametrize(("given", "read", "note"), [
    ("4.45", "4.45.0", "4.45 is read as 4.45.0"),
    ("v5.23.0", "5.23.0", "v5.23.0 is read as 5.23.0"),
    ("5.22.2", "5.22.2", None),
])
def test_release_numbers_are_read_as_pip_publishes_them(given, read, note):
    assert releases.normalise(given) == (read, note)


@pytest.mark.parametrize("bad", ["5", "5.x", "5.0.0rc1", ""])
def test_release_numbers_that_are_not_refused(bad):
    with pytest.raises(releases.ReleaseError, match="not a final release number"):
        releases.normalise(bad)


def test_release_range_is_checked_before_the_index_is_asked():
    said = []
    assert bisect_plan.release_range("5.22..5.24.0", said.append) == ("5.22.0", "5.24.0")
    assert said == ["--releases: 5.22 is read as 5.22.0"]
    for bad, message in (("5.24.0", "is not a range A..B"), ("5.24.0..5.22.2", "is an empty range"),
                         ("5.24.0..5.24.0", "is an empty range")):
        with pytest.raises(probing.BisectError, match=message):
            bisect_plan.release_range(bad, said.append)


def test_releases_walk_every_published_release_in_the_range_patches_included(monkeypatch, tmp_path):
    listed = ["5.21.1", "5.22.0", "5.22.1", "5.22.2", "5.23.0", "5.23.1", "5.24.0", "5.25.0"]
    monkeypatch.setattr(releases, "published", lambda: listed)
    said = []
    args = bisect_cli.parser().parse_args(["--releases", "5.22..5.24.0", "--cache-dir", str(tmp_path / "c")])
    plan = bisect_plan.make_plan(args, [], tmp_path, said.append)
    assert plan.mode == "releases" and plan.ends[0].name == "5.22.0"
    assert [i.name for i in plan.items] == ["5.22.1", "5.22.2", "5.23.0", "5.23.1", "5.24.0"]
    assert said == ["--releases: 5.22 is read as 5.22.0"] and not (tmp_path / "c").exists()
    args = bisect_cli.parser().parse_args(["--releases", "5.22.3..5.24.0"])
    with pytest.raises(probing.BisectError, match=r"transformers 5.22.3 is not published \(the releases "
                                                     r"around it: 5.22.2, 5.23.0\)"):
        bisect_plan.make_plan(args, [], tmp_path, said.append)
