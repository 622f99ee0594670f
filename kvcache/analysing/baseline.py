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

Every figure an entry holds is finite and in its range (:data:`kvcache.analysing.entries.FIGURES`,
:data:`~kvcache.analysing.entries.OP_FIGURES`; checked by :func:`~kvcache.analysing.entries.figure_problem`), whether
it is read from a file (:func:`problem_of`: a file holding one out of range is refused, naming the entry and the
value) or recorded from a run (:func:`entries_of_run`): passes above 0 and at most
:data:`~kvcache.analysing.entries.MAX_PASSES`, R² from 0 to 1, intercept from 0 ms, decode speed above 0 ms, op counts
whole and from 0. null stands for a figure that is not known.

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
from pathlib import Path
from typing import Any

from kvcache.analysing import files, gate, identity
from kvcache.analysing.entries import (
    FIGURES,
    TIMED_NULLABLE,
    BaselineEntry,
    entry_problem,
    entry_problems,
    figure_problem,
)
from kvcache.analysing.fit import record_problem
from kvcache.analysing.measure_table import GROUPS, PRESENT, of_verdict
from kvcache.analysing.options import RULE_DEFAULTS
from kvcache.analysing.records import KV, Drift, Fit, UnmeasuredDrift, jsonable

BASELINE_SCHEMA = 2
READABLE_BASELINE_SCHEMAS = (1, 2)
PASSES_KEYS = ("timed_passes", "counted_passes")
NUMBER_KEYS = (*PASSES_KEYS, "timed_intercept_ms", "ops_per_step", "data_ops_per_step", "weight_passes")

#: ``--kv-baseline none``: the run has no baseline file (nothing read, nothing recorded).
NO_BASELINE = "none"


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message is one line naming the file."""


def empty() -> dict[str, Any]:
    return {"schema": BASELINE_SCHEMA, "devices": {}}


def load(path: str | Path) -> dict[str, Any]:
    """Read a baseline file (schema 1 or 2, upgraded to 2); a missing file (or :data:`NO_BASELINE`) is an empty
    baseline, anything unusable a BaselineError. A path given explicitly must exist: the plug-in checks that before
    it loads (:func:`kvcache.plugin.startup.baseline_problem`)."""
    if str(path) == NO_BASELINE:
        return empty()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return empty()
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{p}: cannot read baseline ({error_line(exc)})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{p}: baseline is not JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError:  # an integer beyond Python's limit of digits (4300)
        raise BaselineError(f"{p}: not a kvcache baseline (an integer of more than 4300 digits)") from None
    problem = problem_of(doc)
    if problem:
        raise BaselineError(f"{p}: not a kvcache baseline ({problem})")
    return upgrade(doc)


def problem_of(doc: Any) -> str | None:
    """What is wrong with a parsed baseline, or None when it is well formed: its shape, and every figure of every
    entry (:func:`entry_problem`), named with the entry and the value."""
    if not isinstance(doc, dict):
        return f"top level is a {type(doc).__name__}, expected an object"
    if doc.get("schema") not in READABLE_BASELINE_SCHEMAS:
        supported = ", ".join(map(str, READABLE_BASELINE_SCHEMAS))
        return f"schema {doc.get('schema')!r} is not one of the supported {supported}"
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



def upgrade(doc: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2: counted passes recorded under a machine key (``"cpu: X (2 threads) | m | d"``) move to
    the device-type key (``"cpu | m | d"``) unless one is there already; entries left without passes go."""
    if doc.get("schema") == BASELINE_SCHEMA:
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
    return {"schema": BASELINE_SCHEMA, "devices": devices}



def for_run(doc: dict[str, Any],
            ident: identity.Identity) -> tuple[dict[str, dict[str, BaselineEntry]], dict[str, str]]:
    """What a run of identity ``ident`` is judged against: ``({measure: {cache: entry}}, {measure: key})``; ``doc``
    is a loaded baseline file (:func:`load`), or ``{}`` for none."""
    keys = {m: identity.baseline_key(ident, m) for m in GROUPS}
    devices = doc["devices"] if doc else {}
    entries: dict[str, dict[str, BaselineEntry]] = {}
    for measure, key in keys.items():
        recorded = {c: BaselineEntry.from_json(e, f"baseline {key!r}: {c}") for c, e in devices[key].items()} \
            if key in devices else {}
        entries[measure] = {c: e for c, e in recorded.items() if getattr(e, PRESENT[measure]) is not None}
    return entries, keys


# --- what a run may record ---------------------------------------------------------------------------------

def timed_problem(kv: KV, cache: str) -> str | None:
    """Why a run's timed passes of ``cache`` may not enter a baseline, or None when they may."""
    fit, session, drift = kv.fit.get(cache), kv.session, kv.drift
    min_r2 = RULE_DEFAULTS["min_r2"] if kv.settings.min_r2 is None else kv.settings.min_r2
    if session is not None and session.interrupted:
        return f"the session did not finish ({session.exit})"
    if session is not None and cache in session.failed:
        return "a timed point of this class failed"
    passes = fit.passes if isinstance(fit, Fit) else None
    if isinstance(passes, bool) or not isinstance(passes, (int, float)) or not math.isfinite(passes) or passes <= 0:
        why = record_problem(fit) if fit is not None else None
        return f"no passes figure ({why or f'timed passes {passes!r} is not a positive number'})"
    problem = record_problem(fit, named_contexts=True)
    if problem:
        return f"no passes figure ({problem})"
    problem = figure_problem(passes, FIGURES["timed_passes"])
    if problem:
        return f"timed passes {problem}"
    if min_r2 is None or figure_problem(min_r2, FIGURES["timed_r2"]):  # NaN would let any R² through
        return f"the run's min_r2 is {min_r2!r}, expected a number from 0 to 1: its fits cannot be judged"
    r2 = fit.r2
    if r2 is None or figure_problem(r2, FIGURES["timed_r2"]):
        return f"no R² to judge the fit by (R² is {r2!r}, expected a number from 0 to 1)"
    if r2 < min_r2:
        return f"poor fit: R² {round(r2, 3)} < {min_r2}"
    if not isinstance(drift, Drift):
        return f"drift not checked ({drift.reason if isinstance(drift, UnmeasuredDrift) else 'no drift measurement'})"
    if drift.ok is not True:
        return f"drift {drift.fraction or 0:+.1%} beyond the allowed ±{drift.max_fraction or 0:.0%}"
    problems = gate.compile_problems(kv.points, cache)
    if problems:
        return f"compiled run: {problems[0]}"
    return None


def entries_of_run(kv: KV, recorded: str) -> tuple[dict[str, dict[str, dict[str, Any]]], list[str]]:
    """What recording a run writes, ``{key: {cache: entry}}``, and one line per timed figure left out (why)."""
    ident, env, settings = identity.of_run(kv), kv.environment, kv.settings
    common = {"recorded": recorded, "transformers": env.transformers, "torch": env.torch, "model": settings.model,
              "dtype": settings.dtype}
    timed: dict[str, Any] = {}
    counted: dict[str, Any] = {}
    overhead: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    refused = []
    for cache, fit in kv.fit.items():
        problem = timed_problem(kv, cache)
        if problem or not isinstance(fit, Fit):
            refused.append(f"{cache}: timed passes not recorded: {problem}; the recorded entry, if any, stays")
            continue
        timed[cache] = {**common, "timed_passes": fit.passes, "timed_r2": fit.r2,
                        "timed_intercept_ms": fit.intercept_ms,
                        "timed_weights_ms": kv.speed.weights_ms if kv.speed is not None else None}
        if kv.ledger.get(cache):
            timed[cache]["timed_ledger"] = {op: row.timed for op, row in kv.ledger[cache].items()
                                            if row.timed is not None}
        for name, problem in entry_problems(timed[cache]).items():
            if name not in TIMED_NULLABLE:  # cannot happen after timed_problem; never write it
                refused.append(f"{cache}: timed passes not recorded: {problem}; the recorded entry, if any, stays")
                del timed[cache]
                break
            timed[cache][name] = None
            refused.append(f"{cache}: {problem}: recorded as null beside the timed passes (not judged against)")
    for cache, traffic in kv.traffic.items():
        judged = traffic.counted()  # under --kv-compile: the fused count
        passes = judged.passes
        if isinstance(passes, (int, float)) and math.isfinite(passes) and passes > 0:
            counted[cache] = {**common, "counted_passes": passes, "counted_by_op": dict(judged.by_op)}
            gpus = {gpu: figure for gpu, figure in traffic.gpu_counted().items()
                    if isinstance(figure.passes, (int, float)) and math.isfinite(figure.passes) and figure.passes > 0}
            if gpus:
                counted[cache]["gpu_passes"] = {gpu: figure.passes for gpu, figure in gpus.items()}
                counted[cache]["gpu_by_op"] = {gpu: dict(figure.by_op) for gpu, figure in gpus.items()}
            problem = entry_problem(counted[cache])
            if problem:
                del counted[cache]
                refused.append(f"{cache}: counted passes not recorded: {problem}")
        else:
            refused.append(f"{cache}: counted passes {passes!r} not recorded")
        ops = traffic.ops_per_step
        if isinstance(ops, (int, float)) and not isinstance(ops, bool) and ops > 0:  # eager ops, always
            overhead[cache] = {**common, "op_calls": dict(traffic.calls) if traffic.calls else {}, **{
                name: getattr(traffic, name)
                for name in ("ops_per_step", "data_ops_per_step", "weight_passes", "fixed_bytes", "layers")}}
            problem = entry_problem(overhead[cache])
            if problem:
                del overhead[cache]
                refused.append(f"{cache}: counted overhead not recorded: {problem}")
    for cache, entry in kv.memory.items():
        figures = {m.baseline: getattr(entry, m.field) for m in of_verdict("memory")}
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in figures.values()):
            refused.append(f"{cache}: counted memory not recorded: no allocated, peak and held passes")
            continue
        memory[cache] = {**common, **figures,
                         "memory_allocated_by_op": dict(entry.allocated_by_op) if entry.allocated_by_op else {}}
        problem = entry_problem(memory[cache])
        if problem:
            del memory[cache]
            refused.append(f"{cache}: counted memory not recorded: {problem}")
    out: dict[str, dict[str, Any]] = {}
    if counted:
        out[identity.baseline_key(ident, "counted")] = counted
    if overhead:
        out[identity.baseline_key(ident, "overhead")] = overhead
    for cache, entry in memory.items():  # the overhead's key: one entry per class holds both
        out.setdefault(identity.baseline_key(ident, "memory"), {}).setdefault(cache, {}).update(entry)
    if timed:
        out[identity.baseline_key(ident, "timed")] = timed
    return out, refused


def record(path: str | Path, kv: KV, recorded: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Merge a run's recordable passes into the baseline file at ``path``; return them and what was refused."""
    entries, refused = entries_of_run(kv, recorded)
    if entries:
        update(path, entries)
    return entries, refused


# --- writing -----------------------------------------------------------------------------------------------

#: Entry fields keyed by GPU class, merged class by class when a run is recorded (not replaced whole).
MERGED_BY_GPU = ("gpu_passes", "gpu_by_op")


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
                target = recorded.setdefault(cache, {})
                for name in MERGED_BY_GPU:  # GPU classes the run did not predict keep their recorded figures
                    if isinstance(entry.get(name), dict) and isinstance(target.get(name), dict):
                        entry = {**entry, name: {**target[name], **entry[name]}}
                target.update(entry)
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
        raise BaselineError(f"{path}: cannot open its folder to lock it ({error_line(exc)})") from None
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
        raise BaselineError(f"{files.path_shown(path)}: cannot write baseline ({error_line(exc)})") from None


def error_line(exc: BaseException) -> str:
    return " ".join(str(getattr(exc, "strerror", None) or exc).split())
