"""The baseline file: what a run is judged against, what may be recorded in it (nothing unjudgeable; every figure
finite and in its range, :mod:`kvcache.analysing.judge.entries`), and how it is written (atomically, its mode kept,
under
a lock on its folder). The file and its rules: docs/gate.md ("Baselines"). Analysing wing: stdlib only."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from typing import Any

from kvcache.analysing.fit import record_problem
from kvcache.analysing.judge import gate
from kvcache.analysing.judge.decoding_judge import decoding_entry
from kvcache.analysing.judge.entries import (
    FIGURES,
    TIMED_NULLABLE,
    BaselineEntry,
    entry_problem,
    entry_problems,
    figure_problem,
)
from kvcache.analysing.judge.measure_table import GROUPS, PRESENT, of_verdict
from kvcache.analysing.options import RULE_DEFAULTS
from kvcache.analysing.records import KV, Drift, Fit, UnmeasuredDrift, identity, jsonfile
from kvcache.analysing.records.file_formats import BASELINE_SCHEMA, READABLE_BASELINE_SCHEMAS, BaselineFile
from kvcache.analysing.records.jsonfile import error_line  # noqa: F401 - the commands' one line of an OSError
from kvcache.analysing.records.jsonrecord import BOOKKEEPING

PASSES_KEYS = ("timed_passes", "counted_passes")
NUMBER_KEYS = (*PASSES_KEYS, "timed_intercept_ms", "ops_per_step", "data_ops_per_step", "weight_passes")

#: ``--kv-baseline none``: the run has no baseline file (nothing read, nothing recorded).
NO_BASELINE = "none"


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message is one line naming the file."""


def empty() -> BaselineFile:
    return BaselineFile()


def load(path: str | Path) -> BaselineFile:
    """Read a baseline file (schema 1 or 2, upgraded to 2) as its record; a missing file (or :data:`NO_BASELINE`) is
    an empty baseline, anything unusable a BaselineError (one line naming the file). The one reader of the file's
    raw document. A path given explicitly must exist: the plug-in checks that before it loads
    (:func:`kvcache.plugin.startup.baseline_problem`)."""
    if str(path) == NO_BASELINE:
        return empty()
    p = Path(path)
    doc = jsonfile.load_json(p, accepted=READABLE_BASELINE_SCHEMAS, what="kvcache baseline", error=BaselineError,
                             missing=lambda: empty().to_json())
    problem = problem_of(doc)
    if problem:
        raise BaselineError(f"{p}: not a kvcache baseline ({problem})")
    return BaselineFile.from_json(upgrade(doc), f"{p}")


def problem_of(doc: Any) -> str | None:
    """What is wrong with a parsed baseline, or None when it is well formed: its shape, and every figure of every
    entry (:func:`entry_problem`), named with the entry and the value (its schema is :func:`load`'s to check)."""
    if not isinstance(doc, dict):
        return f"top level is a {type(doc).__name__}, expected an object"
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



def for_run(doc: BaselineFile | None,
            ident: identity.Identity) -> tuple[dict[str, dict[str, BaselineEntry]], dict[str, str]]:
    """What a run of identity ``ident`` is judged against: ``({measure: {cache: entry}}, {measure: key})``; ``doc``
    is a loaded baseline file (:func:`load`), or None for none."""
    keys = {m: identity.baseline_key(ident, m) for m in GROUPS}
    devices = doc.devices if doc is not None else {}
    entries: dict[str, dict[str, BaselineEntry]] = {}
    for measure, key in keys.items():
        recorded = devices.get(key, {})
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
            counted[cache].update(decoding_entry(traffic))
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
    """Merge ``{key: {cache: entry}}`` into the file under a lock on its folder and write it atomically (mode kept;
    :func:`kvcache.analysing.records.jsonfile.update_json`). Other keys and caches are kept; within an entry the given
    fields replace the recorded ones."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    known = {f.name for f in fields(BaselineEntry)} - set(BOOKKEEPING)

    def merged(doc: BaselineFile) -> BaselineFile:
        for key, by_cache in entries.items():
            recorded = doc.devices.setdefault(key, {})
            for cache, entry in by_cache.items():
                target = recorded.setdefault(cache, BaselineEntry.of())
                for name in MERGED_BY_GPU:  # GPU classes the run did not predict keep their recorded figures
                    if isinstance(entry.get(name), dict) and isinstance(getattr(target, name), dict):
                        entry = {**entry, name: {**getattr(target, name), **entry[name]}}
                target.update(**{k: v for k, v in entry.items() if k in known})
                target.extra.update({k: v for k, v in entry.items() if k not in known})
        return doc

    jsonfile.update_json(p, merged, load=load, write=write, lock=lambda q: jsonfile.folder_lock(q, BaselineError))


def write(path: Path, doc: BaselineFile) -> None:
    """Write a baseline (indent 2, sorted keys) atomically (:func:`kvcache.analysing.records.jsonfile.write_json`: a
    temp file beside ``path``'s target, a symlink stays a link, the mode kept, a signal mid-write leaves the old file);
    one that is malformed, or a file that cannot be written, is a BaselineError naming it."""
    raw = doc.to_json()
    problem = problem_of(raw)
    if problem:
        raise BaselineError(f"{path}: refusing to write a malformed baseline ({problem})")
    jsonfile.write_json(path, raw, indent=2, sort_keys=True, what="baseline", error=BaselineError)
