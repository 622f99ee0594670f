"""The judge of an A/B run (``kvcache ab``): side B against side A from points measured in pairs, back to back in one
session; two ``kv`` sections in, the ``ab`` section out (``timed``, ``intercept`` and ``ledger.<op>`` by the B/A
ratio with a paired bootstrap interval, :func:`paired_ratios`, drift that differs between the sides by
:func:`paired_drift`; ``counted`` and ``overhead`` by compare's judge with A as the baseline). The rules: docs/ab.md
("The judge"). No torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvcache.analysing.estimates import finite, median, percentile_interval
from kvcache.analysing.fit import context_draws
from kvcache.analysing.options import CONFIDENCE, RESAMPLES, RULE_DEFAULTS
from kvcache.analysing.records import KV, Drift, Fit, LedgerPoint, LedgerRow, Verdict
from kvcache.analysing.records.ab_document import PAIRED, PairedVerdict
from kvcache.analysing.records.jsonrecord import Record
from kvcache.analysing.tables import MISSING, figure, num

MIN_PAIRED_CONTEXTS = 2  # a slope needs two contexts; the suite's fit needs three (fit.MIN_CONTEXTS), a ratio does not


def paired_verdict(status: str, reason: str, *, ratio: float | None = None, ci: tuple[float, float] | None = None,
                   allowed: float | None = None, a: float | None = None, b: float | None = None) -> PairedVerdict:
    """One paired verdict, its figures finite or None."""
    return PairedVerdict(status, reason, finite(ratio), allowed, finite(ratio),
                         [finite(ci[0]), finite(ci[1])] if ci else None, finite(a), finite(b))


# --- pairing ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PointPair:
    """One point measured on both sides back to back: its round, KV bytes held, and each side's step times (s)."""

    round: int
    kv_bytes: float
    a: list[float]
    b: list[float]


def paired_points(kv_a: KV, kv_b: KV, cache: str) -> dict[int, list[PointPair]]:
    """{context: [PointPair per round]} of the timed points of ``cache`` both sides measured."""
    def points(kv: KV) -> dict[tuple[int, int], Any]:
        return {(int(p.context), int(p.round)): p for p in kv.points if p.cache == cache and p.samples_ms}
    pa, pb = points(kv_a), points(kv_b)
    out: dict[int, list[PointPair]] = {}
    for key in sorted(set(pa) & set(pb)):
        out.setdefault(key[0], []).append(PointPair(key[1], float(pa[key].kv_bytes),
                                                    [x / 1e3 for x in pa[key].samples_ms],
                                                    [x / 1e3 for x in pb[key].samples_ms]))
    return out
def _lines(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slope and intercept of each row of ``y`` (shape (n, k)) against ``x`` (shape (n, k))."""
    xm, ym = x.mean(axis=1, keepdims=True), y.mean(axis=1, keepdims=True)
    sxx = ((x - xm) ** 2).sum(axis=1)
    slope = np.where(sxx > 0, ((x - xm) * (y - ym)).sum(axis=1) / np.where(sxx > 0, sxx, 1), np.nan)
    return slope, ym[:, 0] - slope * xm[:, 0]


def _medians(samples: list[float], count: int, rng: np.random.Generator) -> np.ndarray:
    values = np.asarray(samples, dtype=float)
    picks = rng.integers(0, values.size, size=(count, values.size))
    return np.median(values[picks], axis=1)


def paired_ratios(pairs: dict[int, list[PointPair]], *, resamples: int, seed: int) -> dict[str, Any]:
    """Slopes (s per KV byte) and intercepts (s) of both sides from the points' medians, and ``resamples`` paired
    bootstrap draws of each (see the module docstring): ``{"a": (slope, intercept), "b": ..., "draws": {"a": (slopes,
    intercepts), "b": ...}}``."""
    rng = np.random.default_rng(seed)
    contexts = sorted(pairs)
    xs, ys = [], {"a": [], "b": []}
    for c in contexts:
        for p in pairs[c]:
            xs.append(p.kv_bytes)
            for side in ("a", "b"):
                ys[side].append(median(getattr(p, side)))
    x = np.asarray(xs, dtype=float)[None, :]
    point = {side: tuple(float(v[0]) for v in _lines(x, np.asarray(ys[side], dtype=float)[None, :]))
             for side in ("a", "b")}
    draws: dict[str, list[np.ndarray]] = {"a": [], "b": []}
    bx: list[np.ndarray] = []
    for c in contexts:
        rounds = pairs[c]
        picks = rng.integers(0, len(rounds), size=(resamples, len(rounds)))  # the same rounds for both sides
        for side in ("a", "b"):
            med = np.stack([_medians(getattr(p, side), resamples, rng) for p in rounds], axis=1)  # (resamples, rounds)
            draws[side].append(np.take_along_axis(med, picks, axis=1))
        bx.append(np.full((resamples, len(rounds)), rounds[0].kv_bytes))
    x_draws = np.concatenate(bx, axis=1)
    y_draws = {side: np.concatenate(draws[side], axis=1) for side in ("a", "b")}
    if len(contexts) >= 2 and all(len(pairs[c]) == 1 for c in contexts):  # one pair per context: draw contexts too
        picks = context_draws(x_draws[0], resamples, rng)  # the same contexts for both sides
        x_draws = np.take_along_axis(x_draws, picks, axis=1)
        y_draws = {side: np.take_along_axis(y, picks, axis=1) for side, y in y_draws.items()}
    lines = {side: _lines(x_draws, y_draws[side]) for side in ("a", "b")}
    return {"a": point["a"], "b": point["b"], "draws": lines}


def _ratio_verdict(a: float, b: float, a_draws: np.ndarray, b_draws: np.ndarray, *, what: str, tolerance: float,
                   confidence: float, problems: list[str],
                   figures: tuple[float | None, float | None]) -> PairedVerdict:
    """The verdict on B/A of one figure (``what``) from its point values and paired draws."""
    allowed = 1 + tolerance
    alpha = (1 - confidence) / 2
    bad = ~np.isfinite(a_draws) | (a_draws <= 0)
    ratio = b / a if a > 0 else None
    ci = None
    # B's figure must be above zero too: a slope or an intercept at or below zero is no time (an intercept below zero
    # says the step's time bends upward with the context, the line through the contexts is not its cost), and a
    # ratio with it would call B "faster"
    b_bad = ~np.isfinite(b_draws) | (b_draws <= 0)
    if a <= 0 or bad.mean() > alpha:
        problems = [f"A's {what} is not above zero in {bad.mean():.0%} of the resamples: no ratio", *problems]
    elif b <= 0 or b_bad.mean() > alpha:
        problems = [f"B's {what} is not above zero in {b_bad.mean():.0%} of the resamples (the step time is "
                    "not a line through these contexts): no ratio", *problems]
    else:
        ci = percentile_interval(b_draws[~bad] / a_draws[~bad], 100 * alpha, 100 * (1 - alpha))
        if not all(math.isfinite(v) for v in ci):
            ci = None
            problems = ["no bootstrap interval for the ratio", *problems]
    if problems:
        return paired_verdict("inconclusive", "; ".join(problems), ratio=ratio, ci=ci, allowed=allowed, a=figures[0],
                       b=figures[1])
    assert ci is not None and ratio is not None
    lo, hi = ci
    described = f"B/A {what} ×{ratio:.3f} [{lo:.3f}, {hi:.3f}]"
    if lo > allowed:
        status, reason = "regression", f"{described}: B is slower, all of the interval above ×{allowed:.3f}"
    elif hi < 1 / allowed:
        status, reason = "improvement", f"{described}: B is faster, all of the interval below ×{1 / allowed:.3f}"
    elif hi <= allowed:
        status, reason = "pass", f"{described} is within ×{allowed:.3f}"
    else:
        status, reason = "inconclusive", (f"{described} straddles ×{allowed:.3f}; more rounds or steps would narrow "
                                          "it")
    return paired_verdict(status, reason, ratio=ratio, ci=ci, allowed=allowed, a=figures[0], b=figures[1])


# --- drift --------------------------------------------------------------------------------------------------------


def side_drift(kv: KV) -> float | None:
    """The side's drift: its first timed point measured again at its end, last / first - 1; None when unmeasured."""
    return finite(kv.drift.fraction) if isinstance(kv.drift, Drift) else None


def _ratio_of_medians(a: float | None, b: float | None) -> float | None:
    return b / a if a is not None and b is not None and a > 0 and b > 0 else None


def paired_drift(kv_a: KV, kv_b: KV, cache: str) -> float | None:
    """How much the sides' speeds moved apart over the session, for ``cache``: per context measured on both sides,
    the paired ratios B/A (medians of points measured back to back) in the order they were measured (each round's;
    for the context of the drift check, its re-measurement at the end of the session last), and the change from
    the first half of them to the last half, ``median(last half) / median(first half) - 1`` (halves of
    ``n // 2`` ratios: with two rounds, the first ratio against the last); the median over contexts. None when no
    context was measured twice on both sides.

    Halves rather than the first and the last ratio alone: when more rounds are pooled (``kvcache ab
    --more-rounds-within``), each end is the median of more pairs, so a single pair slowed by a neighbour no
    longer decides, while a trend across the session still shows in full.

    Drift both sides share cancels in each ratio. The sides' separate drifts (one re-measured point each) are
    reported but not judged (docs/ab.md, "Notes"); the median over contexts of the paired change is what is."""
    changes = []
    ends = {side: kv.drift if isinstance(kv.drift, Drift) and kv.drift.cache == cache else None
            for side, kv in (("a", kv_a), ("b", kv_b))}
    for context, pairs in paired_points(kv_a, kv_b, cache).items():
        ratios = [_ratio_of_medians(median(pair.a), median(pair.b)) for pair in pairs]
        da, db = ends["a"], ends["b"]
        if da is not None and db is not None and da.context == context == db.context:
            ratios.append(_ratio_of_medians(finite(da.last_ms), finite(db.last_ms)))
        half = len(ratios) // 2
        first, last = ratios[:half], ratios[len(ratios) - half:]
        if half and None not in first and None not in last:
            changes.append(float(np.median(last)) / float(np.median(first)) - 1)
    return float(np.median(changes)) if changes else None


def paired_drift_problem(kv_a: KV, kv_b: KV, cache: str, max_drift: float) -> str | None:
    """Why the two sides' speeds moved apart during the session (:func:`paired_drift` beyond ``max_drift``), or
    None: shared drift is no problem."""
    moved = paired_drift(kv_a, kv_b, cache)
    if moved is None or abs(moved) <= max_drift:
        return None
    fa, fb = side_drift(kv_a), side_drift(kv_b)
    sides = "" if fa is None or fb is None else f"; each side's own drift A {fa:+.1%}, B {fb:+.1%}"
    return (f"drift differs between the sides: the paired ratio B/A moved {moved:+.1%} from first to last "
            f"measurement (median over contexts; beyond ±{max_drift:.0%}, --kv-max-drift){sides}")


# --- the judge ----------------------------------------------------------------------------------------------------


def _fit_figure(kv: KV, cache: str, key: str) -> float | None:
    """``passes`` or ``intercept_ms`` of the side's fit of ``cache``; None when it has no fit with a figure."""
    fit = kv.fit.get(cache)
    return finite(getattr(fit, key)) if isinstance(fit, Fit) else None


def judge_paired_timed(kv_a: KV, kv_b: KV, cache: str, *, tolerance: float, max_drift: float,
                       resamples: int = RESAMPLES, seed: int = 0,
                       confidence: float = CONFIDENCE) -> dict[str, PairedVerdict]:
    """``{"timed": verdict, "intercept": verdict}`` of one class (see the module docstring)."""
    pairs = paired_points(kv_a, kv_b, cache)
    figures = {"timed": (_fit_figure(kv_a, cache, "passes"), _fit_figure(kv_b, cache, "passes")),
               "intercept": (_fit_figure(kv_a, cache, "intercept_ms"), _fit_figure(kv_b, cache, "intercept_ms"))}
    if len(pairs) < MIN_PAIRED_CONTEXTS:
        reason = (f"{len(pairs)} context(s) measured on both sides: a slope needs {MIN_PAIRED_CONTEXTS} or more"
                  if pairs or any(p.cache == cache for p in kv_a.points) else
                  "no timed point of this class was measured on both sides")
        return {m: paired_verdict("inconclusive", reason, allowed=1 + tolerance, a=f[0], b=f[1])
                for m, f in figures.items()}
    found = paired_ratios(pairs, resamples=resamples, seed=seed)
    drifted = paired_drift_problem(kv_a, kv_b, cache, max_drift)
    problems = [drifted] if drifted else []
    out = {}
    for measure, index, what in (("timed", 0, "slope"), ("intercept", 1, "intercept")):
        out[measure] = _ratio_verdict(found["a"][index], found["b"][index], found["draws"]["a"][index],
                                      found["draws"]["b"][index], what=what, tolerance=tolerance,
                                      confidence=confidence, problems=list(problems), figures=figures[measure])
    return out


def ledger_pairs(kv_a: KV, kv_b: KV, cache: str) -> dict[int, tuple[LedgerPoint, LedgerPoint]]:
    """{context: (A's ledger point, B's)} of the (cache, context) points both sides profiled."""
    def points(kv: KV) -> dict[int, LedgerPoint]:
        return {int(p.context): p for p in kv.ledger_points if p.cache == cache}
    pa, pb = points(kv_a), points(kv_b)
    return {c: (pa[c], pb[c]) for c in sorted(set(pa) & set(pb))}


def _ledger_rows(kv: KV, cache: str) -> dict[str, LedgerRow]:
    """The side's per-op ledger of ``cache``, {op: row}; empty when it has none."""
    return kv.ledger[cache] if cache in kv.ledger else {}


def _bound(row: LedgerRow | None, index: int) -> float | None:
    """The lower (0) or upper (1) bound of a ledger row's timed passes interval, None when unknown."""
    bounds = row.timed_ci if row is not None else None
    return finite(bounds[index]) if isinstance(bounds, list) and len(bounds) == 2 else None


def judge_paired_ledger(kv_a: KV, kv_b: KV, cache: str, *, tolerance: float, ledger_tolerance: float,
                        max_drift: float, resamples: int = RESAMPLES, seed: int = 0,
                        confidence: float = CONFIDENCE) -> dict[str, PairedVerdict]:
    """``{op: verdict}`` of one class's per-op ledger (see the module docstring); {} when not profiled on both."""
    pairs = ledger_pairs(kv_a, kv_b, cache)
    if len(pairs) < MIN_PAIRED_CONTEXTS:
        return {}
    rows_a, rows_b = _ledger_rows(kv_a, cache), _ledger_rows(kv_b, cache)
    ops = [op for op in dict.fromkeys([*rows_a, *rows_b]) if not op.startswith("(")]  # aggregates: no steps
    drifted = paired_drift_problem(kv_a, kv_b, cache, max_drift)
    out = {}
    for n, op in enumerate(ops):
        ra, rb = rows_a.get(op), rows_b.get(op)
        figures = (finite(ra.timed) if ra else None, finite(rb.timed) if rb else None)
        lower = [_bound(row, 0) for row in (ra, rb)]
        present = [all(op in pair[side].ops_s for pair in pairs.values()) for side in (0, 1)]
        if not present[0] or not present[1]:
            side, index = ("B", 1) if present[1] else ("A", 0)
            if lower[index] is not None and lower[index] > ledger_tolerance:
                status = "regression" if side == "B" else "improvement"
                out[op] = paired_verdict(status, f"{op} runs on side {side} only, {figures[index]:.2f} timed passes "
                                          f"(above {ledger_tolerance:g}, --kv-ledger-tolerance)",
                                  allowed=1 + tolerance, a=figures[0], b=figures[1])
            else:
                out[op] = paired_verdict("pass", f"{op} runs on side {side} only, under {ledger_tolerance:g} timed "
                                                 "passes",
                                  allowed=1 + tolerance, a=figures[0], b=figures[1])
            continue
        as_points = {c: [PointPair(0, a.kv_bytes, a.ops_s[op], b.ops_s[op])] for c, (a, b) in pairs.items()}
        found = paired_ratios(as_points, resamples=resamples, seed=seed + 1 + n)
        # small: shown above ledger_tolerance timed passes on neither side (a side with no row of its own folded the
        # op into "(other ops)": under ledger.KEEP); a weight op's time, which does not grow with the cache, is one
        small = not any(bound is not None and bound > ledger_tolerance for bound in lower)
        judged = _ratio_verdict(found["a"][0], found["b"][0], found["draws"]["a"][0], found["draws"]["b"][0],
                                what="op slope", tolerance=tolerance, confidence=confidence,
                                problems=[drifted] if drifted and not small else [], figures=figures)
        if small and judged.status != "pass":
            judged = replace(judged, status="pass", reason=f"{op} is not shown above {ledger_tolerance:g} timed "
                             "passes on either side (--kv-ledger-tolerance): its ratio is not judged")
        out[op] = judged
    return out


def judge(kv_a: KV, kv_b: KV, *, tolerance: float = RULE_DEFAULTS["tolerance"], max_drift: float | None = None,
          ledger_tolerance: float | None = None, resamples: int | None = None, seed: int = 0,
          confidence: float | None = None,
          counted: dict[str, dict[str, Verdict]] | None = None) -> dict[str, dict[str, Record]]:
    """The verdicts of the ``ab`` section: ``{cache: {timed, intercept, ledger.<op>..., counted?, overhead?}}`` for
    every class either side measured, as records (:func:`kvcache.analysing.records.ab_document.ab_section_json` writes
    them); rules not given come from side B's settings (else A's; else the defaults).
    ``counted``: the gate's verdicts of B with A as the baseline (:func:`kvcache.analysing.compare.judge_against`),
    whose measures other than :data:`PAIRED` (``counted``, ``overhead``, and any other exact measure the gate has) are
    kept as they are."""
    settings = kv_b.settings if kv_b.settings.to_json() else kv_a.settings

    def rule(given: float | None, recorded: float | None, default: float) -> float:
        return given if given is not None else recorded if recorded is not None else default

    max_drift = float(rule(max_drift, settings.max_drift, RULE_DEFAULTS["max_drift"]))
    ledger_tolerance = float(rule(ledger_tolerance, settings.ledger_tolerance, RULE_DEFAULTS["ledger_tolerance"]))
    resamples = int(rule(resamples, settings.resamples, RESAMPLES))
    confidence = float(rule(confidence, settings.confidence, CONFIDENCE))
    caches: dict[str, None] = {}
    for kv in (kv_a, kv_b):
        caches.update(dict.fromkeys(str(p.cache) for p in kv.points))
        caches.update(dict.fromkeys(str(name) for name in kv.traffic))
    out: dict[str, dict[str, Record]] = {}
    for i, cache in enumerate(caches):
        timed = judge_paired_timed(kv_a, kv_b, cache, tolerance=tolerance, max_drift=max_drift, resamples=resamples,
                                   seed=seed + 1000 * i, confidence=confidence)
        ledger = judge_paired_ledger(kv_a, kv_b, cache, tolerance=tolerance, ledger_tolerance=ledger_tolerance,
                                     max_drift=max_drift, resamples=resamples, seed=seed + 1000 * i + 100,
                                     confidence=confidence)
        entry: dict[str, Record] = {**timed, **{f"ledger.{op}": v for op, v in ledger.items()}}
        if counted and cache in counted:  # counted, overhead (and any exact measure), as the gate judged them
            entry.update({m: v for m, v in counted[cache].items() if m not in PAIRED})
        out[cache] = entry
    return out



def regressions(verdicts: dict[str, dict[str, Any]]) -> list[str]:
    """One line per regression of an ``ab`` section's verdicts (:func:`judge`, or
    :func:`~kvcache.analysing.records.ab_document.read_ab_section` of a file's)."""
    return [f"{cache} {measure}: {v.reason}" for cache, measures in verdicts.items()
            for measure, v in measures.items() if v.status == "regression"]


# --- the terminal summary ---------------------------------------------------------------------------------------


def ratio_text(v: PairedVerdict) -> str:
    """A paired verdict's ratio B/A and its interval: ``×1.234 [1.100, 1.300]``; the missing mark when it has none."""
    return MISSING if finite(v.ratio) is None else "×" + figure(v.ratio, v.ratio_ci, ".3f")


def summary_rows(verdicts: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Rows ``[class, measure, A, B, B/A [interval], verdict]`` of an ``ab`` section's verdicts (ledger ops that
    passed are left out)."""
    rows = []
    for cache, measures in verdicts.items():
        for measure, v in measures.items():
            if measure.startswith("ledger.") and v.status == "pass":
                continue
            if measure not in PAIRED and not measure.startswith("ledger."):  # exact: B's value and the allowed one
                a, b, ratio = "", num(v.value), f"allowed {num(v.allowed)}"
            else:
                spec = ".1f" if measure == "intercept" else ".2f"
                a, b, ratio = num(v.a, spec), num(v.b, spec), ratio_text(v)
            rows.append([cache, measure, a, b, ratio, v.status])
    return rows
