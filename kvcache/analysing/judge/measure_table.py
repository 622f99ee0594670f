"""The measures: one table (:data:`MEASURES`), the one home of every figure a run reports and is judged by.

Each :class:`Measure` is one figure of a class in a run's ``kv`` section: its one name, label and unit, where it
lives in the record, its per-op detail, its baseline field, the gate verdict it is judged in, the baseline entries
(and so the identity fields) it is keyed by, its tolerance option, whether it is exact (counted) or judged by its
interval (timed), its trend resolution, and the outputs that carry it. :data:`VERDICTS` groups the figures into what
the gate judges (``kv.verdict.<cache>.<verdict>``); :data:`GROUPS` names the identity fields of each baseline group.
Every list of measures elsewhere is derived from these (``tests/without_torch/test_measures.py`` keeps them in step);
docs/architecture.md, "Adding a measure", says what a new one costs. Stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ANY = "*"  # in a measure's path: every key found there (one figure per key: a GPU class, an SDPA backend)

#: The baseline groups: a baseline holds entries per group, keyed by these identity fields (:mod:`identity`).
#: Counted bytes depend on the kind of device, not on which one; timed figures on the machine (a CPU's name carries
#: its thread count); op counts and memory on the torch release too.
GROUPS: dict[str, tuple[str, ...]] = {
    "counted": ("device_type", "model", "dtype"),
    "timed": ("device_name", "model", "dtype"),
    "overhead": ("device_type", "model", "dtype", "torch"),
    "memory": ("device_type", "model", "dtype", "torch"),
}
#: The baseline field whose presence makes an entry a baseline of each group.
PRESENT: dict[str, str] = {"counted": "counted_passes", "timed": "timed_passes", "overhead": "ops_per_step",
                           "memory": "memory_held_passes"}


@dataclass(frozen=True)
class Judged:
    """What the gate judges of a class, ``kv.verdict.<cache>.<name>``, from the figures whose ``verdict`` it is:
    ``label`` names it in a regression line; ``summarised``: a column of the summary's verdict table."""

    name: str
    label: str
    summarised: bool = True


#: The gate's verdicts, in the order the gate gives them and the summary shows them.
VERDICTS: tuple[Judged, ...] = (
    Judged("counted", "counted passes"),
    Judged("timed", "timed passes"),
    Judged("intercept", "intercept"),
    Judged("overhead", "overhead"),
    Judged("ledger", "per-op ledger"),
    Judged("memory", "counted memory"),
    Judged("gpus", "counted passes per GPU class", summarised=False),
    Judged("decoding", "counted passes per token, by phase, of the prefill and of the draft", summarised=False),
)


@dataclass(frozen=True)
class Measure:
    """One figure of a class. ``section``/``path``/``field``: where it lives, ``kv.<section>.<cache>[.<path>].<field>``
    (:data:`ANY` in ``path``: one figure per key there); ``fused``: read through ``Traffic.counted()`` (the fused
    count under ``--kv-compile``, as the gate judges it); ``interval``: its bootstrap interval's field; ``detail``:
    its per-op parts' field. ``baseline``/``baseline_detail``: the baseline entry's fields. ``verdict``: the gate
    verdict it is judged in (None: not judged); ``group``: its baseline group (:data:`GROUPS`); ``tolerance``: the
    option of the rule it is judged with; ``exact``: counted (never inconclusive for noise) or judged by its interval;
    ``resolution``: the smallest change of an exact figure that is a step in a trend. The flags say which outputs
    carry it: the summary, ``kvcache compare`` (``header``: its column), the pull request's comment (its verdict),
    ``kvcache export``, the history store and its trend PNGs (``title``: the axis), ``kvcache bisect --measure``
    (by name, or ``name:KEY`` for a figure per key; ``aliases``: older names still accepted) and the sentinel.
    ``apart_from``: a field of the same record this figure is shown beside only where it differs (by ``resolution``):
    passes per stored byte where the class stores fewer or more bytes than the context's K/V."""

    name: str
    label: str
    unit: str
    section: str
    field: str
    verdict: str | None = None
    group: str | None = None
    tolerance: str | None = None
    exact: bool = True
    path: tuple[str, ...] = ()
    fused: bool = False
    interval: str | None = None
    detail: str | None = None
    baseline: str | None = None
    baseline_detail: str | None = None
    resolution: float | None = None
    title: str = ""
    header: str = ""
    aliases: tuple[str, ...] = ()
    summarised: bool = True
    compared: bool = False
    commented: bool = False
    exported: bool = False
    history: bool = False
    bisected: bool = False
    watched: bool = False
    apart_from: str | None = None

    @property
    def identity(self) -> tuple[str, ...]:
        """The identity fields a baseline of this figure and its comparisons are keyed by."""
        return GROUPS[self.group] if self.group else ()

    @property
    def per_key(self) -> bool:
        """One figure per key of a map (a GPU class, a backend): named ``name:KEY`` where a name is needed."""
        return ANY in self.path


COUNTED_RESOLUTION = 0.0005  # passes are shown to 3 decimals: a smaller change is no step

#: Every figure, in the order outputs list them.
MEASURES: tuple[Measure, ...] = (
    Measure("timed", "timed passes", "passes", "fit", "passes", "timed", "timed", "--kv-tolerance", exact=False,
            interval="passes_ci", baseline="timed_passes", title="timed passes (copy bandwidth × latency slope)",
            header="timed passes", compared=True, exported=True, history=True),
    Measure("timed_per_token", "timed passes per generated token", "passes", "fit", "passes_per_token",
            group="timed", exact=False, interval="passes_per_token_ci", header="timed passes/token", compared=True,
            exported=True),  # the timed fit per step over the tokens a step gained: judged as the timed passes
    Measure("counted", "counted passes", "passes", "traffic", "passes", "counted", "counted",
            "--kv-counted-tolerance", fused=True, detail="by_op", baseline="counted_passes",
            baseline_detail="counted_by_op", resolution=COUNTED_RESOLUTION,
            title="counted passes (bytes moved per step / KV-cache bytes)", header="counted passes",
            aliases=("passes",), compared=True, commented=True, exported=True, history=True, bisected=True,
            watched=True),
    Measure("intercept", "intercept", "ms", "fit", "intercept_ms", "intercept", "timed", "--kv-tolerance",
            exact=False, interval="intercept_ci", baseline="timed_intercept_ms",
            title="intercept (ms per step, empty cache)", header="intercept ms", compared=True, exported=True,
            history=True),
    Measure("r2", "R²", "", "fit", "r2", group="timed", exact=False, baseline="timed_r2", header="R²",
            compared=True),
    Measure("ops", "ATen ops per step", "ops", "traffic", "ops_per_step", "overhead", "overhead",
            "--kv-ops-tolerance", detail="calls", baseline="ops_per_step", baseline_detail="op_calls",
            resolution=0.5, title="ATen ops per step", header="ops/step", compared=True, commented=True,
            exported=True, history=True, bisected=True, watched=True),
    Measure("syncs", "host syncs per step", "ops", "traffic", "host_syncs_per_step", "overhead", "overhead",
            detail="host_syncs", baseline="host_syncs_per_step", baseline_detail="host_sync_calls", resolution=0.5,
            title="host syncs per decode step (ops that make the host wait for a GPU)", header="syncs/step",
            compared=True, commented=True, exported=True, history=True, bisected=True, watched=True),
    Measure("weight_passes", "weight passes", "passes", "traffic", "weight_passes", "overhead", "overhead",
            "--kv-weight-passes-tolerance", baseline="weight_passes", resolution=COUNTED_RESOLUTION,
            title="weight passes (fixed bytes per step / weight bytes)", header="weight passes", aliases=("weight",),
            compared=True, commented=True, exported=True, history=True, bisected=True, watched=True),
    Measure("allocated", "memory allocated passes", "passes", "memory", "allocated_passes", "memory", "memory",
            "--kv-memory-tolerance", detail="allocated_by_op", baseline="memory_allocated_passes",
            baseline_detail="memory_allocated_by_op", resolution=COUNTED_RESOLUTION, commented=True, exported=True,
            bisected=True, watched=True),
    Measure("peak", "memory peak passes", "passes", "memory", "peak_passes", "memory", "memory",
            "--kv-memory-tolerance", detail="peak_by_op", baseline="memory_peak_passes",
            resolution=COUNTED_RESOLUTION, commented=True, exported=True, bisected=True, watched=True),
    Measure("held", "memory held passes", "passes", "memory", "held_passes", "memory", "memory",
            "--kv-memory-tolerance", baseline="memory_held_passes", resolution=COUNTED_RESOLUTION,
            header="memory held/peak", compared=True, commented=True, exported=True, bisected=True, watched=True),
    Measure("held_new", "memory held in new storage passes", "passes", "memory", "held_new_passes", group="memory",
            tolerance="--kv-memory-tolerance", resolution=COUNTED_RESOLUTION, summarised=False, exported=True,
            bisected=True, watched=True),
    Measure("gpu", "counted passes on", "passes", "traffic", "passes", "gpus", "counted", "--kv-counted-tolerance",
            path=("gpus", ANY), detail="by_op", baseline="gpu_passes", baseline_detail="gpu_by_op",
            resolution=COUNTED_RESOLUTION, header="passes per GPU class", compared=True, commented=True,
            bisected=True, watched=True),
    Measure("backend", "counted passes under", "passes", "traffic", "passes", group="counted",
            tolerance="--kv-counted-tolerance", path=("backends", ANY), detail="by_op",
            resolution=COUNTED_RESOLUTION, bisected=True, watched=True),
    Measure("stored", "counted passes per stored byte", "passes", "traffic", "stored_passes", group="counted",
            resolution=COUNTED_RESOLUTION, header="per stored byte", compared=True, commented=True,
            apart_from="passes"),
    Measure("per_token", "counted passes per generated token", "passes", "traffic", "passes_per_token",
            "decoding", "counted", "--kv-counted-tolerance", baseline="decoding_per_token",
            resolution=COUNTED_RESOLUTION,
            title="counted passes per generated token (--kv-decoding)", header="passes/token", compared=True,
            exported=True, history=True, bisected=True, watched=True),
    Measure("phase", "counted passes in phase", "passes", "traffic", "passes", "decoding", "counted",
            "--kv-counted-tolerance", path=("phases", ANY), detail="by_op", baseline="decoding_phases",
            resolution=COUNTED_RESOLUTION,
            bisected=True, watched=True),
    Measure("prefill", "prefill passes", "passes", "traffic", "passes", "decoding", "counted",
            "--kv-counted-tolerance", path=("prefill",), detail="by_op", baseline="prefill_passes",
            resolution=COUNTED_RESOLUTION,
            exported=True, bisected=True, watched=True),
    Measure("prefill_extra", "prefill passes chunking adds", "passes", "traffic", "extra_passes", group="counted",
            tolerance="--kv-counted-tolerance", path=("prefill",), detail="extra_by_op",
            resolution=COUNTED_RESOLUTION, exported=True, bisected=True, watched=True),
    Measure("periodic", "periodic passes (amortised)", "passes", "traffic", "periodic_passes", group="counted",
            path=("amortised",), detail="periodic_by_op", resolution=COUNTED_RESOLUTION, header="periodic passes",
            compared=True, exported=True),
    Measure("draft", "draft passes per draft KV byte", "passes", "traffic", "passes", "decoding", "counted",
            "--kv-counted-tolerance", path=("draft",), detail="by_op", baseline="draft_passes",
            resolution=COUNTED_RESOLUTION, exported=True, bisected=True, watched=True),
    Measure("draft_per_token", "draft passes per generated token", "passes", "traffic", "passes_per_token",
            "decoding", "counted", "--kv-counted-tolerance", path=("draft",), baseline="draft_per_token",
            resolution=COUNTED_RESOLUTION, exported=True, bisected=True, watched=True),
    Measure("ledger", "timed passes per op", "passes", "ledger", "timed", "ledger", "timed", "--kv-ledger-tolerance",
            exact=False, interval="timed_ci", baseline="timed_ledger"),
)

BY_NAME: dict[str, Measure] = {m.name: m for m in MEASURES}
VERDICT_NAMES: tuple[str, ...] = tuple(v.name for v in VERDICTS)
#: Verdicts of exact (counted) figures only: never inconclusive for noise, so ``--kv-strict`` leaves them alone.
EXACT_VERDICTS: tuple[str, ...] = tuple(v.name for v in VERDICTS
                                        if all(m.exact for m in MEASURES if m.verdict == v.name))
#: A verdict's label, by name (``counted`` -> ``counted passes``).
VERDICT_LABELS: dict[str, str] = {v.name: v.label for v in VERDICTS}


def of_verdict(verdict: str) -> tuple[Measure, ...]:
    """The figures judged in ``verdict``, in table order."""
    return tuple(m for m in MEASURES if m.verdict == verdict)


def selected(flag: str) -> tuple[Measure, ...]:
    """The measures an output carries, by its flag (``compared``, ``exported``, ``history``, ...), in table order."""
    return tuple(m for m in MEASURES if getattr(m, flag))


def bisect_names(keys: dict[str, tuple[str, ...]] | None = None) -> dict[str, Measure]:
    """``{name: measure}`` a bisect may follow: each bisected figure by name, a per-key figure as ``name:KEY`` for
    each of ``keys[name]`` (the GPU classes, the SDPA backends), its aliases too."""
    out: dict[str, Measure] = {}
    for m in selected("bisected"):
        if m.per_key:
            out.update({f"{m.name}:{key}": m for key in (keys or {}).get(m.name, ())})
        else:
            out.update({name: m for name in (m.name, *m.aliases)})
    return out


def named(name: str, keys: dict[str, tuple[str, ...]] | None = None) -> tuple[Measure, str | None]:
    """The measure a bisect or sentinel name (``counted``, ``passes``, ``gpu:t4``) means, and its key (``t4``);
    KeyError for a name the table does not have."""
    base, _, key = name.partition(":")
    if key:
        m = BY_NAME.get(base)
        if m is None or not m.per_key:
            raise KeyError(name)
        if keys is not None and key not in keys.get(base, ()):
            raise KeyError(name)
        return m, key
    m = BY_NAME.get(name) or next((m for m in MEASURES if name in m.aliases), None)
    if m is None or m.per_key:
        raise KeyError(name)
    return m, None


def concrete_path(measure: Measure, key: str | None) -> tuple[str, ...]:
    """The measure's path with ``key`` in place of :data:`ANY`."""
    return tuple(key if part == ANY else part for part in measure.path)


def finite_number(value: Any) -> bool:
    """Whether ``value`` is a number a figure can be: an int or float, not a bool, finite (an integer too large for a
    float, 10**400, is not)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def record_of(kv: Any, measure: Measure, cache: str) -> Any:
    """The record ``measure`` is read from for ``cache``: ``kv.<section>[cache]`` (the fused count when ``fused``),
    None when the run has none."""
    section = getattr(kv, measure.section, None) or {}
    record = section.get(cache) if isinstance(section, dict) else None
    if record is not None and measure.fused and not measure.path:
        record = record.counted()
    return record


def member_of(node: Any, part: str) -> Any:
    """``node``'s member ``part``: a dict's item, a record's field or, for a field a later schema added, its
    ``extra``; None where absent. Records are walked as they are, never converted to JSON (the conversions happen
    at the process boundary and the file only)."""
    if isinstance(node, dict):
        return node.get(part)
    if node is None or isinstance(node, (str, int, float, list, tuple)):
        return None
    fields = getattr(node, "__dataclass_fields__", {})
    if part in fields and part not in ("extra", "absent"):
        return getattr(node, part)
    extra = getattr(node, "extra", None)
    return extra.get(part) if isinstance(extra, dict) else None


def is_node(node: Any) -> bool:
    """Whether ``node`` holds members (a dict or a record), not a figure."""
    return isinstance(node, dict) or hasattr(node, "__dataclass_fields__")


def raw_of(kv: Any, measure: Measure, cache: str, key: str | None = None) -> tuple[Any, Any]:
    """``(value, per-op detail)`` of ``measure`` for ``cache`` as the record holds them (not checked; None where
    absent). A figure inside a path is followed through the records (:func:`member_of`), a family a later schema adds
    included, before any record knows it."""
    node = record_of(kv, measure, cache)
    for part in concrete_path(measure, key) if measure.path else ():
        node = member_of(node, part)
    if not is_node(node):
        return None, None
    return member_of(node, measure.field), member_of(node, measure.detail) if measure.detail else None


def value_of(kv: Any, measure: Measure, cache: str, key: str | None = None) -> float | None:
    """The figure as a finite number (an int stays an int), None when absent or not a finite number."""
    value, _ = raw_of(kv, measure, cache, key)
    if not finite_number(value):
        return None
    if measure.apart_from:  # shown only where it is another figure than the one it stands beside
        beside = getattr(record_of(kv, measure, cache), measure.apart_from, None)
        if finite_number(beside) and abs(value - beside) < (measure.resolution or 0):
            return None
    return value if isinstance(value, int) else float(value)


def keys_of(kv: Any, measure: Measure, cache: str) -> list[str]:
    """The keys a per-key measure has for ``cache`` in a run (the GPU classes predicted, the backends counted)."""
    node = record_of(kv, measure, cache)
    for part in measure.path[:measure.path.index(ANY)]:
        node = member_of(node, part)
    return [str(k) for k, v in node.items() if is_node(v)] if isinstance(node, dict) else []


def figure_text(measure: Measure, value: float | None) -> str:
    """A figure for a table: whole ops as such, ms to 2 decimals, passes to 3."""
    if value is None:
        return "—"
    if measure.unit == "ops":
        return f"{value:g}"
    return f"{value:.2f}" if measure.unit == "ms" else f"{value:.3f}"
