"""The walk of ``kvcache bisect``: the plan (everything checked before anything runs) and :class:`Bisect`, which
probes the ends, picks the class whose figure changed and bisects the range with :mod:`kvcache.bisect.search`
(going on after a first bad commit that does not account for the whole change). Standard library only."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from kvcache.analysing.records import KV
from kvcache.analysing.tables import MISSING
from kvcache.bisect import search
from kvcache.bisect.probing import EXIT_AMBIGUOUS, EXIT_FOUND, EXIT_SAME, BisectError, ProbeCache, ProbeResult, Revision


@dataclass
class Plan:
    """Everything checked before anything runs."""

    ends: tuple[Revision, Revision]
    items: list[Revision]  # the range after the good end, oldest first; the last is the bad end
    runner: Any
    cache: ProbeCache
    measure: search.Followed
    cls: str | None
    where: str  # "repo /path" or "releases 5.22.2..5.24.0"
    notes: list[str] = field(default_factory=list)
    mode: str = "commits"


@dataclass
class Change:
    """One change found: the first bad item after ``good`` (or the items it is among)."""

    good: int
    first_bad: int
    skipped: list[int]
    before: search.Figure
    after: search.Figure


@dataclass
class Ends:
    """One class's figure at the good and at the bad end, and the tolerance it is judged with."""

    good: search.Figure
    bad: search.Figure
    tolerance: float

    @property
    def changed(self) -> bool:
        return (self.good.value is not None and self.bad.value is not None
                and search.differs(self.bad.value, self.good.value, self.tolerance))


@dataclass
class Other:
    """``others.<class>`` of the output: a class the bisect did not follow, its figures at the ends."""

    good: float | None
    bad: float | None
    tolerance: float
    changed: bool
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Result:
    """What a bisect found: its exit status, the class it followed (None: no change) with its tolerance, the
    changes in order, the other classes, and a hint naming a figure that did change."""

    exit: int = EXIT_SAME
    cls: str | None = None
    tolerance: float | None = None
    changes: list[Change] = field(default_factory=list)
    others: dict[str, Other] = field(default_factory=dict)
    hint: str | None = None


class Bisect:
    def __init__(self, plan: Plan, say: Callable[[str], None]):
        self.plan, self.say = plan, say
        self.probes: dict[int, ProbeResult] = {}  # index -1: the good end; len(items)-1: the bad end
        self.order: list[int] = []
        self.judged: dict[int, tuple[str, str | None]] = {}  # index: (verdict, note) against the change it belongs to

    def item(self, index: int) -> Revision:
        return self.plan.ends[0] if index < 0 else self.plan.items[index]

    def probe(self, index: int) -> ProbeResult:
        if index in self.probes:
            return self.probes[index]
        item = self.item(index)
        found = self.plan.cache.get(item)
        if found is None:
            found = self.plan.runner.measure(item)
            self.plan.cache.put(found)
        self.probes[index] = found
        self.order.append(index)
        return found

    def run(self) -> Result:
        plan, measure = self.plan, self.plan.measure
        n = len(plan.items)
        for index, end in ((-1, "good"), (n - 1, "bad")):
            probe = self.probe(index)
            self.say(self.probe_line(index, end))
            if probe.kv is None:
                raise BisectError(f"the {end} end {probe.item.short} cannot be measured: {probe.reason}")
        good_kv, bad_kv = self.probes[-1].kv, self.probes[n - 1].kv
        assert good_kv is not None and bad_kv is not None
        names = list(dict.fromkeys([*([plan.cls] if plan.cls else []), *search.classes(good_kv),
                                    *search.classes(bad_kv)]))
        ends = {c: Ends(search.figure_of(good_kv, measure, c), search.figure_of(bad_kv, measure, c),
                        search.tolerance(good_kv, measure, c)) for c in names}
        if plan.cls:
            for end, fig in (("good", ends[plan.cls].good), ("bad", ends[plan.cls].bad)):
                if fig.value is None:
                    raise BisectError(f"--class {plan.cls}: no {measure.label} at the {end} end: {fig.reason}")
        if not any(e.good.value is not None and e.bad.value is not None for e in ends.values()):
            why = next((e.good.reason or e.bad.reason for e in ends.values() if e.good.reason or e.bad.reason),
                       "no figure")
            raise BisectError(f"--measure {measure.name}: no class has {measure.label} at both ends ({why})")
        changed = [c for c, e in ends.items() if e.changed]
        result = Result(others={c: Other(e.good.value, e.bad.value, e.tolerance, e.changed,
                                         e.good.reason or e.bad.reason) for c, e in ends.items()})
        if plan.cls:  # the class asked for, or nothing
            others = [c for c in changed if c != plan.cls]
            if others and plan.cls not in changed:
                first = ends[others[0]]
                result.hint = (f"{measure.label} of {others[0]} did change ({self.pair(first.good, first.bad)}): "
                               f"--class {others[0]} bisects it")
            changed = [plan.cls] if plan.cls in changed else []
        if not changed:
            shown = {plan.cls: ends[plan.cls]} if plan.cls else ends
            self.say(f"no change in {measure.label} between the ends: " + "; ".join(
                f"{c} {self.pair(e.good, e.bad)}" for c, e in shown.items())
                + f" (tolerance {self.tol_text(next(iter(shown.values())).tolerance) if shown else MISSING})")
            result.hint = result.hint or self.other_measures(good_kv, bad_kv)
            if result.hint:
                self.say(result.hint)
            return result
        chosen = changed[0]
        result.others.pop(chosen)
        good_fig, bad_fig, tol = ends[chosen].good, ends[chosen].bad, ends[chosen].tolerance
        assert good_fig.value is not None and bad_fig.value is not None
        result.cls, result.tolerance = chosen, tol
        steps = max(1, (n - 1).bit_length())
        self.say(f"bisecting {measure.label} of {chosen}: {search.fmt_value(good_fig.value, measure)} at the good "
                 f"end, {search.fmt_value(bad_fig.value, measure)} at the bad end (tolerance {self.tol_text(tol)}); "
                 f"{n} {'releases' if plan.mode == 'releases' else 'commits'}, about "
                 f"{steps} probe{'' if steps == 1 else 's'} more")
        lo, reference = -1, good_fig.value
        self.judged.update({-1: (search.GOOD, None), n - 1: (search.BAD, None)})
        while True:
            verdicts = self.verdicts(chosen, lo, n - 1, reference, bad_fig.value, tol)
            while (nxt := search.next_probe(lo, n - 1, verdicts)) is not None:
                self.probe(nxt)
                verdicts = self.verdicts(chosen, lo, n - 1, reference, bad_fig.value, tol)
                self.say(self.probe_line(nxt, verdicts[nxt], chosen))
            for index, verdict in verdicts.items():
                value = self.figure(index, chosen).value
                away = value is not None and search.moved_away(value, reference, bad_fig.value, tol)
                self.judged[index] = (verdict, "moved away from the bad end's figure: taken as good" if away else None)
            good, first_bad, skipped = search.outcome(lo, n - 1, verdicts)
            before = self.figure(good, chosen)
            after = self.figure(first_bad, chosen)
            result.changes.append(Change(good, first_bad, skipped, before, after))
            if skipped or after.value is None or not search.differs(bad_fig.value, after.value, tol):
                break
            if first_bad == n - 1:
                break
            self.say(f"{self.item(first_bad).short} accounts for {search.fmt_value(before.value, measure)} -> "
                     f"{search.fmt_value(after.value, measure)} of {search.fmt_value(good_fig.value, measure)} -> "
                     f"{search.fmt_value(bad_fig.value, measure)}: going on after it")
            lo, reference = first_bad, after.value
        result.exit = EXIT_AMBIGUOUS if result.changes[0].skipped else EXIT_FOUND
        return result

    def figure(self, index: int, cls: str) -> search.Figure:
        probe = self.probes.get(index)
        if probe is None or probe.kv is None:
            return search.Figure(None, {}, probe.reason if probe else "not probed")
        return search.figure_of(probe.kv, self.plan.measure, cls)

    def verdicts(self, cls: str, lo: int, hi: int, reference: float, bad: float, tol: float) -> dict[int, str]:
        return {i: search.good_or_bad(self.figure(i, cls).value, reference, bad, tol)
                for i in self.probes if lo < i < hi}

    def tol_text(self, tol: float) -> str:
        return f"±{tol:g} {self.plan.measure.unit}"

    def pair(self, good: search.Figure, bad: search.Figure) -> str:
        m = self.plan.measure
        if good.value is None or bad.value is None:
            return f"{search.fmt_value(good.value, m)} -> {search.fmt_value(bad.value, m)} (" + (
                f"good end: {good.reason}" if good.value is None else f"bad end: {bad.reason}") + ")"
        return f"{search.fmt_value(good.value, m)} -> {search.fmt_value(bad.value, m)}"

    def other_measures(self, good_kv: KV, bad_kv: KV) -> str | None:
        """A hint naming a figure of another measure that did change between the ends."""
        for measure in {f.name: f for f in search.bisect_measures().values()}.values():
            name = measure.name
            if name == self.plan.measure.name:
                continue
            for c in dict.fromkeys(search.classes(good_kv) + search.classes(bad_kv)):
                ends = Ends(search.figure_of(good_kv, measure, c), search.figure_of(bad_kv, measure, c),
                            search.tolerance(good_kv, measure, c))
                if ends.changed:
                    return (f"{measure.label} of {c} did change ({search.fmt_value(ends.good.value, measure)} -> "
                            f"{search.fmt_value(ends.bad.value, measure)}): --measure {name} bisects it")
        return None

    def probe_line(self, index: int, verdict: str, cls: str | None = None) -> str:
        probe = self.probes[index]
        n = len(self.plan.items)
        where = {-1: "good", n - 1: "bad"}.get(index, f"{index + 1}/{n}")
        if probe.kv is None:
            what = f"skip: {probe.reason}"
        elif cls is None:
            m = self.plan.measure
            what = ", ".join(f"{c} {search.fmt_value(search.figure_of(probe.kv, m, c).value, m)}"
                             for c in search.classes(probe.kv))
        else:
            fig = self.figure(index, cls)
            what = (f"{search.fmt_value(fig.value, self.plan.measure)} {verdict}" if fig.value is not None
                    else f"skip: {fig.reason}")
        how = "cached" if probe.cached else f"{probe.seconds:.1f} s"
        version = f"transformers {probe.transformers}, " if probe.transformers else ""
        line = f"  [{where:>5}] {probe.item.short:<12}  {what}  ({version}{how})"
        if probe.untrusted:
            line += f"\n           not to be trusted: {'; '.join(probe.untrusted)}"
        return line
