"""``kvcache sentinel`` without a probe: the figures it watches (every family of the table, one that a later schema
adds included, found by being present in a run), which of them moved, the changes it keeps open and those that
recovered, and the workflow's script that keeps one GitHub issue per change (.github/sentinel/issues.sh) through a
stand-in ``gh`` that records its calls and runs the script's own --jq filter with jq. The sentinel on a real
Transformers source tree is tests/suite/test_sentinel.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import ghstub
import pytest
from fakerun import recorded_run

from kvcache.analysing.records import KV
from kvcache.sentinel import figures as figs
from kvcache.sentinel import report

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".github" / "sentinel" / "issues.sh"
SHA_A, SHA_B = "a" * 40, "b" * 40


def kv_with(**planted) -> KV:
    """The recorded tiny run's ``kv``, with ``traffic.<cache>.<field>`` set from ``planted``
    (``dynamic={"gpus": {...}}``)."""
    kv = recorded_run()["kv"]
    for cache, fields in planted.items():
        kv["traffic"][cache].update(fields)
    return KV.from_json(kv)


def test_every_family_is_found_and_a_new_one_joins_by_being_present():
    plain = figs.figures(kv_with())
    assert {"traffic.dynamic.passes", "traffic.static.passes", "traffic.dynamic.ops_per_step",
            "traffic.dynamic.weight_passes"} <= set(plain)
    assert not any(".gpus." in k for k in plain)
    gpus = {"T4": {"passes": 9.0, "by_op": {"reshape": 4.0, "scaled_dot_product_attention": 3.0, "cat": 2.0}},
            "H100": {"passes": 3.0, "by_op": {"cat": 2.0, "scaled_dot_product_attention": 1.0}}}
    found = figs.figures(kv_with(dynamic={"gpus": gpus, "backends": {"math": {"passes": 25.0}}}))
    t4 = found["traffic.dynamic.gpus.T4.passes"]
    assert t4.value == 9.0 and t4.detail["reshape"] == 4.0 and t4.tolerance == pytest.approx(0.05)
    assert t4.label == "counted passes on T4 of dynamic"
    assert found["traffic.dynamic.gpus.H100.passes"].value == 3.0
    assert found["traffic.dynamic.backends.math.passes"].value == 25.0
    assert found["traffic.dynamic.passes"].value == plain["traffic.dynamic.passes"].value


def test_moved_judges_each_figure_with_its_own_tolerance():
    head = figs.figures(kv_with())
    passes, ops = head["traffic.dynamic.passes"], head["traffic.dynamic.ops_per_step"]
    reference = {k: w.value for k, w in head.items()}
    assert figs.moved_figures(reference, head) == []
    near = {**reference, passes.key: passes.value + 0.04, ops.key: ops.value + ops.tolerance}
    assert figs.moved_figures(near, head) == []  # within the counted tolerance (0.05) and the ops tolerance
    far = {**reference, passes.key: passes.value + 0.2, "traffic.gone.passes": 1.0}
    moved = figs.moved_figures(far, head)
    assert [m.key for m in moved] == [passes.key, "traffic.gone.passes"]
    assert moved[1].after is None  # a figure the head no longer has


def change(commit: str | None, figure: str, before: float, after: float) -> dict:
    return {"figure": figure, "label": f"counted passes of {figure.split('.')[1]}", "cache": figure.split(".")[1],
            "measure": "passes", "path": [], "unit": "passes", "tolerance": 0.05, "kind": "changed",
            "commit": commit, "candidates": [], "subject": "Make `x` <b>faster</b> @someone", "date": "2026-01-01",
            "parent": "c" * 40, "before": before, "after": after, "change": after - before, "ops": {"clone": 2.0},
            "reproduce": "kvcache bisect --repo transformers --good c --bad a --model tiny --class dynamic"}


def test_a_figure_back_where_it_was_recovers_its_changes_and_the_later_ones():
    """Two open changes of one figure (3 -> 5 at A, 5 -> 7 at B): the figure back at 3 recovers both; back at 5, only
    B; a step of this run that brought it back is marked recovered, any other opens a change."""
    head = figs.figures(kv_with())
    dyn = head["traffic.dynamic.passes"]
    opened = [change(SHA_A, dyn.key, dyn.value, dyn.value + 2), change(SHA_B, dyn.key, dyn.value + 2,
                                                                        dyn.value + 4)]
    undo = change("d" * 40, dyn.key, dyn.value + 4, dyn.value)
    still, recovered = report.settle(opened, report.Found(steps=[undo], head=head), "e" * 40)
    assert still == [] and [r["commit"] for r in recovered] == [SHA_A, SHA_B]
    assert all(r["recovered_at"] == "d" * 40 for r in recovered) and undo["kind"] == "recovered"
    static = head["traffic.static.passes"]
    other = change("f" * 40, static.key, static.value + 1, static.value)
    still, recovered = report.settle(opened[:1], report.Found(steps=[other], head=head), "e" * 40)
    assert recovered and [s["commit"] for s in still] == ["f" * 40]  # A recovered; the static change is new


def sentinel_json(tmp: Path) -> Path:
    """A sentinel result with one open change (A) and one recovered (B), through the report's own issue bodies."""
    doc = {"kvcache_sentinel": 1, "mode": "commits", "where": "repo x", "branch": "main", "last": "c" * 40,
           "head": "e" * 40, "options": ["--kv-model", "tiny"], "notes": []}
    opened = [{**change(SHA_A, "traffic.dynamic.passes", 3.0, 5.0), "now": 5.0}]
    recovered = [{**change(SHA_B, "traffic.static.passes", 1.0, 7.0), "now": 1.0, "recovered_at": "d" * 40,
                  "recovered_subject": "Revert", "recovered_date": ""}]
    report.fill(doc, report.Found(steps=opened), recovered, opened, 1, [])
    path = tmp / "sentinel.json"
    path.write_text(json.dumps(doc))
    return path


def test_issue_bodies_escape_what_comes_from_a_commit(tmp_path):
    doc = json.loads(sentinel_json(tmp_path).read_text())
    assert [(i["key"], i["state"]) for i in doc["issues"]] == [(SHA_A, "open"), (SHA_B, "closed")]
    body = doc["issues"][0]["body"]
    assert body.startswith(f"<!-- kvcache-sentinel: {SHA_A} -->\n")
    assert "<b>" not in body and "&lt;b&gt;" in body and "@someone" not in body
    assert f"`{SHA_A}`" in body and "| counted passes of dynamic | 3.00 | 5.00 | 5.00 | clone +2.00 |" in body
    assert "kvcache bisect --repo transformers" in body
    assert "**Recovered** at `" + "d" * 40 in doc["issues"][1]["body"]


def run_issues(tmp: Path, doc: Path, existing: list[dict]) -> subprocess.CompletedProcess:
    env = ghstub.clean_environment()
    env.update(PATH=f"{ghstub.install(tmp / 'bin')}:{env.get('PATH', '')}", GH_LOG=str(tmp / "gh.log"),
               GH_COMMENTS=json.dumps(existing))
    return subprocess.run(["bash", str(SCRIPT), "octo/watch", str(doc)], env=env, capture_output=True, text=True,
                          timeout=60)


def writes(tmp: Path) -> list[dict]:
    return [c for c in ghstub.calls(tmp / "gh.log") if "--method" in c["args"]]


def issue(number: int, key: str, pull: bool = False) -> dict:
    found = {"number": number, "body": f"<!-- kvcache-sentinel: {key} -->\nold body"}
    return {**found, "pull_request": {"url": "x"}} if pull else found


def test_a_new_change_opens_an_issue_and_a_recovered_one_without_an_issue_opens_none(tmp_path):
    ghstub.need_jq()
    done = run_issues(tmp_path, sentinel_json(tmp_path), [issue(3, "c" * 40), issue(4, SHA_A, pull=True)])
    assert done.returncode == 0, done.stderr
    made = writes(tmp_path)
    assert [c["args"][:4] for c in made] == [["api", "--method", "POST", "repos/octo/watch/issues"]]
    assert "labels[]=kvcache-sentinel" in made[0]["args"]
    assert made[0]["body"].startswith(f"<!-- kvcache-sentinel: {SHA_A} -->")
    assert "recovered before an issue was opened" in done.stdout


def test_the_issue_of_a_change_is_updated_and_closed_once_it_recovered(tmp_path):
    ghstub.need_jq()
    done = run_issues(tmp_path, sentinel_json(tmp_path), [issue(7, SHA_A), issue(9, SHA_B)])
    assert done.returncode == 0, done.stderr
    made = writes(tmp_path)
    assert [c["args"][:4] for c in made] == [["api", "--method", "PATCH", "repos/octo/watch/issues/7"],
                                             ["api", "--method", "PATCH", "repos/octo/watch/issues/9"]]
    assert "state=open" in made[0]["args"] and "state=closed" in made[1]["args"]
    assert made[1]["body"].startswith(f"<!-- kvcache-sentinel: {SHA_B} -->")


def test_shellcheck_is_clean():
    import shutil

    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (.ci/run installs it)")
    done = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_a_backend_figure_is_watched_labelled_and_bisected_as_its_own_measure():
    """Issue 49 problem 10: the sentinel's backend figures were bisected and labelled as plain counted passes
    ("counted passes of dynamic"; the reproduce command bisected the class's own counted passes)."""
    from kvcache.bisect import search

    found = figs.figures(kv_with(dynamic={"backends": {"math": {"passes": 25.0, "by_op": {"cat": 2.0}}}}))
    math_figure = found["traffic.dynamic.backends.math.passes"]
    assert math_figure.measure.name == "backend:math"
    assert math_figure.label == "counted passes under math of dynamic"
    followed = search.bisect_measures()[math_figure.measure.name]
    kv = kv_with(dynamic={"backends": {"math": {"passes": 25.0, "by_op": {"cat": 2.0}}}})
    assert search.figure_of(kv, followed, "dynamic").value == 25.0
    assert search.figure_of(kv, search.bisect_measures()["counted"], "dynamic").value != 25.0
