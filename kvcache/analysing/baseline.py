"""The baseline file: what a run is judged against, what may be recorded in it, and how it is written.
Analysing wing: stdlib only.

File (JSON, schema 2)::

    {"schema": 2, "devices": {"<identity key>": {"<cache>": {
        "timed_passes": float, "timed_r2": float, "timed_intercept_ms": float,     (under a timed key)
        "timed_ledger": {op: timed passes}, "timed_weights_ms": float (the run's decode speed),
        "counted_passes": float, "counted_by_op": {op: passes},                   (under a counted key)
        "ops_per_step": int, "data_ops_per_step": int, "weight_passes": float,    (under an overhead key)
        "fixed_bytes": int, "layers": int, "op_calls": {op: calls},
        "memory_allocated_passes": float, "memory_peak_passes": float,             (under a memory key: the
        "memory_held_passes": float, "memory_allocated_by_op": {op: passes},       overhead's, per torch release)
        "recorded": iso-datetime, "transformers": str, "torch": str, "model": str, "dtype": str}}}}

Keys come from :mod:`kvcache.analysing.identity`: ``"cpu | tiny | bfloat16"`` holds counted passes (any CPU),
``"cpu: AMD EPYC (2 threads) | tiny | bfloat16"`` timed passes (that machine), ``"cpu | tiny | bfloat16 |
torch 2.13.0+cpu"`` counted overhead (that torch release). Schema 1 files (counted passes also under machine
keys) still load; they are upgraded in memory and written back as schema 2.

Every figure an entry holds is finite and in its range (:data:`FIGURES`, :data:`OP_FIGURES`; checked by
:func:`figure_problem`), whether it is read from a file (:func:`problem_of`: a file holding one out of range is
refused, naming the entry and the value) or recorded from a run (:func:`entries_of_run`): passes above 0 and at
most :data:`MAX_PASSES`, R² from 0 to 1, intercept from 0 ms, decode speed above 0 ms, op counts whole and from 0.
null stands for a figure that is not known.

Nothing unjudgeable is recorded: timed passes only from a fit that would itself be judged (positive
finite passes, R² from 0 to 1 and at least the run's own ``min_r2``, itself from 0 to 1, at least 3 distinct
contexts, drift checked and within its limit, the session not interrupted, no failed point of that class);
otherwise the old entry stays and :func:`entries_of_run` says why. A timed intercept, decode speed or ledger out
of range is recorded as null (not judged against) beside the passes; counted passes or overhead with a figure out
of range are not recorded. Writes are atomic, keep the file's mode and hold a lock on its folder, so concurrent
writers lose no update.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcache.analysing import files, gate, identity
from kvcache.analysing.fit import record_problem
from kvcache.analysing.records import jsonable

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
PASSES_KEYS = ("timed_passes", "counted_passes")
NUMBER_KEYS = (*PASSES_KEYS, "timed_intercept_ms", "ops_per_step", "data_ops_per_step", "weight_passes")
#: The field whose presence makes an entry a baseline of each measure.
PRESENT = {"counted": "counted_passes", "timed": "timed_passes", "overhead": "ops_per_step",
           "memory": "memory_held_passes"}

# Upper bounds: far beyond any real figure, so that only garbage (1e300 passes, 1e30 ops) is refused.
#: Passes of the KV cache per decode step. Eager grouped-query attention that expands K and V to every query
#: head moves about 2g + 1 passes (g query heads per KV head: 129 for g = 64); 1e4 is two orders above that.
MAX_PASSES = 1e4
#: Milliseconds per decode step (intercept, decode speed): 1e6 ms is a step of 17 minutes.
MAX_MS = 1e6
#: ATen ops (or calls of one op) per decode step: 1e7 is 10,000 layers of 1,000 ops each.
MAX_OPS = 10_000_000
#: Bytes a step moves that do not grow with context: 1e15 is a petabyte.
MAX_BYTES = 10**15
#: Layers of a model.
MAX_LAYERS = 1_000_000


@dataclass(frozen=True)
class Range:
    """The range of one baseline figure: from ``low`` (excluded when ``above``) to ``high``; ``whole``: a whole
    number (op counts, bytes, layers)."""

    low: float
    high: float
    above: bool = False
    whole: bool = False

    def describe(self) -> str:
        kind = "a whole number" if self.whole else "a finite number"
        low = f"above {self.low:g}" if self.above else f"at least {self.low:g}"
        return f"{kind} {low} and at most {self.high:g}"

    def holds(self, value: float) -> bool:
        try:
            number = float(value)
        except OverflowError:  # a JSON integer too large for a float
            return False
        return (math.isfinite(number) and (number > self.low if self.above else number >= self.low)
                and number <= self.high and (not self.whole or number.is_integer()))


#: Every number an entry holds, and its range (null: not known, allowed for each).
FIGURES = {
    "timed_passes": Range(0, MAX_PASSES, above=True),
    "counted_passes": Range(0, MAX_PASSES, above=True),
    "timed_r2": Range(0, 1),
    "timed_intercept_ms": Range(0, MAX_MS),  # a step with an empty cache takes no negative time
    "timed_weights_ms": Range(0, MAX_MS, above=True),
    "ops_per_step": Range(0, MAX_OPS, whole=True),
    "data_ops_per_step": Range(0, MAX_OPS, whole=True),
    "weight_passes": Range(0, MAX_PASSES),
    "fixed_bytes": Range(-MAX_BYTES, MAX_BYTES, whole=True),  # an intercept: bytes at an empty cache, may dip below 0
    "layers": Range(1, MAX_LAYERS, whole=True),
    # Counted memory: slopes of bytes per KV byte; allocated and peak may dip below 0 (a class that allocates less at a
    # larger context), held is what the class keeps.
    "memory_allocated_passes": Range(-MAX_PASSES, MAX_PASSES),
    "memory_peak_passes": Range(-MAX_PASSES, MAX_PASSES),
    "memory_held_passes": Range(-MAX_PASSES, MAX_PASSES),
}
#: Every ``{op: number}`` map an entry holds, and the range of each number. An op's passes may be below 0: a
#: counted op seen at the low context only has a falling slope, and a ledger op's timed slope is noise around 0.
OP_FIGURES = {
    "counted_by_op": Range(-MAX_PASSES, MAX_PASSES),
    "timed_ledger": Range(-MAX_PASSES, MAX_PASSES),
    "op_calls": Range(0, MAX_OPS, whole=True),
    "memory_allocated_by_op": Range(-MAX_PASSES, MAX_PASSES),
}
#: Text an entry holds (where the figures came from); a string or null.
TEXTS = ("recorded", "transformers", "torch", "model", "dtype")
#: Figures of a timed entry that are recorded as null when out of range, the passes beside them kept.
TIMED_NULLABLE = ("timed_intercept_ms", "timed_weights_ms", "timed_ledger")


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
    """What is wrong with a parsed baseline, or None when it is well formed: its shape, and every figure of every
    entry (:func:`entry_problem`), named with the entry and the value."""
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
            problem = entry_problem(entry)
            if problem:
                return f"devices[{key!r}][{cache!r}].{problem}"
    return None


def figure_problem(value: Any, within: Range) -> str | None:
    """Why ``value`` is not a number in ``within`` (``"is nan, expected ..."``), or None when it is one or null."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {value_shown(value)}, expected a number or null"
    if not within.holds(value):
        return f"is {value_shown(value)}, expected {within.describe()}, or null"
    return None


def value_shown(value: Any, width: int = 40) -> str:
    """``repr(value)`` for a one-line message, cut to ``width`` characters (a 400-digit integer, a long string)."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def entry_problems(entry: dict[str, Any]) -> dict[str, str]:
    """{field: what is wrong with it (``"timed_r2 is nan, expected ..."``)} over every figure, op map and text of a
    baseline entry; empty when the entry is well formed. Fields it does not know are left alone."""
    out = {}
    for name, within in FIGURES.items():
        problem = figure_problem(entry.get(name), within)
        if problem:
            out[name] = f"{name} {problem}"
    for name, within in OP_FIGURES.items():
        ops = entry.get(name)
        if ops is not None and not isinstance(ops, dict):
            out[name] = f"{name} is {value_shown(ops)}, expected an object of op: number, or null"
            continue
        for op, value in (ops or {}).items():
            problem = figure_problem(value, within)
            if problem:
                out[name] = f"{name}[{value_shown(op)}] {problem}"
                break
    for name in TEXTS:
        value = entry.get(name)
        if value is not None and not isinstance(value, str):
            out[name] = f"{name} is {value_shown(value)}, expected a string or null"
    return out


def entry_problem(entry: dict[str, Any]) -> str | None:
    """The first of :func:`entry_problems`, or None."""
    return next(iter(entry_problems(entry).values()), None)


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
    problem = figure_problem(passes, FIGURES["timed_passes"])
    if problem:
        return f"timed passes {problem}"
    if min_r2 is None or figure_problem(min_r2, FIGURES["timed_r2"]):  # NaN would let any R² through
        return f"the run's min_r2 is {min_r2!r}, expected a number from 0 to 1: its fits cannot be judged"
    if r2 is None or figure_problem(r2, FIGURES["timed_r2"]):
        return f"no R² to judge the fit by (R² is {r2!r}, expected a number from 0 to 1)"
    if r2 < min_r2:
        return f"poor fit: R² {round(r2, 3)} < {min_r2}"
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
    memory: dict[str, Any] = {}
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
            for name, problem in entry_problems(timed[cache]).items():
                if name not in TIMED_NULLABLE:  # cannot happen after timed_problem; never write it
                    refused.append(f"{cache}: timed passes not recorded: {problem}; the recorded entry, if any, stays")
                    del timed[cache]
                    break
                timed[cache][name] = None
                refused.append(f"{cache}: {problem}: recorded as null beside the timed passes (not judged against)")
    for cache, entry in (kv.get("traffic") or {}).items():
        traffic = gate.counted_traffic(entry) or {}  # under --kv-compile: the fused count
        passes = traffic.get("passes")
        if isinstance(passes, (int, float)) and math.isfinite(passes) and passes > 0:
            counted[cache] = {**common, "counted_passes": passes, "counted_by_op": dict(traffic.get("by_op") or {})}
            problem = entry_problem(counted[cache])
            if problem:
                del counted[cache]
                refused.append(f"{cache}: counted passes not recorded: {problem}")
        else:
            refused.append(f"{cache}: counted passes {passes!r} not recorded")
        ops = entry.get("ops_per_step")
        if isinstance(ops, (int, float)) and not isinstance(ops, bool) and ops > 0:  # eager ops, always
            overhead[cache] = {**common, "op_calls": dict(entry.get("calls") or {}), **{
                name: entry.get(name)
                for name in ("ops_per_step", "data_ops_per_step", "weight_passes", "fixed_bytes", "layers")}}
            problem = entry_problem(overhead[cache])
            if problem:
                del overhead[cache]
                refused.append(f"{cache}: counted overhead not recorded: {problem}")
    for cache, entry in (kv.get("memory") or {}).items():
        if not isinstance(entry, dict) or not all(isinstance(entry.get(name), (int, float)) and not isinstance(
                entry.get(name), bool) for name in gate.MEMORY_FIGURES):
            refused.append(f"{cache}: counted memory not recorded: no allocated, peak and held passes")
            continue
        memory[cache] = {**common, **{field: entry[name] for name, field in gate.MEMORY_FIGURES.items()},
                         "memory_allocated_by_op": dict(entry.get("allocated_by_op") or {})}
        problem = entry_problem(memory[cache])
        if problem:
            del memory[cache]
            refused.append(f"{cache}: counted memory not recorded: {problem}")
    out: dict[str, dict[str, Any]] = {}
    if counted:
        out[identity.key(ident, "counted")] = counted
    if overhead:
        out[identity.key(ident, "overhead")] = overhead
    for cache, entry in memory.items():  # the overhead's key: one entry per class holds both
        out.setdefault(identity.key(ident, "memory"), {}).setdefault(cache, {}).update(entry)
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
    """An exclusive lock on the folder of ``path``'s target (symlinks followed; POSIX ``flock``), held while the
    file is read and rewritten, so that concurrent writers serialise, through links or not; no lock where
    ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    folder = files.target(path).parent  # a symlinked baseline: where its target is written (write_json_atomically)
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
    """Write ``doc`` (indent 2, sorted keys) with :func:`kvcache.analysing.files.write_text_atomically`: a temp
    file beside ``path``'s target (a symlink stays a link, its target is replaced), the mode kept; a signal
    mid-write leaves the old file. A file that cannot be written is a BaselineError naming it."""
    text = json.dumps(jsonable(doc), indent=2, sort_keys=True) + "\n"
    try:
        files.write_text_atomically(path, text)
    except OSError as exc:
        raise BaselineError(f"{files.shown(path)}: cannot write baseline ({one_line(exc)})") from None


def one_line(exc: BaseException) -> str:
    return " ".join(str(getattr(exc, "strerror", None) or exc).split())
