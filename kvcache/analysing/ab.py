"""The judge of an A/B run (``kvcache ab``): side B against side A from points measured in pairs, back to back in one
session. No torch: two ``kv`` sections in, verdicts out.

Timed figures (per class):

- ``timed``: the ratio B/A of the slopes of step time against KV bytes (the seconds of timed passes, before the copy
  bandwidth turns them into passes: both sides share the machine in the same minutes, and a side whose copy is
  slower is slower), and ``intercept``: the ratio B/A of the fits' intercepts (ms per step with an empty cache);
- from every (class, context, round) point measured on both sides; the interval is a paired bootstrap
  (:func:`paired_ratios`): each resample draws, per context, rounds with replacement, the *same* rounds for both
  sides (a round's two points ran back to back: what slowed one slowed the other), and within each drawn point
  resamples its steps; deterministic (seed ``seed``).
- **regression** when the interval's lower bound is above ``1 + tolerance``; **improvement** when its upper bound is
  below ``1 / (1 + tolerance)`` (the same factor the other way: symmetric in log ratio, so a B as much faster as a
  regression would be slower); **pass** when the upper bound is at most ``1 + tolerance`` (shown no slower beyond
  the tolerance); otherwise **inconclusive** with the reason (the interval straddles the bound, A's fit does not
  grow, too few paired contexts, or drift that differs between the sides).
- Drift is each side's own (its first timed point measured again at its end). Drift the sides share cancels in a
  ratio of points measured back to back and changes no verdict; when the two sides' drifts differ by more than
  ``max_drift`` (``--kv-max-drift``), timed verdicts are inconclusive.

``ledger.<op>``: the same ratio per op of the per-op timed ledger (profiled steps, one (class, context) on both
sides back to back), steps resampled within each context; the ops are the rows of either side's ``kv.ledger``
(aggregate rows such as ``(other ops)`` and ``(profiled step)`` are not judged). An op under ``ledger_tolerance``
timed passes on both sides (its interval's upper bound) is a pass whatever its ratio (noise of a small op); an op
only one side has is a regression (B) or an improvement (A) when its lower bound is above ``ledger_tolerance``.

Counted passes and overhead are judged by the gate's own judge with A as the baseline
(:func:`kvcache.analysing.compare.judge_against`, compare's tolerances): ``counted`` and ``overhead`` (and any
other exact measure the gate judges, kept as it judged it).

Each verdict: ``status`` (:data:`STATUSES`), ``reason``, ``value`` (the ratio), ``allowed`` (``1 + tolerance``),
``ratio``, ``ratio_ci`` [low, high], and ``a``, ``b``: the two sides' figures (timed passes, intercept ms).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvcache.analysing.stats import finite, median, percentile_interval

STATUSES = ("pass", "regression", "improvement", "inconclusive")
PAIRED = ("timed", "intercept", "ledger")  # judged here from the pairs; the gate's other measures are kept as judged
MIN_CONTEXTS = 2  # a slope needs two contexts; the suite's fit needs three (fit.MIN_CONTEXTS), a ratio does not


def verdict(status: str, reason: str, *, ratio: float | None = None, ci: tuple[float, float] | None = None,
            allowed: float | None = None, a: float | None = None, b: float | None = None) -> dict[str, Any]:
    """One paired verdict in the judge's shape plus the ratio and its interval."""
    return {"status": status, "reason": reason, "value": finite(ratio), "allowed": allowed, "ratio": finite(ratio),
            "ratio_ci": [finite(ci[0]), finite(ci[1])] if ci else None, "a": finite(a), "b": finite(b)}


# --- pairing ------------------------------------------------------------------------------------------------------


def paired_points(kv_a: dict[str, Any], kv_b: dict[str, Any], cache: str) -> dict[int, list[dict[str, Any]]]:
    """{context: [{round, kv_bytes, a: [step s], b: [step s]}]} of the timed points both sides measured."""
    def points(kv: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
        return {(int(p["context"]), int(p.get("round", 0))): p for p in kv.get("points") or []
                if p.get("cache") == cache and p.get("samples_ms")}
    pa, pb = points(kv_a), points(kv_b)
    out: dict[int, list[dict[str, Any]]] = {}
    for key in sorted(set(pa) & set(pb)):
        out.setdefault(key[0], []).append({
            "round": key[1], "kv_bytes": float(pa[key]["kv_bytes"]),
            "a": [x / 1e3 for x in pa[key]["samples_ms"]], "b": [x / 1e3 for x in pb[key]["samples_ms"]]})
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


def paired_ratios(pairs: dict[int, list[dict[str, Any]]], *, resamples: int, seed: int) -> dict[str, Any]:
    """Slopes (s per KV byte) and intercepts (s) of both sides from the points' medians, and ``resamples`` paired
    bootstrap draws of each (see the module docstring): ``{"a": (slope, intercept), "b": ..., "draws": {"a": (slopes,
    intercepts), "b": ...}}``."""
    rng = np.random.default_rng(seed)
    contexts = sorted(pairs)
    xs, ys = [], {"a": [], "b": []}
    for c in contexts:
        for p in pairs[c]:
            xs.append(p["kv_bytes"])
            for side in ("a", "b"):
                ys[side].append(median(p[side]))
    x = np.asarray(xs, dtype=float)[None, :]
    point = {side: tuple(float(v[0]) for v in _lines(x, np.asarray(ys[side], dtype=float)[None, :]))
             for side in ("a", "b")}
    draws: dict[str, list[np.ndarray]] = {"a": [], "b": []}
    bx: list[np.ndarray] = []
    for c in contexts:
        rounds = pairs[c]
        picks = rng.integers(0, len(rounds), size=(resamples, len(rounds)))  # the same rounds for both sides
        for side in ("a", "b"):
            med = np.stack([_medians(p[side], resamples, rng) for p in rounds], axis=1)  # (resamples, rounds)
            draws[side].append(np.take_along_axis(med, picks, axis=1))
        bx.append(np.full((resamples, len(rounds)), rounds[0]["kv_bytes"]))
    x_draws = np.concatenate(bx, axis=1)
    lines = {side: _lines(x_draws, np.concatenate(draws[side], axis=1)) for side in ("a", "b")}
    return {"a": point["a"], "b": point["b"], "draws": lines}


def _ratio_verdict(a: float, b: float, a_draws: np.ndarray, b_draws: np.ndarray, *, what: str, tolerance: float,
                   confidence: float, problems: list[str],
                   figures: tuple[float | None, float | None]) -> dict[str, Any]:
    """The verdict on B/A of one figure (``what``) from its point values and paired draws."""
    allowed = 1 + tolerance
    alpha = (1 - confidence) / 2
    bad = ~np.isfinite(a_draws) | (a_draws <= 0)
    ratio = b / a if a > 0 else None
    ci = None
    if a <= 0 or bad.mean() > alpha:
        problems = [f"A's {what} is not above zero in {bad.mean():.0%} of the resamples: no ratio", *problems]
    else:
        ci = percentile_interval(b_draws[~bad] / a_draws[~bad], 100 * alpha, 100 * (1 - alpha))
        if not all(math.isfinite(v) for v in ci):
            ci = None
            problems = ["no bootstrap interval for the ratio", *problems]
    if problems:
        return verdict("inconclusive", "; ".join(problems), ratio=ratio, ci=ci, allowed=allowed, a=figures[0],
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
    return verdict(status, reason, ratio=ratio, ci=ci, allowed=allowed, a=figures[0], b=figures[1])


# --- drift --------------------------------------------------------------------------------------------------------


def drift_of(kv: dict[str, Any]) -> float | None:
    return finite((kv.get("drift") or {}).get("fraction"))


def drift_problem(kv_a: dict[str, Any], kv_b: dict[str, Any], max_drift: float) -> str | None:
    """Why the two sides drifted differently (beyond ``max_drift`` apart), or None: shared drift is no problem."""
    fa, fb = drift_of(kv_a), drift_of(kv_b)
    if fa is None or fb is None:
        return None
    if abs(fb - fa) > max_drift:
        return (f"drift differs between the sides: A {fa:+.1%}, B {fb:+.1%} (more than ±{max_drift:.0%} apart, "
                "--kv-max-drift): one side's speed changed and not the other's")
    return None


# --- the judge ----------------------------------------------------------------------------------------------------


def _fit_figure(kv: dict[str, Any], cache: str, key: str) -> float | None:
    return finite(((kv.get("fit") or {}).get(cache) or {}).get(key))


def judge_timed(kv_a: dict[str, Any], kv_b: dict[str, Any], cache: str, *, tolerance: float, max_drift: float,
                resamples: int = 2000, seed: int = 0, confidence: float = 0.95) -> dict[str, dict[str, Any]]:
    """``{"timed": verdict, "intercept": verdict}`` of one class (see the module docstring)."""
    pairs = paired_points(kv_a, kv_b, cache)
    figures = {"timed": (_fit_figure(kv_a, cache, "passes"), _fit_figure(kv_b, cache, "passes")),
               "intercept": (_fit_figure(kv_a, cache, "intercept_ms"), _fit_figure(kv_b, cache, "intercept_ms"))}
    if len(pairs) < MIN_CONTEXTS:
        reason = (f"{len(pairs)} context(s) measured on both sides: a slope needs {MIN_CONTEXTS} or more"
                  if pairs or any(p.get("cache") == cache for p in kv_a.get("points") or []) else
                  "no timed point of this class was measured on both sides")
        return {m: verdict("inconclusive", reason, allowed=1 + tolerance, a=f[0], b=f[1]) for m, f in figures.items()}
    found = paired_ratios(pairs, resamples=resamples, seed=seed)
    drifted = drift_problem(kv_a, kv_b, max_drift)
    problems = [drifted] if drifted else []
    out = {}
    for measure, index, what in (("timed", 0, "slope"), ("intercept", 1, "intercept")):
        out[measure] = _ratio_verdict(found["a"][index], found["b"][index], found["draws"]["a"][index],
                                      found["draws"]["b"][index], what=what, tolerance=tolerance,
                                      confidence=confidence, problems=list(problems), figures=figures[measure])
    return out


def ledger_pairs(kv_a: dict[str, Any], kv_b: dict[str, Any], cache: str) -> dict[int, dict[str, Any]]:
    """{context: {kv_bytes, a: {op: [s per step]}, b: {...}}} of the ledger points both sides profiled."""
    def points(kv: dict[str, Any]) -> dict[int, dict[str, Any]]:
        return {int(p["context"]): p for p in kv.get("ledger_points") or [] if p.get("cache") == cache}
    pa, pb = points(kv_a), points(kv_b)
    return {c: {"kv_bytes": float(pa[c]["kv_bytes"]), "a": pa[c].get("ops_s") or {}, "b": pb[c].get("ops_s") or {}}
            for c in sorted(set(pa) & set(pb))}


def _ledger_row(kv: dict[str, Any], cache: str, op: str) -> dict[str, Any]:
    return ((kv.get("ledger") or {}).get(cache) or {}).get(op) or {}


def judge_ledger(kv_a: dict[str, Any], kv_b: dict[str, Any], cache: str, *, tolerance: float, ledger_tolerance: float,
                 max_drift: float, resamples: int = 2000, seed: int = 0,
                 confidence: float = 0.95) -> dict[str, dict[str, Any]]:
    """``{op: verdict}`` of one class's per-op ledger (see the module docstring); {} when not profiled on both."""
    pairs = ledger_pairs(kv_a, kv_b, cache)
    if len(pairs) < MIN_CONTEXTS:
        return {}
    rows = [*((kv_a.get("ledger") or {}).get(cache) or {}), *((kv_b.get("ledger") or {}).get(cache) or {})]
    ops = [op for op in dict.fromkeys(rows) if not op.startswith("(")]  # aggregates have no steps of their own
    drifted = drift_problem(kv_a, kv_b, max_drift)
    out = {}
    for n, op in enumerate(ops):
        ra, rb = _ledger_row(kv_a, cache, op), _ledger_row(kv_b, cache, op)
        figures = (finite(ra.get("timed")), finite(rb.get("timed")))
        upper = [finite((row.get("timed_ci") or [None, None])[1]) for row in (ra, rb)]
        lower = [finite((row.get("timed_ci") or [None, None])[0]) for row in (ra, rb)]
        present = [all(op in p[side] for p in pairs.values()) for side in ("a", "b")]
        if not present[0] or not present[1]:
            side, index = ("B", 1) if present[1] else ("A", 0)
            if lower[index] is not None and lower[index] > ledger_tolerance:
                status = "regression" if side == "B" else "improvement"
                out[op] = verdict(status, f"{op} runs on side {side} only, {figures[index]:.2f} timed passes "
                                          f"(above {ledger_tolerance:g}, --kv-ledger-tolerance)",
                                  allowed=1 + tolerance, a=figures[0], b=figures[1])
            else:
                out[op] = verdict("pass", f"{op} runs on side {side} only, under {ledger_tolerance:g} timed passes",
                                  allowed=1 + tolerance, a=figures[0], b=figures[1])
            continue
        as_points = {c: [{"round": 0, "kv_bytes": p["kv_bytes"], "a": p["a"][op], "b": p["b"][op]}]
                     for c, p in pairs.items()}
        found = paired_ratios(as_points, resamples=resamples, seed=seed + 1 + n)
        small = all(u is not None and u < ledger_tolerance for u in upper)
        judged = _ratio_verdict(found["a"][0], found["b"][0], found["draws"]["a"][0], found["draws"]["b"][0],
                                what="op slope", tolerance=tolerance, confidence=confidence,
                                problems=[drifted] if drifted and not small else [], figures=figures)
        if small and judged["status"] != "pass":
            judged.update(status="pass", reason=f"{op} is under {ledger_tolerance:g} timed passes on both sides "
                                                "(--kv-ledger-tolerance): its ratio is not judged")
        out[op] = judged
    return out


def judge(kv_a: dict[str, Any], kv_b: dict[str, Any], *, tolerance: float = 0.10, max_drift: float | None = None,
          ledger_tolerance: float | None = None, resamples: int | None = None, seed: int = 0,
          confidence: float | None = None, counted: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``ab`` section: ``{cache: {timed, intercept, ledger: {op: verdict}, counted?, overhead?}}`` for every class
    either side measured; rules not given come from side B's settings. ``counted``: the gate's verdicts of B with A
    as the baseline (compare's), whose measures other than :data:`PAIRED` (``counted``, ``overhead``, and any other
    exact measure the gate has) are kept as they are."""
    settings = kv_b.get("settings") or kv_a.get("settings") or {}
    max_drift = float(settings.get("max_drift", 0.10) if max_drift is None else max_drift)
    ledger_tolerance = float(settings.get("ledger_tolerance", 0.5) if ledger_tolerance is None else ledger_tolerance)
    resamples = int(settings.get("resamples", 2000) if resamples is None else resamples)
    confidence = float(settings.get("confidence", 0.95) if confidence is None else confidence)
    caches: dict[str, None] = {}
    for kv in (kv_a, kv_b):
        for p in kv.get("points") or []:
            caches.setdefault(str(p["cache"]))
        for name in kv.get("traffic") or {}:
            caches.setdefault(str(name))
    out: dict[str, Any] = {}
    for i, cache in enumerate(caches):
        entry: dict[str, Any] = judge_timed(kv_a, kv_b, cache, tolerance=tolerance, max_drift=max_drift,
                                            resamples=resamples, seed=seed + 1000 * i, confidence=confidence)
        entry["ledger"] = judge_ledger(kv_a, kv_b, cache, tolerance=tolerance, ledger_tolerance=ledger_tolerance,
                                       max_drift=max_drift, resamples=resamples, seed=seed + 1000 * i + 100,
                                       confidence=confidence)
        for measure, judged in ((counted or {}).get(cache) or {}).items():
            if measure not in PAIRED and isinstance(judged, dict):  # counted, overhead (and any exact measure)
                entry[measure] = dict(judged)
        out[cache] = entry
    return out


def statuses(ab: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every verdict of an ``ab`` section: ``(cache, measure, verdict)``, ledger ops as ``ledger.<op>``."""
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


def regressions(ab: dict[str, Any]) -> list[str]:
    """One line per regression of an ``ab`` section."""
    return [f"{cache} {measure}: {v.get('reason', '')}" for cache, measure, v in statuses(ab)
            if v.get("status") == "regression"]


# --- the terminal summary ---------------------------------------------------------------------------------------


def _num(value: Any, spec: str = ".2f") -> str:
    v = finite(value)
    return "—" if v is None else format(v, spec)


def _ratio_text(v: dict[str, Any]) -> str:
    ratio, ci = finite(v.get("ratio")), v.get("ratio_ci") or [None, None]
    if ratio is None:
        return "—"
    text = f"×{ratio:.3f}"
    if finite(ci[0]) is not None and finite(ci[1]) is not None:
        text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return text


def summary_rows(ab: dict[str, Any]) -> list[list[str]]:
    """Rows ``[class, measure, A, B, B/A [interval], verdict]`` (ledger ops that passed are left out)."""
    rows = []
    for cache, measure, v in statuses(ab):
        if measure.startswith("ledger.") and v.get("status") == "pass":
            continue
        if measure not in PAIRED and not measure.startswith("ledger."):  # exact: B's value and the allowed one
            a, b, ratio = "", _num(v.get("value")), f"allowed {_num(v.get('allowed'))}"
        else:
            spec = ".1f" if measure == "intercept" else ".2f"
            a, b, ratio = _num(v.get("a"), spec), _num(v.get("b"), spec), _ratio_text(v)
        rows.append([cache, measure, a, b, ratio, str(v.get("status", ""))])
    return rows
