"""The baseline file: what a run is judged against, what may be recorded in it, and how it is written.
Analysing wing: stdlib only.

File (JSON, schema 2)::

    {"schema": 2, "devices": {"<identity key>": {"<cache>": {
        "timed_passes": float, "timed_r2": float, "timed_intercept_ms": float,     (under a timed key)
        "timed_ledger": {op: timed passes}, "timed_weights_ms": float (the run's decode speed),
        "counted_passes": float, "counted_by_op": {op: passes},                   (under a counted key)
        "ops_per_step": int, "data_ops_per_step": int, "weight_passes": float,    (under an overhead key)
        "fixed_bytes": int, "layers": int, "op_calls": {op: calls},
        "recorded": iso-datetime, "transformers": str, "torch": str, "model": str, "dtype": str}}}}

Keys come from :mod:`kvcache.analysing.identity`: ``"cpu | tiny | bfloat16"`` holds counted passes (any CPU),
``"cpu: AMD EPYC (2 threads) | tiny | bfloat16"`` timed passes (that machine), ``"cpu | tiny | bfloat16 |
torch 2.13.0+cpu"`` counted overhead (that torch release). Schema 1 files (counted passes also under machine
keys) still load; they are upgraded in memory and written back as schema 2.

Nothing unjudgeable is recorded: timed passes only from a fit that would itself be judged (positive
finite passes, R² at least ``min_r2``, at least 3 distinct contexts, drift checked and within its limit,
the session not interrupted, no failed point of that class); otherwise the old entry stays and
:func:`entries_of_run` says why. Writes are atomic, keep the file's mode and hold a lock on its folder,
so concurrent writers lose no update.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvcache.analysing import gate, identity
from kvcache.analysing.fit import record_problem
from kvcache.analysing.records import jsonable

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
PASSES_KEYS = ("timed_passes", "counted_passes")
NUMBER_KEYS = (*PASSES_KEYS, "timed_intercept_ms", "ops_per_step", "data_ops_per_step", "weight_passes")
#: The field whose presence makes an entry a baseline of each measure.
PRESENT = {"counted": "counted_passes", "timed": "timed_passes", "overhead": "ops_per_step"}


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message is one line naming the file."""


def empty() -> dict[str, Any]:
    return {"schema": SCHEMA, "devices": {}}


def load(path: str | Path) -> dict[str, Any]:
    """Read a baseline file (schema 1 or 2, upgraded to 2); a missing file is an empty baseline, anything
    unusable a BaselineError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return empty()
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{p}: cannot read baseline ({one_line(exc)})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{p}: baseline is not JSON ({exc.msg} at line {exc.lineno})") from None
    problem = problem_of(doc)
    if problem:
        raise BaselineError(f"{p}: not a kvcache baseline ({problem})")
    return upgrade(doc)


def problem_of(doc: Any) -> str | None:
    """What is wrong with the shape of a parsed baseline, or None when it is well formed."""
    if not isinstance(doc, dict):
        return f"top level is a {type(doc).__name__}, expected an object"
    if doc.get("schema") not in READABLE_SCHEMAS:
        return f"schema {doc.get('schema')!r} is not one of the supported {', '.join(map(str, READABLE_SCHEMAS))}"
    devices = doc.get("devices")
    if not isinstance(devices, dict):
        return "'devices' is missing or not an object"
    for key, caches in devices.items():
        if not isinstance(caches, dict):
            return f"devices[{key!r}] is not an object"
        for cache, entry in caches.items():
            if not isinstance(entry, dict):
                return f"devices[{key!r}][{cache!r}] is not an object"
            for name in NUMBER_KEYS:
                value = entry.get(name)
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                    return f"devices[{key!r}][{cache!r}].{name} is {value!r}, expected a number or null"
    return None


def upgrade(doc: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2: counted passes recorded under a machine key (``"cpu: X (2 threads) | m | d"``) move to
    the device-type key (``"cpu | m | d"``) unless one is there already; entries left without passes go."""
    if doc.get("schema") == SCHEMA:
        return doc
    devices: dict[str, dict[str, Any]] = {k: {c: dict(e) for c, e in v.items()} for k, v in doc["devices"].items()}
    for key in list(devices):
        head, sep, rest = key.partition(" | ")
        if ":" not in head or not sep:
            continue
        type_key = f"{head.split(':', 1)[0].strip()} | {rest}"
        for cache, entry in list(devices[key].items()):
            counted = entry.pop("counted_passes", None)
            if counted is not None:
                target = devices.setdefault(type_key, {}).setdefault(cache, {})
                if target.get("counted_passes") is None:
                    meta = {k: v for k, v in entry.items() if k not in PASSES_KEYS and not k.startswith("timed_")}
                    target.update({**meta, "counted_passes": counted})
            if entry.get("timed_passes") is None:
                del devices[key][cache]
        if not devices[key]:
            del devices[key]
    return {"schema": SCHEMA, "devices": devices}


def for_run(doc: dict[str, Any], ident: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """What a run of identity ``ident`` is judged against: ``({measure: {cache: entry}}, {measure: key})``."""
    keys = {m: identity.key(ident, m) for m in identity.MEASURE_FIELDS}
    devices = doc.get("devices") or {}
    entries = {m: {c: e for c, e in (devices.get(k) or {}).items() if e.get(PRESENT[m]) is not None}
               for m, k in keys.items()}
    return entries, keys


# --- what a run may record ---------------------------------------------------------------------------------

def timed_problem(kv: dict[str, Any], cache: str) -> str | None:
    """Why a run's timed passes of ``cache`` may not enter a baseline, or None when they may."""
    fit = (kv.get("fit") or {}).get(cache) or {}
    settings, session, drift = kv.get("settings") or {}, kv.get("session") or {}, kv.get("drift") or {}
    passes, r2 = fit.get("passes"), fit.get("r2")
    min_r2 = settings.get("min_r2", 0.90)
    if session.get("interrupted"):
        return f"the session did not finish ({session.get('exit')})"
    if cache in (session.get("failed") or []):
        return "a timed point of this class failed"
    if not isinstance(passes, (int, float)) or not math.isfinite(passes) or passes <= 0:
        return f"no passes figure ({record_problem(fit) or f'timed passes {passes!r} is not a positive number'})"
    problem = record_problem({"contexts": [], **fit})  # a fit that does not name its contexts has none
    if problem:
        return f"no passes figure ({problem})"
    if r2 is None or r2 < min_r2:
        return f"poor fit: R² {r2 if r2 is None else round(r2, 3)} < {min_r2}"
    if "ok" not in drift:
        return f"drift not checked ({drift.get('reason', 'no drift measurement')})"
    if drift["ok"] is not True:
        return f"drift {drift.get('fraction', 0):+.1%} beyond the allowed ±{drift.get('max_fraction', 0):.0%}"
    problems = gate.compile_problems(kv.get("points"), cache)
    if problems:
        return f"compiled run: {problems[0]}"
    return None


def entries_of_run(kv: dict[str, Any], recorded: str) -> tuple[dict[str, dict[str, dict[str, Any]]], list[str]]:
    """What recording a run writes, ``{key: {cache: entry}}``, and one line per timed figure left out (why)."""
    ident, env, settings = identity.of_run(kv), kv.get("environment") or {}, kv.get("settings") or {}
    common = {"recorded": recorded, "transformers": env.get("transformers"), "torch": env.get("torch"),
              "model": settings.get("model"), "dtype": settings.get("dtype")}
    timed: dict[str, Any] = {}
    counted: dict[str, Any] = {}
    overhead: dict[str, Any] = {}
    refused = []
    for cache, fit in (kv.get("fit") or {}).items():
        problem = timed_problem(kv, cache)
        if problem:
            refused.append(f"{cache}: timed passes not recorded: {problem}; the recorded entry, if any, stays")
        else:
            timed[cache] = {**common, "timed_passes": fit["passes"], "timed_r2": fit.get("r2"),
                            "timed_intercept_ms": fit.get("intercept_ms"),
                            "timed_weights_ms": (kv.get("speed") or {}).get("weights_ms")}
            rows = (kv.get("ledger") or {}).get(cache)
            if rows:
                timed[cache]["timed_ledger"] = {op: row["timed"] for op, row in rows.items()
                                                if isinstance(row, dict) and row.get("timed") is not None}
    for cache, entry in (kv.get("traffic") or {}).items():
        traffic = gate.counted_traffic(entry) or {}  # under --kv-compile: the fused count
        passes = traffic.get("passes")
        if isinstance(passes, (int, float)) and math.isfinite(passes) and passes > 0:
            counted[cache] = {**common, "counted_passes": passes, "counted_by_op": dict(traffic.get("by_op") or {})}
        else:
            refused.append(f"{cache}: counted passes {passes!r} not recorded")
        if isinstance(entry.get("ops_per_step"), int) and entry["ops_per_step"] > 0:  # eager ops, always
            overhead[cache] = {**common, "op_calls": dict(entry.get("calls") or {}), **{
                name: entry.get(name)
                for name in ("ops_per_step", "data_ops_per_step", "weight_passes", "fixed_bytes", "layers")}}
    out = {}
    if counted:
        out[identity.key(ident, "counted")] = counted
    if overhead:
        out[identity.key(ident, "overhead")] = overhead
    if timed:
        out[identity.key(ident, "timed")] = timed
    return out, refused


def record(path: str | Path, kv: dict[str, Any], recorded: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Merge a run's recordable passes into the baseline file at ``path``; return them and what was refused."""
    entries, refused = entries_of_run(kv, recorded)
    if entries:
        update(path, entries)
    return entries, refused


# --- writing -----------------------------------------------------------------------------------------------

def update(path: str | Path, entries: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Merge ``{key: {cache: entry}}`` into the file under a lock and write it atomically (mode kept).

    Other keys and caches are kept; within an entry the given fields replace the recorded ones."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with locked(p):
        doc = load(p)
        for key, by_cache in entries.items():
            recorded = doc["devices"].setdefault(key, {})
            for cache, entry in by_cache.items():
                recorded.setdefault(cache, {}).update(entry)
        problem = problem_of(doc)
        if problem:
            raise BaselineError(f"{p}: refusing to write a malformed baseline ({problem})")
        write_json_atomically(p, doc)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the folder of ``path`` (POSIX ``flock``), held while the file is read and
    rewritten, so that concurrent writers serialise; no lock where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError as exc:
        raise BaselineError(f"{path}: cannot open its folder to lock it ({one_line(exc)})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def write_json_atomically(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` (indent 2, sorted keys) to a temp file beside ``path``, then replace ``path``; the
    file keeps its mode (a new one gets the umask's)."""
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(jsonable(doc), handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def one_line(exc: BaseException) -> str:
    return " ".join(str(getattr(exc, "strerror", None) or exc).split())
