"""More rounds of an A/B (kvcache.ab.extend) without workers: which inconclusive verdicts of the real judge ask for
more rounds, the budget arithmetic, the pooling of an extension's records, and the loop (decided, gave up on the
budget or the most extensions, a reason more rounds cannot help) with a fake extension. No torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvcache.ab import clock, extend
from kvcache.ab.results import ABResult
from kvcache.ab.schedule import ABSession
from kvcache.ab.sides import Hello, Side
from kvcache.analysing.judge import paired as ab
from kvcache.analysing.records import KV, SCHEMA, CopyMeasurement, Point, RunSettings
from kvcache.analysing.records.ab_document import ABItem, ABRunSection, PairedVerdict, read_ab_section
from kvcache.analysing.records.measured import from_wire, to_wire

CONTEXTS = (1024, 4096, 16384)


def side(slope: float, intercept: float, *, seed: int, rounds: int = 3, noise: float = 0.01,
         round_speed: tuple[float, ...] = (), contexts: tuple[int, ...] = CONTEXTS) -> KV:
    rng = np.random.default_rng(seed)
    points = []
    for r in range(rounds):
        speed = round_speed[r] if r < len(round_speed) else 1.0
        for c in contexts:
            samples = (intercept + slope * c * 1000) * speed * (1 + noise * rng.standard_normal(10))
            points.append({"cache": "dynamic", "context": c, "round": r, "kv_bytes": c * 1000.0,
                           "samples_ms": [x * 1e3 for x in samples]})
    return KV.from_json({"schema": SCHEMA, "points": points, "settings": {"max_drift": 0.10, "resamples": 400,
                                                                         "confidence": 0.95, "seed": 0}})


def judged(a: KV, b: KV) -> dict:
    return ab.judge(a, b, resamples=400)


def test_the_judges_reasons_that_more_rounds_can_help_and_those_they_cannot():
    straddles = judged(side(1e-9, 2e-3, seed=1, noise=0.3), side(1.1e-9, 2e-3, seed=2, noise=0.3))["dynamic"]
    assert straddles["timed"].status == "inconclusive", straddles["timed"]
    assert extend.why_more_rounds(straddles["timed"]) == extend.STRADDLES
    drift = judged(side(1e-9, 2e-3, seed=1), side(1.6e-9, 2e-3, seed=2, round_speed=(1.0, 1.15, 1.3)))["dynamic"]
    assert "drift differs" in drift["timed"].reason and extend.why_more_rounds(drift["timed"]) == extend.DRIFT
    few = judged(side(1e-9, 2e-3, seed=1), side(1e-9, 2e-3, seed=2, contexts=CONTEXTS[:1]))["dynamic"]
    assert extend.why_more_rounds(few["timed"]) == extend.FEW_CONTEXTS, few["timed"]
    # B's intercept below zero (the layout twin) and A's slope not above zero (A's fit does not grow): no help
    bent = judged(side(1e-9, 2e-3, seed=1), side(2e-9, -1e-3, seed=2))["dynamic"]
    assert bent["timed"].status == "regression" and extend.why_more_rounds(bent["timed"]) is None
    assert "not above zero" in bent["intercept"].reason and extend.why_more_rounds(bent["intercept"]) is None
    flat = judged(side(0.0, 2e-3, seed=1, noise=0.05), side(1e-9, 2e-3, seed=2))["dynamic"]
    assert "A's slope is not above zero" in flat["timed"].reason and extend.why_more_rounds(flat["timed"]) is None
    none = judged(side(1e-9, 2e-3, seed=1), side(1e-9, 2e-3, seed=2, rounds=0))["dynamic"]
    assert extend.why_more_rounds(none["timed"]) is None  # no point of the class on side B: more rounds neither
    same = judged(side(1e-9, 2e-3, seed=1), side(1e-9, 2e-3, seed=2))["dynamic"]
    assert same["timed"].status == "pass" and extend.why_more_rounds(same["timed"]) is None


def test_triggers_are_the_timed_verdicts_alone_and_a_skipped_class_has_no_more_contexts_to_give():
    section = {"dynamic": {"timed": {"status": "inconclusive", "reason": "B/A slope ×1.1 [0.9, 1.3] straddles ×1.100",
                                     "ratio_ci": [0.9, 1.3]},
                           "intercept": {"status": "pass", "ratio_ci": [0.9, 1.0]},
                           "ledger": {"cat": {"status": "inconclusive", "ratio_ci": [0.9, 1.3]}},
                           "counted": {"status": "inconclusive"}},
               "static": {"timed": {"status": "inconclusive", "reason": "1 context(s) measured on both sides: a slope "
                                    "needs 2 or more"}, "intercept": {"status": "regression"}},
               # an undecided intercept beside a decided slope: no extension (it would look at the slope again)
               "inplace": {"timed": {"status": "pass", "ratio_ci": [0.9, 1.05]},
                           "intercept": {"status": "inconclusive", "reason": "B/A intercept ×1.1 [0.8, 1.4] straddles "
                                         "×1.100", "ratio_ci": [0.8, 1.4]}}}
    verdicts = read_ab_section(section)
    assert extend.triggers(verdicts) == [f"dynamic timed ({extend.STRADDLES})", f"static timed ({extend.FEW_CONTEXTS})"]
    assert extend.triggers(verdicts, {"static"}) == [f"dynamic timed ({extend.STRADDLES})"]
    assert extend.inconclusive(verdicts) == ["dynamic timed", "static timed"]


def test_the_cost_of_an_extension_and_the_rounds_the_budget_allows():
    pairs = [{"role": "counted", "wall": 50.0}, {"role": "copy", "wall": 2.0}, *[{"role": "point", "wall": 10.0}] * 6,
             {"role": "copy", "wall": 4.0}, {"role": "ledger", "wall": 30.0}, {"role": "drift", "wall": 5.0}]
    cost = extend.cost_of([ABItem.from_json({"item": "x", **p}) for p in pairs], 2,
                          {"start": 20.0, "drive": 999.0, "finish": 6.0, "judge": 1.0})
    assert cost == extend.Cost(fixed_s=20 + 6 + 1 + 5, per_round_s=60 / 2)  # counted, ledger, copy: not run
    assert cost.of(2) == 32 + 60 and cost.rounds_within(32 + 30 * 3 + 1) == 3 and cost.rounds_within(60) == 0
    assert extend.plan(2, cost, 1000, 0) == (2, None)  # the pool's rounds doubled
    assert extend.plan(4, cost, 32 + 30 * 3, 1) == (3, None)  # fewer when the budget pays for fewer
    rounds, why = extend.plan(4, cost, 60, 1)
    assert rounds == 0 and "one more round would take about 62 s, 60 s of the budget left" in why
    rounds, why = extend.plan(8, cost, 1e6, extend.MAX_EXTENSIONS)
    assert rounds == 0 and "the most" in why
    assert cost.at_least(extend.Cost(10, 50)) == extend.Cost(32, 50)


def hello(rounds: int) -> Hello:
    return Hello(items=["x"], roles=["point"], settings=RunSettings.of(rounds=rounds, contexts=[1, 2]))


def worker(name: str, records: list[str], rounds: int) -> Side:
    out = Side(name, {}, [], Path(f"{name}.log"))
    out.hello, out.records, out.finished = hello(rounds), records, ["x"]
    return out


def point(context: int, round: int, kind: str = "timed") -> str:
    """A timed point as a worker sends it (the JSON text of its record)."""
    return to_wire(Point.of(cache="dynamic", context=context, kv_bytes=float(context), round=round, kind=kind))


def copy(label: str) -> str:
    return to_wire(CopyMeasurement.of(label=label, gbps=1.0))


def read(records: list[str]) -> list:
    return [from_wire(text) for text in records]


def test_an_extensions_records_are_pooled_with_rounds_after_the_last():
    first = ABSession([worker(n, [point(1, 0), point(2, 0), point(1, 3), copy("start")], 1)
                     for n in "ab"], items=["x"], roles=["point"])
    assert extend.last_round(first.sides) == 3  # a re-measurement's round counts
    more = ABSession([worker(n, [point(1, 0), point(2, 0), point(1, 1), point(2, 1), point(1, 0, "drift")], 2)
                      for n in "ab"], items=["y"], roles=["point"], pairs=[ABItem("y", "point", "a", {}, 1.0)])
    more.sides[1].failure = "killed"
    extend.pool(first, more, 4, 1, 3)
    a = first.sides[0]
    assert [(r.context, r.round) for r in read(a.records) if isinstance(r, Point) and r.kind == "timed"] == [
        (1, 0), (2, 0), (1, 3), (1, 4), (2, 4), (1, 5), (2, 5)]
    assert [r.label for r in read(a.records) if isinstance(r, CopyMeasurement)] == ["start"]  # the first's only
    assert a.hello.settings.rounds == 3 and first.items == ["x", "y"] and len(first.pairs) == 1
    assert first.sides[1].failure == "more rounds 1: killed" and a.failure is None
    assert read(more.sides[0].records)[0].round == 0  # the extension's own records are left as they were


def verdict(status: str, why: str = "straddles") -> dict:
    if why == "straddles":
        return {"status": status, "reason": "B/A slope straddles ×1.100", "ratio_ci": [0.9, 1.3]}
    return {"status": status, "reason": "A's slope is not above zero in 50% of the resamples: no ratio",
            "ratio_ci": None}


def doc_of(timed: dict, intercept: dict | None = None, pairs: int = 4) -> ABResult:
    verdicts = {"dynamic": {"timed": PairedVerdict.from_json(timed),
                            "intercept": PairedVerdict.from_json(intercept or verdict("pass"))}}
    items = [ABItem("x", "point", "a", {}, 10.0)] * pairs + [ABItem("x", "drift", "a", {}, 10.0)]
    return ABResult(KV(), KV(), verdicts, ABRunSection.of(pairs=items, notes=[]), "now")


class Fake:
    """A session whose judge returns ``docs`` in turn and whose extensions are recorded, each taking the seconds it
    was estimated to on a fake clock."""

    def __init__(self, docs: list[dict], monkeypatch, rounds: int = 2) -> None:
        self.docs, self.runs, self.now = docs, [], 0.0
        monkeypatch.setattr(clock, "source", lambda: self.now)
        self.session = ABSession([worker(n, [point(1, r) for r in range(rounds)], rounds) for n in "ab"],
                                 items=["x"], roles=["point"])
        self.said: list[str] = []

        def run(session, rounds, k, ext, extension):
            self.runs.append(rounds)
            self.now += extension.estimate_s
            records = [point(1, r) for r in range(rounds)]
            more = ABSession([worker(n, list(records), rounds) for n in "ab"], items=[f"more-{k}"], roles=["point"],
                             pairs=[ABItem(f"more-{k}", "point", "a", {}, 1.0)])
            return more, {"start": 1.0, "drive": 1.0, "finish": 1.0}

        monkeypatch.setattr(extend, "_run_extension", run)

    def extender(self, budget_s: float) -> extend.Extender:
        return extend.Extender(budget_s, [], Path("."), Path("."), {"start": 5.0, "finish": 5.0, "judge": 0.0},
                               self.said.append, KeyboardInterrupt, [], lambda session: self.docs.pop(0))

    def run(self, budget_s: float) -> tuple[ABResult, extend.MoreRounds]:
        doc = extend.more_rounds(self.session, self.docs.pop(0), self.extender(budget_s))
        return doc, doc.run.more_rounds


@pytest.fixture(autouse=True)
def _no_signal_handlers(monkeypatch):
    from kvcache.analysing import files

    monkeypatch.setattr(files, "quiet_signals", lambda prog: None)


def test_a_decided_session_takes_no_more_rounds(monkeypatch):
    fake = Fake([doc_of(verdict("pass"))], monkeypatch)
    doc, record = fake.run(600)
    assert fake.runs == [] and record.stopped == "decided" and not record.gave_up and record.rounds == 2
    assert doc.run.notes == ["more rounds: none taken (every timed verdict decided)"] and not fake.said


def test_more_rounds_until_decided_pooled_with_the_first_session(monkeypatch):
    fake = Fake([doc_of(verdict("inconclusive")), doc_of(verdict("regression"))], monkeypatch)
    doc, record = fake.run(600)
    assert fake.runs == [2] and record.stopped == "decided" and not record.gave_up
    assert record.rounds == 4 and record.extensions[0].first_round == 2 and record.extensions[0].pairs == 1
    assert [r.round for r in read(fake.session.sides[0].records)] == [0, 1, 2, 3]
    assert fake.said[0].startswith("kvcache ab: inconclusive: dynamic timed (the interval straddles the bound); "
                                   "taking 2 more round(s) of the timed items (extension 1 of at most 3, about ")
    assert "600 s of the 600 s budget left" in fake.said[0]
    assert doc.run.notes[-1].startswith("more rounds: 1 extension(s), 2 more round(s) (4 in all), ")
    assert doc.run.notes[-1].endswith("every timed verdict decided")


def test_it_gives_up_after_the_most_extensions_with_the_rounds_doubling(monkeypatch):
    fake = Fake([doc_of(verdict("inconclusive"))] * (extend.MAX_EXTENSIONS + 1), monkeypatch)
    doc, record = fake.run(1e6)
    assert fake.runs == [2, 4, 8] and record.rounds == 16 and record.gave_up and record.stopped == "most extensions"
    assert record.inconclusive == ["dynamic timed"]
    line = doc.run.notes[-1]
    assert line.startswith("more rounds: gave up after 3 extension(s), 14 more round(s) (16 in all), "), line
    assert line.endswith("still inconclusive: dynamic timed"), line


def test_it_gives_up_when_the_budget_pays_for_no_round_and_never_overruns(monkeypatch):
    # the first session: 2 rounds of 4 points of 10 s (20 s a round), fixed 5 + 5 + 10 (drift) = 20 s
    fake = Fake([doc_of(verdict("inconclusive"))], monkeypatch)
    doc, record = fake.run(39)
    assert fake.runs == [] and record.gave_up and record.stopped == "budget" and not record.extensions
    assert "one more round would take about 40 s, 39 s of the budget left" in doc.run.notes[-1]
    fake = Fake([doc_of(verdict("inconclusive"))] * 2, monkeypatch)
    doc, record = fake.run(79)  # two rounds would take 60 s: one extension of 2, then 19 s left, not one round
    assert fake.runs == [2] and record.gave_up and record.stopped == "budget"
    assert record.extensions[0].estimate_s == 60 and record.seconds == 60
    assert "one more round would take about 40 s, 19 s of the budget left" in doc.run.notes[-1]


def test_a_reason_more_rounds_cannot_help_takes_none_and_is_no_giving_up(monkeypatch):
    fake = Fake([doc_of(verdict("inconclusive", "flat"))], monkeypatch)
    doc, record = fake.run(600)
    assert fake.runs == [] and record.stopped == "cannot help" and not record.gave_up
    assert doc.run.notes[-1] == ("more rounds: none taken (more rounds cannot decide dynamic timed: see the "
                                          "reason)")


def test_a_failed_side_or_a_signal_between_the_sessions_takes_none(monkeypatch):
    fake = Fake([doc_of(verdict("inconclusive"))], monkeypatch)
    fake.session.sides[1].failure = "worker exit 1"
    _, record = fake.run(600)
    assert fake.runs == [] and record.stopped == "failed" and record.gave_up
    fake = Fake([doc_of(verdict("inconclusive"))], monkeypatch)
    ext = fake.extender(600)
    ext.held.append("SIGINT")
    doc = extend.more_rounds(fake.session, fake.docs.pop(0), ext)
    assert fake.runs == [] and doc.run.more_rounds.stopped == "interrupted"


def test_the_option_is_minutes_and_bad_values_are_one_line(capsys):
    from kvcache.commands import ab as command

    assert command.parse_minutes("2.5") == 2.5 and command.parse_minutes("0") == 0
    for bad in ("x", "-1", "inf", "nan"):
        assert command.main(["--more-rounds-within", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--more-rounds-within" in err, err
