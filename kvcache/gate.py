"""The gate: compare measured passes with a per-device baseline (or a hard ``--kv-max-passes``) and decide.

Two measures are judged per cache class. Timed passes (from :mod:`kvcache.fit`) come with a bootstrap
interval and pass only when the whole interval is within the allowed passes; counted passes (bytes
read plus written by one decode step's ops / logical KV bytes) are exact and compared directly. When in
doubt the gate says "inconclusive", never "pass". numpy-free; stdlib only.

Baseline file (JSON)::

    {"schema": 1, "devices": {"<device name>": {"<cache>": {
        "timed_passes": float|null, "counted_passes": float|null, "recorded": iso-datetime,
        "transformers": str, "torch": str, "model": str, "dtype": str}}}}
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .fit import PassesFit
from .records import jsonable

BASELINE_SCHEMA = 1
PASSES_KEYS = ("timed_passes", "counted_passes")
# Counted passes are ratios of byte counts; a rounding error must not turn "equal" into a regression.
COUNTED_RELATIVE_SLACK = 1e-9

STATUSES = ("pass", "regression", "inconclusive", "no-baseline", "not-measured")
# Higher wins when the two measures are combined.
PRIORITY = {"not-measured": 0, "no-baseline": 1, "pass": 2, "inconclusive": 3, "regression": 4}


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message is one line naming the file."""


def empty_baseline() -> dict[str, Any]:
    return {"schema": BASELINE_SCHEMA, "devices": {}}


def load_baseline(path: str | Path) -> dict[str, Any]:
    """Read a baseline file; a missing file is an empty baseline, anything unusable a BaselineError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return empty_baseline()
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{p}: cannot read baseline ({one_line(exc)})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{p}: baseline is not JSON ({exc.msg} at line {exc.lineno})") from None
    problem = baseline_problem(doc)
    if problem:
        raise BaselineError(f"{p}: not a kvcache baseline ({problem})")
    return doc


def baseline_problem(doc: Any) -> str | None:
    """What is wrong with the shape of a parsed baseline, or None when it is well formed."""
    if not isinstance(doc, dict):
        return f"top level is a {type(doc).__name__}, expected an object"
    if doc.get("schema") != BASELINE_SCHEMA:
        return f"schema {doc.get('schema')!r} is not the supported {BASELINE_SCHEMA}"
    devices = doc.get("devices")
    if not isinstance(devices, dict):
        return "'devices' is missing or not an object"
    for device, caches in devices.items():
        if not isinstance(caches, dict):
            return f"devices[{device!r}] is not an object"
        for cache, entry in caches.items():
            if not isinstance(entry, dict):
                return f"devices[{device!r}][{cache!r}] is not an object"
            for key in PASSES_KEYS:
                value = entry.get(key)
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                    return f"devices[{device!r}][{cache!r}].{key} is {value!r}, expected a number or null"
    return None


def baseline_entry(baseline: dict[str, Any], device: str, cache: str) -> dict[str, Any] | None:
    """The recorded entry of ``cache`` on ``device``, or None."""
    return (baseline.get("devices") or {}).get(device, {}).get(cache)


def update_baseline(path: str | Path, device: str, entries: dict[str, dict[str, Any]]) -> None:
    """Merge ``entries`` (cache -> entry) into the baseline of ``device`` and write the file atomically.

    Other devices and caches are kept; within a cache entry the given keys replace the recorded ones
    (a key left out, e.g. ``timed_passes`` when timing was skipped, keeps its recorded value).
    """
    p = Path(path)
    baseline = load_baseline(p)
    recorded = baseline["devices"].setdefault(device, {})
    for cache, entry in entries.items():
        recorded.setdefault(cache, {}).update(entry)
    problem = baseline_problem(baseline)
    if problem:
        raise BaselineError(f"{p}: refusing to write a malformed baseline ({problem})")
    write_json_atomically(p, baseline)


def write_json_atomically(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` (indent 2, sorted keys) to a temp file beside ``path``, then replace ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(jsonable(doc), handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_max_passes(text: str) -> dict[str, float]:
    """Parse ``--kv-max-passes cache=number,...`` into cache -> maximum passes (positive)."""
    form = "expected cache=number,... (e.g. dynamic=4,static=1.5)"
    limits: dict[str, float] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        cache, sep, value = (part.strip() for part in item.partition("="))
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not cache or not math.isfinite(number):
            raise ValueError(f"--kv-max-passes: bad item {item!r}; {form}")
        if number <= 0:
            raise ValueError(f"--kv-max-passes: {item!r} is not positive; {form}")
        if cache in limits:
            raise ValueError(f"--kv-max-passes: {cache!r} given twice; {form}")
        limits[cache] = number
    return limits


@dataclass
class Verdict:
    """The judgement of one measure (timed or counted passes) of one cache class."""

    status: str
    reason: str
    measured: float | None = None
    allowed: float | None = None
    interval: tuple | None = None

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))


def allowed_passes(
    baseline_passes: float | None, tolerance: float, max_passes: float | None, *, relative: bool
) -> float | None:
    """The tighter of the baseline plus tolerance and ``max_passes``; None when neither is given.

    ``relative``: baseline × (1 + tolerance) (timed passes); otherwise baseline + tolerance passes
    (counted passes, an exact measure).
    """
    limits = []
    if baseline_passes is not None:
        limits.append(baseline_passes * (1 + tolerance) if relative else baseline_passes + tolerance)
    if max_passes is not None:
        limits.append(max_passes)
    return min(limits) if limits else None


def no_baseline_reason(device: str) -> str:
    return f"no baseline for {device!r}; record one with --kv-update-baseline or pass --kv-max-passes cache=number"


def judge_timed(
    fit: PassesFit | None, *, allowed: float | None, min_r2: float, drift_ok: bool | None, device: str
) -> Verdict:
    """Judge timed passes by their interval: regression only when all of it is above ``allowed``,
    pass only when all of it is within; a poor fit, drift or a straddling interval is inconclusive."""
    if fit is None:
        return Verdict("not-measured", "timed passes were not measured")
    interval = tuple(fit.passes_ci)
    verdict = Verdict("inconclusive", "", measured=fit.passes, allowed=allowed, interval=interval)
    if allowed is None:
        verdict.status, verdict.reason = "no-baseline", no_baseline_reason(device)
        return verdict
    lo, hi = interval
    described = f"timed passes {fmt(fit.passes)} ({fit.confidence:.0%} interval [{fmt(lo)}, {fmt(hi)}])"
    if not fit.r2 >= min_r2:
        verdict.reason = f"poor fit: R² {fit.r2:.2f} < {min_r2:.2f}"
    elif drift_ok is False:
        verdict.reason = "drift beyond --kv-max-drift: the machine's speed changed during the session"
    elif not (math.isfinite(lo) and math.isfinite(hi)):
        verdict.reason = "no bootstrap interval for timed passes"
    elif lo > allowed:
        verdict.status = "regression"
        verdict.reason = f"{described} is above the allowed {fmt(allowed)} on {device}"
    elif hi <= allowed:
        verdict.status = "pass"
        verdict.reason = f"{described} is within the allowed {fmt(allowed)}"
    else:
        verdict.reason = (
            f"interval [{fmt(lo)}, {fmt(hi)}] straddles the allowed {fmt(allowed)} "
            f"(wide interval: {fit.ci_relative_width:.0%} of passes); more rounds or steps would narrow it"
        )
    return verdict


def judge_counted(passes: float | None, *, allowed: float | None, device: str) -> Verdict:
    """Judge counted passes (exact, no interval): regression when above ``allowed``."""
    if passes is None:
        return Verdict("not-measured", "counted passes were not measured")
    verdict = Verdict("pass", "", measured=passes, allowed=allowed)
    if allowed is None:
        verdict.status, verdict.reason = "no-baseline", no_baseline_reason(device)
    elif not math.isfinite(passes):
        verdict.status, verdict.reason = "inconclusive", f"counted passes is {passes}"
    elif passes > allowed * (1 + COUNTED_RELATIVE_SLACK):
        verdict.status = "regression"
        verdict.reason = f"counted passes {fmt(passes)} is above the allowed {fmt(allowed)} on {device}"
    else:
        verdict.reason = f"counted passes {fmt(passes)} is within the allowed {fmt(allowed)}"
    return verdict


def combine(timed: Verdict, counted: Verdict) -> dict[str, Any]:
    """One verdict for a cache class: the higher-priority status of the two measures
    (regression > inconclusive > pass > no-baseline > not-measured), the deciding reason first."""
    measures = {"timed": timed, "counted": counted}
    status = max((timed.status, counted.status), key=PRIORITY.__getitem__)
    ordered = sorted(measures.items(), key=lambda item: item[1].status != status)
    reason = "; ".join(f"{name} {v.status}: {v.reason}" for name, v in ordered)
    return {"status": status, "reason": reason, "timed": timed.to_dict(), "counted": counted.to_dict()}


def failures(verdicts: dict[str, dict[str, Any]]) -> list[str]:
    """One-line build-failure messages, one per regressed measure of each cache class."""
    messages = []
    for cache, verdict in verdicts.items():
        for measure in ("timed", "counted"):
            judged = verdict.get(measure) or {}
            if judged.get("status") != "regression":
                continue
            interval = judged.get("interval")
            within = f" (interval [{fmt(interval[0])}, {fmt(interval[1])}])" if interval else ""
            messages.append(
                f"kv-cache regression: {cache} {measure} passes {fmt(judged.get('measured'))}{within} "
                f"exceed the allowed {fmt(judged.get('allowed'))}"
            )
    return messages


def fmt(value: float | None) -> str:
    """Passes for a message: three significant digits, '?' when unknown."""
    return "?" if value is None else f"{value:.3g}"


def one_line(exc: BaseException) -> str:
    return " ".join(str(getattr(exc, "strerror", None) or exc).split())
