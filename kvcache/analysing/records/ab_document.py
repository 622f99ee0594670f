"""The records of ``kvcache ab``'s output (``--json``) besides the two sides' ``kv`` sections: the paired verdicts
(``ab``, :class:`PairedVerdict` each) and the session (``ab_run``, :class:`ABRunSection`). Stdlib only.

The ``ab`` section is ``{cache: {measure: verdict}}``, the per-op ledger's verdicts one level down
(``ab.<cache>.ledger.<op>``); :func:`read_ab_section` reads it as ``{cache: {measure: PairedVerdict}}`` with the
ledger's as ``ledger.<op>``. Every key of ``ab_run`` may be missing (a session stopped at start-up, a hand-made
file): a missing key reads as None, or an empty list or object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcache.analysing.records.context import Section, unset_field
from kvcache.analysing.records.jsonrecord import Reader, Record, absent_field, extra_field, list_of, object_of

#: The statuses of a paired verdict.
PAIRED_STATUSES = ("pass", "regression", "improvement", "inconclusive")
#: The measures judged from the pairs (:mod:`kvcache.analysing.judge.paired`); the gate's other measures are kept as
#: judged.
PAIRED = ("timed", "intercept", "ledger")


@dataclass
class PairedVerdict(Record):
    """One verdict of an ``ab`` section: ``status`` (:data:`PAIRED_STATUSES`) and ``reason``; ``value`` and
    ``ratio``, B/A of the figure, with ``ratio_ci`` [low, high] its paired bootstrap interval; ``allowed``,
    ``1 + tolerance``; ``a`` and ``b``, the two sides' figures (timed passes; intercept ms; an op's timed passes).
    The exact measures kept from the gate (``counted``, ``overhead``) have the gate's verdict shape: their other keys
    stay in ``extra``."""

    status: str = ""
    reason: str = ""
    value: float | None = None
    allowed: float | None = None
    ratio: float | None = None
    ratio_ci: list[float | None] | None = None
    a: float | None = None
    b: float | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


def ab_statuses(ab: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every verdict of an ``ab`` section as written: ``(cache, measure, verdict JSON)``, ledger ops as
    ``ledger.<op>``; what is not a verdict object is passed over."""
    out = []
    for cache, measures in ab.items():
        if not isinstance(measures, dict):
            continue
        for measure, value in measures.items():
            if measure == "ledger" and isinstance(value, dict):
                out += [(cache, f"ledger.{op}", v) for op, v in value.items() if isinstance(v, dict)]
            elif isinstance(value, dict) and "status" in value:
                out.append((cache, measure, value))
    return out


def read_ab_section(ab: dict[str, Any]) -> dict[str, dict[str, PairedVerdict]]:
    """The verdicts of an ``ab`` section (as written, read from a file), ``{cache: {measure: verdict}}``, the
    per-op ledger's as ``ledger.<op>`` (see :func:`ab_statuses`); RecordError naming the verdict when one cannot be
    read."""
    out: dict[str, dict[str, PairedVerdict]] = {}
    for cache, measure, value in ab_statuses(ab):
        out.setdefault(str(cache), {})[measure] = PairedVerdict.from_json(value, f"ab.{cache}.{measure}")
    return out


def ab_section_json(verdicts: dict[str, dict[str, Record]]) -> dict[str, Any]:
    """The ``ab`` section as written from its verdicts (``{cache: {measure: verdict}}``, the ledger's as
    ``ledger.<op>``, as :func:`read_ab_section` gives them back): the ledger's one level down, under ``ledger``
    (an empty object where no op was judged), after the paired measures and before the gate's."""
    out: dict[str, Any] = {}
    for cache, measures in verdicts.items():
        entry: dict[str, Any] = {}
        ledger: dict[str, Any] = {}
        for measure, verdict in measures.items():
            if measure.startswith("ledger."):
                ledger[measure[len("ledger."):]] = verdict.to_json()
                entry.setdefault("ledger", ledger)
            elif measure in PAIRED:
                entry[measure] = verdict.to_json()
            else:
                entry.setdefault("ledger", ledger)
                entry[measure] = verdict.to_json()
        entry.setdefault("ledger", ledger)
        out[cache] = entry
    return out


@dataclass
class ABItem(Record):
    """``ab_run.pairs[]``: one item both sides finished: its node id, its role, which side ran it first (None: both
    at once), each side's wall seconds alone (``seconds``, by side name) and the item's wall seconds (``wall``)."""

    item: str
    role: str
    first: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    wall: float | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    def rounded(self) -> ABItem:
        """The item with its seconds to 2 decimals, as the output file holds them."""
        return ABItem(self.item, self.role, self.first, {name: round(s, 2) for name, s in self.seconds.items()},
                      None if self.wall is None else round(self.wall, 2))


@dataclass
class CopyFigure(Record):
    """``ab_run.sides.<name>.copy[]``: one copy-bandwidth measurement of the side: its label and GB/s."""

    label: str | None = None
    gbps: float | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class ABSide(Section):
    """``ab_run.sides.<name>``: the side's pytest arguments, its ``--x-release`` (None: this environment's), the
    Transformers and torch releases it ran, its log, why it failed (None: it did not), the items it finished, its own
    drift (a fraction; None: unmeasured) and its copy bandwidths."""

    args: list[str] = field(default_factory=list)
    release: str | None = None
    transformers: str | None = None
    torch: str | None = None
    log: str | None = None
    failed: str | None = None
    items_finished: int | None = None
    drift: float | None = None
    copy: list[CopyFigure] = field(default_factory=list)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = unset_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"copy": list_of(CopyFigure.from_json)}


@dataclass
class Extension(Record):
    """``ab_run.more_rounds.extensions[]``: one further pair of workers: its ``rounds`` (numbered from
    ``first_round`` in the pool), the verdicts that asked for it (``why``), its estimated and measured wall seconds,
    the items both sides finished (``pairs``) and, when a side failed or a signal stopped it, why (``failed``)."""

    rounds: int = 0
    first_round: int = 0
    why: list[str] = field(default_factory=list)
    estimate_s: float | None = None
    seconds: float | None = None
    pairs: int = 0
    failed: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


#: ``MoreRounds.stopped``: why no more extension was taken.
STOPPED = ("decided", "cannot help", "budget", "most extensions", "failed", "interrupted")


@dataclass
class MoreRounds(Record):
    """``ab_run.more_rounds`` (only with ``--more-rounds-within``): the budget (s), the first session's rounds and
    the pool's (``rounds``), the seconds the extensions took, each extension, why it stopped (:data:`STOPPED`), whether
    it gave up (timed verdicts more rounds could help were still inconclusive) and the timed verdicts still
    inconclusive at the end (``"<cache> <measure>"``)."""

    budget_s: float = 0.0
    first_rounds: int = 0
    rounds: int = 0
    seconds: float = 0.0
    extensions: list[Extension] = field(default_factory=list)
    stopped: str = ""
    gave_up: bool = False
    inconclusive: list[str] = field(default_factory=list)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Any]:
        return {"extensions": list_of(Extension.from_json)}

    def line(self, detail: str = "") -> str:
        """The summary's line: what was taken, and that it gave up or why none was needed."""
        more = self.rounds - self.first_rounds
        taken = (f"{len(self.extensions)} extension(s), {more} more round(s) ({self.rounds} in all), "
                 f"{self.seconds:.0f} s of the {self.budget_s:.0f} s budget")
        still = ", ".join(self.inconclusive)
        if self.gave_up:
            return (f"more rounds: gave up after {taken}: {detail}; still inconclusive: {still}")
        if not self.extensions:
            return f"more rounds: none taken ({detail})"
        return f"more rounds: {taken}; {detail}"



@dataclass
class ABRunSection(Section):
    """``ab_run``: the session. ``format`` of this section; the ``tolerance`` judged with (a fraction);
    ``interrupted``: the signal's name (None: it ran to its end); the sides that ``failed``; ``items`` in the suite;
    the ``pairs`` finished, in order; each side's description (``sides``, by name: ``a``, ``b``); per class the
    ``paired_drift`` (how far B/A moved from first to last measurement, a fraction; None: not measured twice);
    ``notes``; the session's wall ``seconds`` and ``phase_seconds`` by phase."""

    format: int | None = None
    tolerance: float | None = None
    interrupted: str | None = None
    failed: list[str] = field(default_factory=list)
    items: int | None = None
    pairs: list[ABItem] = field(default_factory=list)
    sides: dict[str, ABSide] = field(default_factory=dict)
    paired_drift: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float | None = None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    more_rounds: MoreRounds | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = unset_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"pairs": list_of(ABItem.from_json), "sides": object_of(ABSide.from_json),
                "more_rounds": MoreRounds.from_json}


@dataclass
class ABDocument(Record):
    """An A/B file (``kvcache ab --json``) at its top level, as its readers need it: the paired verdicts (``ab``, as
    written: :func:`read_ab_section` reads them), the session (``ab_run``) and side A's run (``side_a``); the other
    keys (pytest-benchmark's, side B's ``kv``) stay in ``extra`` (the run loader reads both sides as runs)."""

    ab: dict[str, Any] = field(default_factory=dict)
    ab_run: ABRunSection = field(default_factory=ABRunSection)
    side_a: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"ab_run": ABRunSection.from_json}

    @classmethod
    def read(cls, doc: Any, where: str) -> ABDocument | None:
        """The A/B file of a parsed JSON file; None when it is not one (no ``ab`` object: a plain run file);
        RecordError (one line naming ``where``) when its ``ab``, ``ab_run`` or ``side_a`` is malformed."""
        if not isinstance(doc, dict):
            return None
        found = cls.from_json(doc, where)
        return None if "ab" in found.absent else found

