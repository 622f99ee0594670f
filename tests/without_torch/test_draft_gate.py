"""A draft model's own figures (``kv.traffic.<cache>#assisted:...:K.draft``: passes per KV byte the draft's cache
holds, and per generated token) are judged in the ``decoding`` verdict against ``draft_passes`` and
``draft_per_token`` of the key's counted baseline entry; greedy and beam keys are not touched. Stdlib only."""

from __future__ import annotations

import copy
import json

import pytest
from fakerun import make_run, write_run

from kvcache.analysing import analysis
from kvcache.analysing.judge import baseline
from kvcache.analysing.judge.decoding_judge import baseline_figures, decoding_entry, decoding_figures, judge_decoding
from kvcache.analysing.judge.entries import BaselineEntry, entry_problems
from kvcache.analysing.judge.measure_table import BY_NAME
from kvcache.analysing.records import KV, Traffic

SELF = "dynamic#assisted:self:4"
BEAM = "dynamic#beam:4"
KEY = "cpu | smollm2-135m | bfloat16"
ENTRY = f"devices[{KEY!r}][{SELF!r}]"


def assisted(*, draft_rise: float = 0.0, everywhere: bool = False, acceptance: float = 1.0) -> dict:
    """``kv.traffic`` of ``assisted:self:4`` on ``tiny`` (docs/decoding.md): 5 tokens a step, the draft's 18.19
    passes of its own cache. ``draft_rise``: a planted copy in the draft (``clone``), on the draft's figures only
    or, ``everywhere``, as a draft that copies its cache once more would show (its phase and the step too: a
    self-draft's cache has the main cache's bytes per token)."""
    draft_passes = 18.19 + draft_rise
    by_op = {"cat": 8.09, "scaled_dot_product_attention": 6.0, "reshape": 4.0}
    if draft_rise:
        by_op["clone"] = draft_rise
    step = 27.25 + (draft_rise if everywhere else 0.0)
    phase_draft = draft_passes if everywhere else 18.19
    return {
        "passes": step, "by_op": {"reshape": 8.0, "scaled_dot_product_attention": 9.01, "cat": 10.09}, "contexts":
        [256, 512], "bytes_per_token": 23_040, "strategy": "assisted:self:4", "rows": 1, "tokens_per_step": 5.0,
        "passes_per_token": step / 5,
        "phases": {"forward": {"passes": 9.03, "by_op": {}}, "crop": {"passes": 0.0, "by_op": {}},
                   "draft": {"passes": phase_draft, "by_op": by_op}, "other": {"passes": 0.03, "by_op": {}}},
        "draft": {"model": "self", "cache": "DynamicCache", "drafted": 4, "accepted": 4 * acceptance,
                  "acceptance": acceptance, "bytes_per_token": 23_040, "passes": draft_passes,
                  "passes_per_token": draft_passes / 5, "by_op": by_op},
    }


def traffic(**kwargs) -> Traffic:
    return Traffic.from_json(assisted(**kwargs))


def test_the_draft_figures_are_decoding_figures_and_baseline_fields():
    figures = decoding_figures(traffic())
    assert figures["draft"] == 18.19 and figures["draft_per_token"] == pytest.approx(3.638)
    assert "acceptance" not in figures  # a share, not passes: reported, not judged (module docstring)
    entry = decoding_entry(traffic())
    assert entry["draft_passes"] == 18.19 and entry["draft_per_token"] == pytest.approx(3.638)
    assert entry_problems(entry) == {}
    assert baseline_figures(BaselineEntry.from_json(entry)) == figures
    for name in ("draft", "draft_per_token"):  # rows of the measure table judged in the decoding verdict
        measure = BY_NAME[name]
        assert measure.verdict == "decoding" and measure.baseline in entry, name


def test_a_draft_raised_by_two_passes_is_a_regression_of_the_draft_part():
    """Only ``draft.passes`` (per draft KV byte) and its per-token figure rise: the main figures pass."""
    base = BaselineEntry.from_json(decoding_entry(traffic()))
    verdict = judge_decoding(traffic(draft_rise=2.0), base, tolerance=0.05, key=KEY)
    assert verdict.status == "regression", verdict
    assert verdict.parts["draft"].status == "regression" and verdict.parts["draft"].allowed == pytest.approx(18.24)
    assert verdict.parts["draft_per_token"].status == "regression"
    assert {n for n, p in verdict.parts.items() if p.status == "pass"} == {
        "per_token", "phase:forward", "phase:crop", "phase:draft", "phase:other"}
    assert verdict.reason.startswith("draft 20.2 is above the allowed 18.2"), verdict.reason
    assert judge_decoding(traffic(), base, tolerance=0.05, key=KEY).status == "pass"
    within = judge_decoding(traffic(draft_rise=0.04), base, tolerance=0.05, key=KEY)
    assert within.status == "pass", within  # within the counted tolerance


def test_a_draft_that_falls_or_lacks_a_baseline_passes():
    base = BaselineEntry.from_json(decoding_entry(traffic(draft_rise=2.0)))
    assert judge_decoding(traffic(), base, tolerance=0.05, key=KEY).status == "pass"
    old = BaselineEntry.from_json({k: v for k, v in decoding_entry(traffic()).items() if not k.startswith("draft")})
    verdict = judge_decoding(traffic(draft_rise=2.0), old, tolerance=0.05, key=KEY)  # a baseline from before
    assert verdict.status == "pass" and verdict.parts["draft"].status == "no-baseline", verdict


def test_acceptance_is_not_judged_its_cost_per_token_is():
    """A lower acceptance with the same passes a step is not a regression by itself (not a figure of passes); a
    draft that drafts worse yields fewer tokens a step, and ``per_token`` and ``draft_per_token`` rise (judged)."""
    base = BaselineEntry.from_json(decoding_entry(traffic()))
    assert judge_decoding(traffic(acceptance=0.5), base, tolerance=0.05, key=KEY).status == "pass"
    worse = assisted(acceptance=0.25)
    worse["tokens_per_step"] = 2.0
    worse["passes_per_token"] = worse["passes"] / 2
    worse["draft"]["passes_per_token"] = worse["draft"]["passes"] / 2
    verdict = judge_decoding(Traffic.from_json(worse), base, tolerance=0.05, key=KEY)
    assert {n for n, p in verdict.parts.items() if p.status == "regression"} == {"per_token", "draft_per_token"}


def run_with(draft: dict) -> dict:
    """A synthetic run of greedy ``dynamic``, ``dynamic#beam:4`` and ``dynamic#assisted:self:4`` whose assisted key
    has the traffic ``draft``; the beam key's figures from docs/decoding.md (5.00 a step and a token)."""
    doc = make_run({"dynamic": 3.0, BEAM: 5.0, SELF: 27.25})
    traffic = doc["kv"]["traffic"]
    traffic[BEAM].update(strategy="beam:4", rows=4, tokens_per_step=1.0, passes_per_token=5.0,
                         phases={"forward": {"passes": 3.0, "by_op": {}}, "reorder": {"passes": 2.0, "by_op": {}}})
    traffic[SELF].update(copy.deepcopy(draft))
    return doc


def test_a_draft_that_copies_its_cache_twice_fails_the_gate_and_compare_for_its_key_only(tmp_path, capsys):
    """The session-end gate against a baseline recorded from the clean run, and ``kvcache compare`` of the two runs:
    exit 1, the regression the assisted key's; greedy and beam keys pass."""
    from kvcache.cli import main

    clean, planted = run_with(assisted()), run_with(assisted(draft_rise=2.0, everywhere=True))
    entries, refused = baseline.entries_of_run(KV.from_json(clean["kv"]), "now")
    assert not [line for line in refused if "counted" in line], refused
    assert entries[KEY][SELF]["draft_passes"] == 18.19
    assert "draft_passes" not in entries[KEY][BEAM] and "draft_passes" not in entries[KEY]["dynamic"]
    path = tmp_path / "baseline.json"
    baseline.record(path, KV.from_json(clean["kv"]), "now")  # written and read back as the gate reads it
    file = baseline.load(path)
    assert file.to_json()["devices"][KEY][SELF]["draft_per_token"] == pytest.approx(3.638)
    kv = KV.from_json(planted["kv"])
    kv.verdict = analysis.run_verdicts(kv, file)
    failures = analysis.gate_failures(kv)  # any line: the session exits 1
    assert failures and all(line.startswith(f"kv-cache regression: {SELF} ") for line in failures), failures
    decoding = kv.verdict[SELF]["decoding"]
    assert decoding.parts["draft"].status == "regression", decoding
    assert "draft 20.2 is above the allowed 18.2" in decoding.reason
    assert kv.verdict[BEAM]["decoding"].status == "pass" and "decoding" not in kv.verdict["dynamic"]
    for key in ("dynamic", BEAM):  # counted figures as the baseline's; nothing of theirs a regression
        assert {m: v.status for m, v in kv.verdict[key].items() if m in ("counted", "overhead", "decoding")} == \
            {"counted": "pass", "overhead": "pass", **({"decoding": "pass"} if key == BEAM else {})}, key
        assert "regression" not in {v.status for v in kv.verdict[key].values()}, key
    again = KV.from_json(clean["kv"])
    again.verdict = analysis.run_verdicts(again, file)
    assert not analysis.gate_failures(again) and again.verdict[SELF]["decoding"].status == "pass"

    base, head = write_run(tmp_path / "base.json", clean), write_run(tmp_path / "head.json", planted)
    assert main(["compare", str(base), str(head)]) == 1
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("regression:")]
    assert lines and all(SELF in x for x in lines), out
    assert any("draft 20.2 is above the allowed 18.2" in x for x in lines), lines
    assert main(["compare", str(base), str(base)]) == 0


def test_compare_shows_a_draft_only_change(tmp_path, capsys):
    """Only the draft's figures differ (per draft KV byte): compare still names the change and exits 1."""
    from kvcache.cli import main

    base = write_run(tmp_path / "base.json", run_with(assisted()))
    head = write_run(tmp_path / "head.json", run_with(assisted(draft_rise=2.0)))
    assert main(["compare", str(base), str(head)]) == 1
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("regression:")]
    assert SELF in line and "draft 20.2 is above the allowed 18.2" in line \
        and "per_token" not in line.replace("draft_per_token", "")
    # the table's passes/token column is its own figure's part of the verdict: unchanged, not marked a regression
    (row,) = [x for x in out.splitlines() if x.lstrip("| ").startswith(SELF)]
    assert "▲" not in row, row


@pytest.mark.parametrize(("field", "text", "shown"), [
    ("draft_passes", "NaN", "draft_passes is nan"),
    ("draft_passes", "-1.5", "draft_passes is -1.5"),
    ("draft_passes", "0", "draft_passes is 0"),
    ("draft_passes", "1e300", "draft_passes is 1e+300"),
    ("draft_passes", '"18.19"', "draft_passes is '18.19'"),
    ("draft_per_token", "-Infinity", "draft_per_token is -inf"),
    ("draft_per_token", "true", "draft_per_token is True"),
])
def test_a_baseline_file_with_a_bad_draft_figure_is_refused_in_one_line(tmp_path, field, text, shown):
    path = tmp_path / "b.json"
    entry = '{"counted_passes": 27.25, "decoding_per_token": 5.45, "' + field + '": ' + text + "}"
    path.write_text('{"schema": 2, "devices": {' + json.dumps(KEY) + ": {" + json.dumps(SELF) + ": " + entry + "}}}")
    with pytest.raises(baseline.BaselineError) as info:
        baseline.load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    assert f"{ENTRY}.{shown}" in message and "expected a" in message, message


def test_a_run_with_an_unjudgeable_draft_figure_records_no_counted_entry(tmp_path):
    """A draft figure out of range (here -1 passes) never enters the baseline: the key's counted entry is refused
    with the reason, as for any counted figure; the other keys are recorded."""
    bad = assisted()
    bad["draft"]["passes"] = -1.0
    kv = KV.from_json(run_with(bad)["kv"])
    path = tmp_path / "b.json"
    _, refused = baseline.record(path, kv, "now")
    assert any(line.startswith(f"{SELF}: counted passes not recorded: draft_passes is -1.0") for line in refused)
    recorded = baseline.load(path).to_json()["devices"][KEY]
    assert SELF not in recorded and recorded[BEAM]["decoding_per_token"] == 5.0
