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
from kvcache.analysing.fit import FitError, fit_passes, measure_drift
from kvcache.analysing.records import SCHEMA, Point, jsonable, median


def point_of(record: dict[str, Any]) -> Point:
    return Point(cache=str(record["cache"]), context=int(record["context"]), round=int(record.get("round", 0)),
                 kv_bytes=float(record["kv_bytes"]), samples_s=tuple(float(s) for s in record["samples_s"]),
                 beyond_trained_context=bool(record.get("beyond_trained_context")),
                 counted_bytes=record.get("counted_bytes"), name=str(record.get("name", "")))


def analyse(records: list[dict[str, Any]], settings: dict[str, Any], baseline: dict[str, Any],
            session: dict[str, Any]) -> dict[str, Any]:
    """The ``kv`` section (:mod:`kvcache.analysing.records`) of a run; ``session``: ``{interrupted, exit, failed}``."""
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
    kv: dict[str, Any] = {
        "schema": SCHEMA, "settings": settings, "environment": env, "model": model, "copy_gbps": copy_gbps,
        "copy": _copy_section(copies), "fit": {}, "drift": None,
        "traffic": {r["cache"]: r["traffic"] for r in by_type.get("traffic", [])},
        "probe": {r["cache"]: r["probe"] for r in by_type.get("traffic", []) if r.get("probe")},
        "verdict": {}, "skipped": _skips(by_type.get("skip", [])),
        "points": _points_section(timed, copy_gbps),
        "session": {**session, "failed": sorted({*session.get("failed", []), *failed})},
    }
    kv["identity"] = identity.of_run(kv)
    for cache in dict.fromkeys(p.cache for p in points):
        mine = [p for p in points if p.cache == cache]
        try:
            if not samples:
                raise FitError("no copy bandwidth was measured in this run (its test was deselected, skipped or "
                               "failed), so latency cannot be turned into passes")
            kv["fit"][cache] = fit_passes(
                mine, samples, bytes_per_token=model["bytes_per_token"], weight_bytes=model["weight_bytes"],
                confidence=settings["confidence"], resamples=settings["resamples"], seed=settings["seed"]).to_dict()
        except FitError as exc:
            kv["fit"][cache] = {"error": str(exc), "n_points": len(mine)}
    drift = [point_of(r) for r in by_type.get("point", []) if r.get("kind") == "drift"]
    kv["drift"] = _drift_section(points, drift, settings["max_drift"])
    kv = jsonable(kv)
    kv["verdict"] = judge(kv, baseline)
    return kv


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


def _skips(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        entry = {"cache": r["cache"], "context": r.get("context"), "reason": r["reason"]}
        if entry not in out:
            out.append(entry)
    return out


def _copy_section(measurements: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "start_gbps": measurements[0]["gbps"] if measurements else None,
        "end_gbps": measurements[-1]["gbps"] if len(measurements) > 1 else None,
        "measurements": [{k: v for k, v in m.items() if k != "type"} for m in measurements],
    }


def _points_section(records: list[dict[str, Any]], copy_gbps: float | None) -> list[dict[str, Any]]:
    """Per point: median step, every step (ms), and the achieved bandwidth (counted bytes of the step /
    median time) against the session's copy bandwidth."""
    out = []
    for r in records:
        p = point_of(r)
        achieved = p.counted_bytes / p.median_s / 1e9 if p.counted_bytes else None
        out.append({
            "cache": p.cache, "context": p.context, "round": p.round, "median_ms": p.median_s * 1e3,
            "samples_ms": [s * 1e3 for s in p.samples_s], "kv_bytes": p.kv_bytes, "counted_bytes": p.counted_bytes,
            "achieved_gbps": achieved, "achieved_fraction": achieved / copy_gbps if achieved and copy_gbps else None,
            "beyond_trained_context": p.beyond_trained_context, "name": p.name,
        })
    return out


def _drift_section(points: list[Point], again: list[Point], max_fraction: float) -> dict[str, Any]:
    if not points:
        return {"reason": "no timed point was measured", "max_fraction": max_fraction}
    if not again:
        return {"reason": "the first point was not measured again (drift test deselected, skipped or failed)",
                "max_fraction": max_fraction}
    last = again[-1]
    first = next((p for p in points if p.cache == last.cache and p.context == last.context), None)
    if first is None:
        return {"reason": f"no first measurement of {last.cache} at {last.context}", "max_fraction": max_fraction}
    return measure_drift(first, last, max_fraction).to_dict()
