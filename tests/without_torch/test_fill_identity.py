"""``--kv-fill`` in the run identity: a prefilled run (a real forward wrote the cache, so a press compressed it) and
a synthetic one count different caches; their baseline keys differ, and compare, report and comment refuse to mix
them as they refuse to mix dtypes. A run or baseline that predates the field reads as ``synthetic`` (the old
default), keeping its keys."""

from __future__ import annotations

import copy

from fakerun import make_run, write_run

from kvcache.analysing.analysis import run_verdicts
from kvcache.analysing.judge import baseline
from kvcache.analysing.judge.measure_table import GROUPS
from kvcache.analysing.records import KV, identity
from kvcache.cli import main


def kv_of(fill: str | None) -> KV:
    run = make_run()
    if fill is None:
        run["kv"]["settings"].pop("fill", None)
    else:
        run["kv"]["settings"]["fill"] = fill
    return KV.from_json(run["kv"])


def test_the_fill_joins_every_key_only_away_from_synthetic():
    synthetic, prefill = identity.of_run(kv_of("synthetic")), identity.of_run(kv_of("prefill"))
    assert "fill" not in synthetic.to_json() and prefill.fill == "prefill"
    for measure in GROUPS:
        assert "fill" not in identity.baseline_key(synthetic, measure)
        assert identity.baseline_key(prefill, measure).endswith("| fill=prefill")
    assert "fill prefill" in identity.describe(prefill)
    assert identity.mismatches([synthetic, prefill], ["counted"]) == {"fill": ["synthetic", "prefill"]}


def test_a_run_that_predates_the_field_reads_as_synthetic():
    old = identity.of_run(kv_of(None))
    assert old.fill == "synthetic"
    assert {m: identity.baseline_key(old, m) for m in GROUPS} == \
        {m: identity.baseline_key(identity.of_run(kv_of("synthetic")), m) for m in GROUPS}


def test_an_old_baseline_judges_a_synthetic_run_and_not_a_prefilled_one(tmp_path):
    old = kv_of(None)  # recorded before the fill was in the identity: its key has no fill
    entries, _ = baseline.record(tmp_path / "kv-baseline.json", old, "then")
    doc = baseline.load(tmp_path / "kv-baseline.json")
    assert all("fill" not in key for key in entries)
    assert run_verdicts(kv_of("synthetic"), doc)["dynamic"]["counted"].status == "pass"
    # a prefilled run counting 3.00 -> 1.50 is not a change against the synthetic entry: it has none of its own
    prefill = kv_of("prefill")
    verdict = run_verdicts(prefill, doc)["dynamic"]["counted"]
    assert verdict.status not in ("pass", "regression", "improvement"), verdict
    assert baseline.for_run(doc, identity.of_run(prefill))[0]["counted"] == {}


def test_compare_refuses_to_mix_fills_naming_them(tmp_path, capsys):
    a = make_run()
    b = copy.deepcopy(a)
    b["kv"]["settings"]["fill"] = "prefill"
    paths = [str(write_run(tmp_path / n, r)) for n, r in (("a.json", a), ("b.json", b))]
    assert main(["compare", *paths]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fill (a.json: synthetic, b.json: prefill)" in err
    assert main(["compare", *paths, "--allow-mismatch"]) == 0
