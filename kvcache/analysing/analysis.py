"""Session-end analysis: from the records a session's items produced to the ``kv`` section (fits, drift,
per-point bandwidth, verdicts), as a :class:`~kvcache.analysing.records.KV`. Analysing wing: numpy and stdlib only,
no torch.

The records are the suite's own (``kvcache.measuring.session`` makes them, the plugin gathers them from every
item's report, from xdist workers too): ``copy``, ``point`` (timed or drift, with every step's seconds),
``traffic``, ``skip``, ``failed`` and ``context`` (model and environment). Nothing here depends on what
pytest-benchmark keeps, so fits and verdicts are the same whatever its storage options.
"""

from __future__ import annotations

from typing import Any

from kvcache.analysing import baseline as baselines
from kvcache.analysing import gate, identity
from kvcache.analysing import ledger as ledgers
from kvcache.analysing.bandwidth import achieved_fraction, achieved_gbps, crossovers
from kvcache.analysing.fit import FitError, fit_passes, measure_drift
from kvcache.analysing.judges import drift_problem
from kvcache.analysing.records import (
    KV,
    Copy,
    CopyMeasurement,
    Drift,
    Environment,
    FitFailure,
    LedgerPoint,
    Memory,
    ModelGeometry,
    Point,
    PointCompile,
    PointRecord,
    Probe,
    RunSettings,
    Session,
    Skip,
    Traffic,
    UnmeasuredDrift,
    Verdict,
    jsonable,
)
from kvcache.analysing.rules import Rules
from kvcache.analysing.stats import median


def analyse(records: list[dict[str, Any]], settings: dict[str, Any], baseline: dict[str, Any],
            session: dict[str, Any]) -> KV:
    """The ``kv`` section of one run (docs/records.md), judged against ``baseline`` (a loaded baseline file, ``{}``
    for none). ``settings``: the run's ``--kv-*`` settings (``Settings.to_dict()``); ``session``: ``{interrupted,
    exit, failed}``. The caller writes it with ``KV.to_json``."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_type.setdefault(record["type"], []).append(record)
    context = by_type["context"][0] if by_type.get("context") else {"model": {}, "environment": {}}
    model, env = context["model"], context["environment"]
    timed = [Point.of(r, r["samples_s"]) for r in by_type.get("point", []) if r.get("kind") == "timed"]
    again = [Point.of(r, r["samples_s"]) for r in by_type.get("point", []) if r.get("kind") == "drift"]
    copies = by_type.get("copy", [])
    samples = [s for m in copies for s in m.get("samples_gbps", [])]
    copy_gbps = median(samples) if samples else None
    failed = sorted({r["cache"] for r in by_type.get("failed", []) if r.get("cache")})
    reasons = {r["cache"]: str(r["reason"]) for r in by_type.get("failed", []) if r.get("cache") and r.get("reason")}
    traffic = by_type.get("traffic", [])
    kv = KV(
        settings=RunSettings.from_json(settings, "kv.settings"),
        environment=Environment.from_json(env, "kv.environment"), model=ModelGeometry.from_json(model, "kv.model"),
        copy_gbps=copy_gbps, copy=_copy_section(copies),
        traffic={r["cache"]: Traffic.from_json(jsonable(r["traffic"]), f"traffic of {r['cache']}") for r in traffic},
        probe={r["cache"]: Probe.from_json(jsonable(r["probe"]), f"probe of {r['cache']}")
               for r in traffic if r.get("probe")},
        memory={r["cache"]: Memory.from_json(jsonable(r["memory"]), f"memory of {r['cache']}")
                for r in traffic if isinstance(r.get("memory"), dict)},
        skipped=_skips(by_type.get("skip", [])), points=_points_section(timed, copy_gbps),
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
    profiled = [LedgerPoint.from_json({k: v for k, v in r.items() if k != "type"}, "ledger record")
                for r in by_type.get("ledger", [])]
    if profiled:
        kv.ledger_points = profiled
        kv.ledger, kv.ledger_errors = ledgers.analyse(profiled, samples, kv.traffic, kv.settings)
        kv.speed = ledgers.speed(profiled)
    elif kv.settings.compile not in (None, "off") and kv.settings.ledger_steps:
        kv.ledger_errors = {c: f"not profiled under --kv-compile {kv.settings.compile}: the ledger times eager ATen "
                               "ops, a compiled step runs fused kernels" for c in kv.traffic}
    kv.drift = _drift_section(timed, again, kv.settings.max_drift)
    kv.verdict = judge(kv, baseline)
    return kv


def judge(kv: KV, baseline: dict[str, Any], **rules: Any) -> dict[str, dict[str, Verdict]]:
    """The verdicts of a run's ``kv`` section against a baseline file's contents (the session-end gate), by the
    run's own rules (``kv.settings``), each rule in ``rules`` replacing the run's."""
    entries, keys = baselines.for_run(baseline, identity.of_run(kv))
    return gate.judge_run(kv, entries, Rules.from_settings(kv.settings, **rules), keys)


def failures(kv: KV) -> list[str]:
    """One line per reason the build fails (see :func:`kvcache.analysing.gate.failures`)."""
    return gate.failures(kv.verdict, drift=kv.drift, strict=bool(kv.settings.strict))


def warnings(kv: KV) -> list[str]:
    """Loud lines that do not fail the build: drift beyond its limit (unless --kv-strict made it a failure)."""
    problem = drift_problem(kv.drift)
    if problem and not kv.settings.strict:
        return [f"kv-cache drift: {problem}; timed verdicts are inconclusive (the build does not fail on drift "
                "alone; --kv-strict makes it fail)"]
    return []


def _skips(records: list[dict[str, Any]]) -> list[Skip]:
    out: list[Skip] = []
    for r in records:
        entry = Skip(cache=r["cache"], context=r.get("context"), reason=r["reason"])
        if entry not in out:
            out.append(entry)
    return out


def _copy_section(measurements: list[dict[str, Any]]) -> Copy:
    return Copy(
        start_gbps=measurements[0]["gbps"] if measurements else None,
        end_gbps=measurements[-1]["gbps"] if len(measurements) > 1 else None,
        measurements=[CopyMeasurement.from_json({k: v for k, v in m.items() if k != "type"}, "copy")
                      for m in measurements],
    )


def _points_section(points: list[Point], copy_gbps: float | None) -> list[PointRecord]:
    """Per point: median step, every step (ms), and the achieved bandwidth (:func:`achieved_gbps`) with its
    share of the session's median copy bandwidth (:func:`achieved_fraction`)."""
    out = []
    for p in points:
        achieved = achieved_gbps(p.counted_bytes, p.median_s)
        out.append(PointRecord(
            cache=p.cache, context=p.context, round=p.round, median_ms=p.median_s * 1e3,
            samples_ms=[s * 1e3 for s in p.samples_s], kv_bytes=p.kv_bytes, counted_bytes=p.counted_bytes,
            achieved_gbps=achieved, achieved_fraction=achieved_fraction(achieved, copy_gbps),
            beyond_trained_context=p.beyond_trained_context, name=p.name,
            compiled=None if p.compiled is None else PointCompile.from_json(jsonable(p.compiled), "point compiled"),
            kv_bytes_allocated=p.kv_bytes_allocated,
            absent=frozenset(name for name in ("compiled", "kv_bytes_allocated") if getattr(p, name) is None),
        ))
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
