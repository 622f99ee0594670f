"""Session-end analysis: from the records a session's items produced to the ``kv`` section (fits, drift,
per-point bandwidth, verdicts). Analysing wing: numpy and stdlib only, no torch.

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
from kvcache.analysing.fit import FitError, crossover_context, fit_passes, measure_drift
from kvcache.analysing.records import (
    KV,
    Copy,
    CopyMeasurement,
    Drift,
    Fit,
    FitFailure,
    LedgerPoint,
    LedgerRow,
    Point,
    PointRecord,
    Probe,
    Session,
    Skip,
    Traffic,
    UnmeasuredDrift,
    Verdict,
)
from kvcache.analysing.stats import finite, median


def point_of(record: dict[str, Any]) -> Point:
    return Point(cache=str(record["cache"]), context=int(record["context"]), round=int(record.get("round", 0)),
                 kv_bytes=float(record["kv_bytes"]), samples_s=tuple(float(s) for s in record["samples_s"]),
                 beyond_trained_context=bool(record.get("beyond_trained_context")),
                 counted_bytes=record.get("counted_bytes"), name=str(record.get("name", "")),
                 compiled=record.get("compiled"), kv_bytes_allocated=record.get("kv_bytes_allocated"))


def analyse(records: list[dict[str, Any]], settings: dict[str, Any], baseline: dict[str, Any],
            session: dict[str, Any]) -> dict[str, Any]:
    """The ``kv`` section (see :mod:`kvcache.analysing.records`) of one run, built as a :class:`KV` and written by
    its ``to_json``. ``session``: ``{interrupted, exit, failed}``."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_type.setdefault(record["type"], []).append(record)
    context = (by_type.get("context") or [{}])[0]
    model, env = context.get("model") or {}, context.get("environment") or {}
    timed = [r for r in by_type.get("point", []) if r.get("kind") == "timed"]
    points = [point_of(r) for r in timed]
    copies = by_type.get("copy", [])
    samples = [s for m in copies for s in m.get("samples_gbps", [])]
    copy_gbps = median(samples) if samples else None
    failed = sorted({r["cache"] for r in by_type.get("failed", []) if r.get("cache")})
    traffic = by_type.get("traffic", [])
    kv = KV(
        settings=settings, environment=env, model=model, copy_gbps=copy_gbps, copy=_copy_section(copies),
        traffic={r["cache"]: Traffic.from_json(r["traffic"], f"traffic of {r['cache']}") for r in traffic},
        probe={r["cache"]: Probe.from_json(r["probe"], f"probe of {r['cache']}") for r in traffic if r.get("probe")},
        memory={r["cache"]: r["memory"] for r in traffic if isinstance(r.get("memory"), dict)},
        skipped=_skips(by_type.get("skip", [])), points=_points_section(points, copy_gbps),
        session=Session.from_json({**session, "failed": sorted({*session.get("failed", []), *failed})}, "session"),
        identity=identity.of_run({"environment": env, "settings": settings}),
    )
    for cache in dict.fromkeys(p.cache for p in points):
        mine = [p for p in points if p.cache == cache]
        try:
            if not samples:
                raise FitError("no copy bandwidth was measured in this run (its test was deselected, skipped or "
                               "failed), so latency cannot be turned into passes")
            kv.fit[cache] = Fit.from_json(fit_passes(
                mine, samples, bytes_per_token=model["bytes_per_token"], weight_bytes=model["weight_bytes"],
                confidence=settings["confidence"], resamples=settings["resamples"], seed=settings["seed"]).to_dict())
        except FitError as exc:
            kv.fit[cache] = FitFailure(error=str(exc), n_points=len(mine))
    kv.extra["crossovers"] = crossovers(model, {c: f.to_json() for c, f in kv.fit.items()},
                                        {c: t.to_json() for c, t in kv.traffic.items()}, kv.memory)
    profiled = [{k: v for k, v in r.items() if k != "type"} for r in by_type.get("ledger", [])]
    if profiled:
        kv.ledger_points = [LedgerPoint.from_json(r, "ledger record") for r in profiled]
        found, kv.ledger_errors = ledgers.analyse(profiled, samples, {c: t.to_json() for c, t in kv.traffic.items()},
                                                  settings)
        kv.ledger = {c: {op: LedgerRow.from_json(row, f"ledger of {c}") for op, row in rows.items()}
                     for c, rows in found.items()}
        kv.speed = ledgers.speed(profiled)
    elif settings.get("compile", "off") != "off" and settings.get("ledger_steps"):
        kv.ledger_errors = {c: f"not profiled under --kv-compile {settings['compile']}: the ledger times eager ATen "
                               "ops, a compiled step runs fused kernels" for c in kv.traffic}
    drift = [point_of(r) for r in by_type.get("point", []) if r.get("kind") == "drift"]
    kv.drift = _drift_section(points, drift, settings["max_drift"])
    kv.verdict = {cache: {measure: Verdict.from_json(verdict, f"verdict of {cache}: {measure}")
                          for measure, verdict in by_measure.items()}
                  for cache, by_measure in judge(kv.to_json(), baseline).items()}
    return kv.to_json()


def judge(kv: dict[str, Any], baseline: dict[str, Any], **rules: Any) -> dict[str, Any]:
    """The verdicts of a run's ``kv`` section against a baseline file's contents (the session-end gate)."""
    entries, keys = baselines.for_run(baseline, identity.of_run(kv))
    return gate.judge_run(kv, entries, gate.Rules.from_settings(kv["settings"], **rules), keys)


def failures(kv: dict[str, Any]) -> list[str]:
    """One line per reason the build fails (see :func:`kvcache.analysing.gate.failures`)."""
    settings = kv.get("settings") or {}
    return gate.failures(kv.get("verdict") or {}, drift=kv.get("drift"), strict=bool(settings.get("strict")))


def warnings(kv: dict[str, Any]) -> list[str]:
    """Loud lines that do not fail the build: drift beyond its limit (unless --kv-strict made it a failure)."""
    problem = gate.drift_problem(kv.get("drift"))
    if problem and not (kv.get("settings") or {}).get("strict"):
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


def achieved_gbps(counted_bytes: float | None, median_step_s: float | None) -> float | None:
    """Achieved bandwidth of a decode step in GB/s (1e9 bytes/s): its counted bytes (read + write) over its
    median time in seconds; None when either is missing or not positive."""
    moved, seconds = finite(counted_bytes), finite(median_step_s)
    return moved / seconds / 1e9 if moved and seconds and moved > 0 and seconds > 0 else None


def achieved_fraction(achieved: float | None, copy_gbps: float | None) -> float | None:
    """The achieved bandwidth's share of the copy bandwidth (both GB/s, read + write): memory-bandwidth
    utilisation. The analysis sets it against the session's median copy bandwidth (``kv.copy_gbps``), the
    same one the timed passes are; None when either is missing or not positive."""
    achieved, copy = finite(achieved), finite(copy_gbps)
    return achieved / copy if achieved and copy and achieved > 0 and copy > 0 else None


def crossovers(model: dict[str, Any], fits: dict[str, Any], traffic: dict[str, Any],
               memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """``kv.crossovers``: the context (tokens) at which the cache holds as many bytes as the weights (logical KV
    bytes), and per class the contexts at which a step's cache traffic equals one read of the weights, from the
    timed passes (``kv.fit``) and from the counted ones (``kv.traffic``), and at which the bytes the class really
    holds (``kv.memory.<cache>.held_passes`` × the logical KV bytes) equal the weights (``held_tokens``); None where
    there is no figure. One rule for all: :func:`kvcache.analysing.fit.crossover_context`."""
    weights, per_token = model.get("weight_bytes"), model.get("bytes_per_token")
    memory = memory or {}
    out: dict[str, Any] = {"cache_holds_weights_tokens": crossover_context(weights, per_token)}
    for cache in dict.fromkeys([*fits, *traffic]):
        timed = (fits.get(cache) or {}).get("passes")
        counted = (traffic.get(cache) or {}).get("passes")
        out[cache] = {"timed_tokens": crossover_context(weights, per_token, timed),
                      "counted_tokens": crossover_context(weights, per_token, counted)}
        held = (memory.get(cache) or {}).get("held_passes") if isinstance(memory.get(cache), dict) else None
        if held is not None:
            out[cache]["held_tokens"] = crossover_context(weights, per_token, held)
    return out


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
            compiled=p.compiled, kv_bytes_allocated=p.kv_bytes_allocated,
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
    return Drift.from_json(measure_drift(first, last, max_fraction).to_dict(), "drift")
