"""Session-end analysis: from the run's benchmarks and raw measurements to the ``kv`` section
(fits, drift, per-point bandwidth, verdicts). Analysing wing: numpy and stdlib only, no torch."""

from __future__ import annotations

from typing import Any

from kvcache import gate
from kvcache.fit import FitError, fit_passes, measure_drift
from kvcache.records import SCHEMA, Point, jsonable, point_from_benchmark, points_from_benchmarks


def baseline_key(device: str, model: str, dtype: str) -> str:
    """Baselines are kept per device *and* model and dtype: ``"cpu: X (2 threads) | tiny | bfloat16"``."""
    return f"{device} | {model} | {dtype}"


def drift_points(benchmarks: list[dict[str, Any]]) -> list[Point]:
    """The drift re-measurements (``extra_info.kind == "drift"``) as points."""
    out = []
    for bench in benchmarks:
        info = bench.get("extra_info") or {}
        if info.get("kind") == "drift":
            point = point_from_benchmark({**bench, "extra_info": {**info, "kind": "timed"}})
            if point is not None:
                out.append(point)
    return out


def copy_samples(raw: dict[str, Any]) -> list[float]:
    return [s for m in raw.get("copy", []) for s in m.get("samples_gbps", [])]


def analyse(benchmarks: list[dict[str, Any]], raw: dict[str, Any], settings: dict[str, Any],
            baseline: dict[str, Any]) -> dict[str, Any]:
    """The ``kv`` section (see :mod:`kvcache.records`) of one run."""
    model, env = raw["model"], raw["environment"]
    points = points_from_benchmarks(benchmarks)
    samples = copy_samples(raw)
    copy_gbps = _median(samples)
    kv: dict[str, Any] = {
        "schema": SCHEMA, "settings": settings, "environment": env, "model": model, "copy_gbps": copy_gbps,
        "copy": _copy_section(raw.get("copy", [])), "fit": {}, "drift": None,
        "traffic": raw.get("traffic", {}), "probe": raw.get("probe", {}), "verdict": {},
        "skipped": raw.get("skipped", []), "points": _points_section(points, copy_gbps),
    }
    fits = {}
    for cache in dict.fromkeys(p.cache for p in points):
        mine = [p for p in points if p.cache == cache]
        try:
            if not samples:
                raise FitError("no copy bandwidth was measured in this run")
            fits[cache] = fit_passes(mine, samples, bytes_per_token=model["bytes_per_token"],
                                     weight_bytes=model["weight_bytes"], confidence=settings["confidence"],
                                     resamples=settings["resamples"], seed=settings["seed"])
            kv["fit"][cache] = fits[cache].to_dict()
        except FitError as exc:
            kv["fit"][cache] = {"error": str(exc), "n_points": len(mine)}
    kv["drift"] = _drift_section(points, drift_points(benchmarks), settings["max_drift"])
    drift_ok = kv["drift"].get("ok") if "ok" in kv["drift"] else None
    kv["verdict"] = _verdicts(fits, kv["traffic"], settings, env, baseline, drift_ok)
    return jsonable(kv)


def _median(values: list[float]) -> float | None:
    from kvcache.records import median

    return median(values) if values else None


def _copy_section(measurements: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "start_gbps": measurements[0]["gbps"] if measurements else None,
        "end_gbps": measurements[-1]["gbps"] if len(measurements) > 1 else None,
        "measurements": measurements,
    }


def _points_section(points: list[Point], copy_gbps: float | None) -> list[dict[str, Any]]:
    """Per point: median step, and the achieved bandwidth (counted bytes of the step / median time)."""
    out = []
    for p in points:
        achieved = p.counted_bytes / p.median_s / 1e9 if p.counted_bytes else None
        out.append({
            "cache": p.cache, "context": p.context, "round": p.round, "median_ms": p.median_s * 1e3,
            "kv_bytes": p.kv_bytes, "counted_bytes": p.counted_bytes, "achieved_gbps": achieved,
            "achieved_fraction": achieved / copy_gbps if achieved and copy_gbps else None,
            "beyond_trained_context": p.beyond_trained_context,
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


def _verdicts(fits: dict, traffic: dict, settings: dict, env: dict, baseline: dict,
              drift_ok: bool | None) -> dict[str, Any]:
    device, device_type = env["device_name"], env["device_type"]
    key = baseline_key(device, settings["model"], settings["dtype"])
    type_key = baseline_key(device_type, settings["model"], settings["dtype"])
    verdicts = {}
    for cache in dict.fromkeys([*settings["caches"], *fits, *traffic]):
        entry = gate.baseline_entry(baseline, key, cache) or {}
        type_entry = gate.baseline_entry(baseline, type_key, cache) or {}
        bound = settings["max_passes"].get(cache)
        counted_base = entry.get("counted_passes", type_entry.get("counted_passes"))
        allowed_t = gate.allowed_passes(entry.get("timed_passes"), settings["tolerance"], bound, relative=True)
        allowed_c = gate.allowed_passes(counted_base, settings["counted_tolerance"], bound, relative=False)
        timed = gate.judge_timed(fits.get(cache), allowed=allowed_t, min_r2=settings["min_r2"],
                                 drift_ok=drift_ok, device=key)
        counted_passes = (traffic.get(cache) or {}).get("passes")
        counted = gate.judge_counted(counted_passes, allowed=allowed_c, device=type_key)
        verdicts[cache] = gate.combine(timed, counted)
    return verdicts


def failures(kv: dict[str, Any]) -> list[str]:
    """One line per reason the build fails: regressions (timed or counted) and drift."""
    lines = gate.failures(kv.get("verdict", {}))
    drift = kv.get("drift") or {}
    if drift.get("ok") is False:
        lines.append(f"kv-cache drift: {drift['cache']} at {drift['context']} tokens went from "
                     f"{drift['first_ms']:.2f} ms to {drift['last_ms']:.2f} ms ({drift['fraction']:+.1%}), "
                     f"beyond the allowed ±{drift['max_fraction']:.0%} (--kv-max-drift)")
    return lines


def baseline_entries(kv: dict[str, Any], recorded: str) -> dict[str, dict[str, dict[str, Any]]]:
    """What ``--kv-update-baseline`` writes: {baseline key: {cache: entry}}; counted passes are also kept
    under the device type, since they do not depend on which CPU or GPU of that type ran them."""
    s, env = kv["settings"], kv["environment"]
    common = {"recorded": recorded, "transformers": env["transformers"], "torch": env["torch"],
              "model": s["model"], "dtype": s["dtype"]}
    by_device: dict[str, dict[str, Any]] = {}
    by_type: dict[str, dict[str, Any]] = {}
    for cache in dict.fromkeys([*kv.get("fit", {}), *kv.get("traffic", {})]):
        timed = (kv["fit"].get(cache) or {}).get("passes")
        counted = (kv["traffic"].get(cache) or {}).get("passes")
        entry = {**common}
        if timed is not None:
            entry["timed_passes"] = timed
        if counted is not None:
            entry["counted_passes"] = counted
            by_type[cache] = {**common, "counted_passes": counted}
        by_device[cache] = entry
    out = {baseline_key(env["device_name"], s["model"], s["dtype"]): by_device}
    if by_type:
        out[baseline_key(env["device_type"], s["model"], s["dtype"])] = by_type
    return out


def record_baseline(path: str, kv: dict[str, Any], recorded: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Write a run's passes into the baseline file at ``path`` (merged with what it holds); return them."""
    entries = baseline_entries(kv, recorded)
    for key, by_cache in entries.items():
        gate.update_baseline(path, key, by_cache)
    return entries
