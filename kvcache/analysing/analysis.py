"""Session-end analysis: from the records a session's items produced (:mod:`kvcache.analysing.records.measured`,
gathered from every item's report, xdist workers included) to the ``kv`` section (fits, drift, per-point bandwidth,
verdicts), as a
:class:`~kvcache.analysing.records.KV`; nothing depends on what pytest-benchmark keeps. Numpy and stdlib, no torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvcache.analysing import ledger as ledgers
from kvcache.analysing.bandwidth import achieved_fraction, achieved_gbps, crossovers
from kvcache.analysing.estimates import median
from kvcache.analysing.fit import FitError, fit_passes, measure_drift
from kvcache.analysing.judge import baseline as baselines
from kvcache.analysing.judge import gate
from kvcache.analysing.judge.judges import drift_problem
from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.records import (
    KV,
    Copy,
    CopyMeasurement,
    Drift,
    Environment,
    FitFailure,
    LedgerPoint,
    ModelGeometry,
    Point,
    RunSettings,
    Session,
    Skip,
    UnmeasuredDrift,
    Verdict,
    identity,
)
from kvcache.analysing.records.file_formats import BaselineFile
from kvcache.analysing.records.jsonrecord import Record
from kvcache.analysing.records.measured import ClassCount, Context, Failed


def analyse(records: list[Record], settings: RunSettings, baseline: BaselineFile | None,
            session: dict[str, Any]) -> KV:
    """The ``kv`` section of one run (docs/records.md) from the records its measuring processes reported
    (:mod:`kvcache.analysing.records.measured`), judged against ``baseline`` (a loaded baseline file, None for none).
    ``settings``: the run's ``--kv-*`` settings (:func:`kvcache.analysing.records.identity.recorded_settings`);
    ``session``: ``{interrupted, exit, failed}``. The caller writes it with ``KV.to_json``."""
    contexts = [r for r in records if isinstance(r, Context)]
    model, env = (contexts[0].model, contexts[0].environment) if contexts else (ModelGeometry(), Environment())
    points = [r for r in records if isinstance(r, Point)]
    timed = [p for p in points if p.kind == "timed"]
    again = [p for p in points if p.kind == "drift"]
    copies = [r for r in records if isinstance(r, CopyMeasurement)]
    samples = [s for m in copies for s in m.samples_gbps]
    copy_gbps = median(samples) if samples else None
    failures = [r for r in records if isinstance(r, Failed)]
    failed = sorted({r.cache for r in failures if r.cache})
    reasons = {r.cache: str(r.reason) for r in failures if r.cache and r.reason}
    counted = [r for r in records if isinstance(r, ClassCount)]
    kv = KV(
        settings=settings, environment=env, model=model, copy_gbps=copy_gbps,
        copy=_copy_section(copies),
        traffic={r.cache: r.traffic for r in counted},
        probe={r.cache: r.probe for r in counted if r.probe is not None},
        memory={r.cache: r.memory for r in counted if r.memory is not None},
        skipped=_skips([r for r in records if isinstance(r, Skip)]), points=_points_section(timed, copy_gbps),
        session=Session.from_json({**session, "failed": sorted({*session.get("failed", []), *failed}),
                                  **({"reasons": reasons} if reasons else {})}, "session"),
    )
    kv.identity = identity.of(kv.environment, kv.settings)
    for cache in dict.fromkeys(p.cache for p in timed):
        mine = [p for p in timed if p.cache == cache]
        try:
            if not samples:
                raise FitError("no copy bandwidth was measured in this run (its test was deselected, skipped or "
                               "failed), so latency cannot be turned into passes")
            kv.fit[cache] = fit_passes(mine, samples, bytes_per_token=kv.model.bytes_per_token,
                                       weight_bytes=kv.model.weight_bytes, confidence=kv.settings.confidence,
                                       resamples=kv.settings.resamples, seed=kv.settings.seed)
        except FitError as exc:
            kv.fit[cache] = FitFailure(error=str(exc), n_points=len(mine))
    kv.crossovers = crossovers(kv.model, kv.fit, kv.traffic, kv.memory)
    profiled = [r for r in records if isinstance(r, LedgerPoint)]
    if profiled:
        kv.ledger_points = profiled
        kv.ledger, kv.ledger_errors = ledgers.ledger_rows(profiled, samples, kv.traffic, kv.settings)
        kv.speed = ledgers.speed(profiled)
    elif kv.settings.compile not in (None, "off") and kv.settings.ledger_steps:
        kv.ledger_errors = {c: f"not profiled under --kv-compile {kv.settings.compile}: the ledger times eager ATen "
                               "ops, a compiled step runs fused kernels" for c in kv.traffic}
    kv.drift = _drift_section(timed, again, kv.settings.max_drift)
    kv.verdict = run_verdicts(kv, baseline)
    return kv


def run_verdicts(kv: KV, baseline: BaselineFile | None, **rules: Any) -> dict[str, dict[str, Verdict]]:
    """The verdicts of a run's ``kv`` section against a baseline file's contents (the session-end gate), by the
    run's own rules (``kv.settings``), each rule in ``rules`` replacing the run's."""
    entries, keys = baselines.for_run(baseline, identity.of_run(kv))
    return gate.judge_run(kv, entries, Rules.from_settings(kv.settings, **rules), keys)


def gate_failures(kv: KV) -> list[str]:
    """One line per reason the build fails (see :func:`kvcache.analysing.judge.gate.failures`)."""
    return gate.failures(kv.verdict, drift=kv.drift, strict=bool(kv.settings.strict))


def warnings(kv: KV) -> list[str]:
    """Loud lines that do not fail the build: drift beyond its limit, a skipped class the baseline holds figures for
    (unless --kv-strict made them failures)."""
    out = []
    problem = drift_problem(kv.drift)
    if problem and not kv.settings.strict:
        out.append(f"kv-cache drift: {problem}; timed verdicts are inconclusive (the build does not fail on drift "
                   "alone; --kv-strict makes it fail)")
    if not kv.settings.strict:  # a skipped class the baseline holds: not judged, said aloud
        out += [f"kv-cache not-measured: {cache} {measure}: {v.reason}" for cache, measures in kv.verdict.items()
                for measure, v in measures.items() if gate.unmeasured_baselined(v)]
    return out


def _skips(records: list[Skip]) -> list[Skip]:
    out: list[Skip] = []
    for r in records:
        entry = Skip(cache=r.cache, context=r.context, reason=r.reason)
        if entry not in out:
            out.append(entry)
    return out


def _copy_section(measurements: list[CopyMeasurement]) -> Copy:
    return Copy(
        start_gbps=measurements[0].gbps if measurements else None,
        end_gbps=measurements[-1].gbps if len(measurements) > 1 else None,
        measurements=list(measurements),
    )


def _points_section(points: list[Point], copy_gbps: float | None) -> list[Point]:
    """``kv.points``: each timed point with its achieved bandwidth (:func:`achieved_gbps`, counted bytes over the
    median step) and that bandwidth's share of the session's median copy bandwidth (:func:`achieved_fraction`)."""
    out = []
    for p in points:
        achieved = achieved_gbps(p.counted_bytes, p.median_s)
        out.append(replace(p, achieved_gbps=achieved, achieved_fraction=achieved_fraction(achieved, copy_gbps),
                           extra={}, absent=frozenset(name for name in ("compiled", "kv_bytes_allocated", "kind",
                                                                        "tokens_per_step")
                                                      if name == "kind" or getattr(p, name) is None)))
    return out


def _drift_section(points: list[Point], again: list[Point], max_fraction: float) -> Drift | UnmeasuredDrift:
    if not points:
        return UnmeasuredDrift(reason="no timed point was measured", max_fraction=max_fraction)
    if not again:
        return UnmeasuredDrift(reason="the first point was not measured again (drift test deselected, skipped or "
                               "failed)", max_fraction=max_fraction)
    last = again[-1]
    first = next((p for p in points if p.cache == last.cache and p.context == last.context), None)
    if first is None:
        return UnmeasuredDrift(reason=f"no first measurement of {last.cache} at {last.context}",
                               max_fraction=max_fraction)
    return measure_drift(first, last, max_fraction)
