"""One baseline entry (``devices.<key>.<cache>`` of the baseline file): its fields as a record
(:class:`BaselineEntry`), the range of every figure it may hold, and the checks that refuse one out of range,
whether read from a file or recorded from a run. Stdlib only."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvcache.analysing.records.jsonrecord import Record, absent_field, extra_field

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
    "host_syncs_per_step": Range(0, MAX_OPS, whole=True),
    "weight_passes": Range(0, MAX_PASSES),
    "fixed_bytes": Range(-MAX_BYTES, MAX_BYTES, whole=True),  # an intercept: bytes at an empty cache, may dip below 0
    "layers": Range(1, MAX_LAYERS, whole=True),
    # Counted memory: slopes of bytes per KV byte; allocated and peak may dip below 0 (a class that allocates less at a
    # larger context), held is what the class keeps.
    "memory_allocated_passes": Range(-MAX_PASSES, MAX_PASSES),
    "memory_peak_passes": Range(-MAX_PASSES, MAX_PASSES),
    "memory_held_passes": Range(-MAX_PASSES, MAX_PASSES),
    # --kv-decoding keys: passes per generated token, the chunked prefill's passes per KV byte it leaves, a draft
    # model's passes per KV byte its own cache holds and per generated token (a draft with a cache reads it)
    "decoding_per_token": Range(0, MAX_PASSES, above=True),
    "prefill_passes": Range(0, MAX_PASSES, above=True),
    "draft_passes": Range(0, MAX_PASSES, above=True),
    "draft_per_token": Range(0, MAX_PASSES, above=True),
}
#: Every ``{op: number}`` map an entry holds, and the range of each number. An op's passes may be below 0: a
#: counted op seen at the low context only has a falling slope, and a ledger op's timed slope is noise around 0.
OP_FIGURES = {
    "counted_by_op": Range(-MAX_PASSES, MAX_PASSES),
    "timed_ledger": Range(-MAX_PASSES, MAX_PASSES),
    "op_calls": Range(0, MAX_OPS, whole=True),
    "host_sync_calls": Range(0, MAX_OPS, whole=True),  # {op: calls that wait for the device on CUDA}
    "memory_allocated_by_op": Range(-MAX_PASSES, MAX_PASSES),
    "gpu_passes": Range(0, MAX_PASSES, above=True),  # {GPU class: counted passes under its SDPA backend}
    "decoding_phases": Range(-MAX_PASSES, MAX_PASSES),  # {phase: counted passes} of a --kv-decoding key's step
}
#: Every ``{GPU class: {op: number}}`` map an entry holds, and the range of each number.
NESTED_OP_FIGURES = {"gpu_by_op": Range(-MAX_PASSES, MAX_PASSES)}
#: Text an entry holds (where the figures came from); a string or null.
TEXTS = ("recorded", "transformers", "torch", "model", "dtype")
#: Figures of a timed entry that are recorded as null when out of range, the passes beside them kept.
TIMED_NULLABLE = ("timed_intercept_ms", "timed_weights_ms", "timed_ledger")


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
        if ops is None:
            continue
        if not isinstance(ops, dict):
            out[name] = f"{name} is {value_shown(ops)}, expected an object of op: number, or null"
            continue
        for op, value in ops.items():
            problem = figure_problem(value, within)
            if problem:
                out[name] = f"{name}[{value_shown(op)}] {problem}"
                break
    for name, within in NESTED_OP_FIGURES.items():
        nested = entry.get(name)
        if nested is None:
            continue
        if not isinstance(nested, dict) or not all(isinstance(ops, dict) for ops in nested.values()):
            out[name] = f"{name} is {value_shown(nested)}, expected an object of GPU class: {{op: number}}, or null"
            continue
        bad = next(((gpu, op, problem) for gpu, ops in nested.items() for op, value in ops.items()
                    for problem in [figure_problem(value, within)] if problem), None)
        if bad:
            out[name] = f"{name}[{value_shown(bad[0])}][{value_shown(bad[1])}] {bad[2]}"
    for name in TEXTS:
        value = entry.get(name)
        if value is not None and not isinstance(value, str):
            out[name] = f"{name} is {value_shown(value)}, expected a string or null"
    return out


def entry_problem(entry: dict[str, Any]) -> str | None:
    """The first of :func:`entry_problems`, or None."""
    return next(iter(entry_problems(entry).values()), None)



@dataclass
class BaselineEntry(Record):
    """One class's figures under one baseline key, each null (None) when not known: timed (``timed_passes``,
    ``timed_r2``, ``timed_intercept_ms`` in ms, ``timed_ledger`` {op: timed passes}, ``timed_weights_ms`` the run's
    decode speed in ms), counted (``counted_passes``, ``counted_by_op`` {op: passes}), counted overhead
    (``ops_per_step``, ``data_ops_per_step``, ``weight_passes``, ``fixed_bytes`` in bytes, ``layers``, ``op_calls``
    {op: calls}, ``host_syncs_per_step`` and ``host_sync_calls`` {op: calls}: ops that make the host wait for the device
    on CUDA), counted memory (``memory_*_passes``: bytes per KV byte, ``memory_allocated_by_op``), counted passes
    per GPU class (``gpu_passes`` {class: passes}, ``gpu_by_op`` {class: {op: passes}}; --kv-gpus), a decoding
    strategy's figures (``decoding_per_token``, ``decoding_phases`` {phase: passes}, ``prefill_passes``, a draft
    model's ``draft_passes`` per KV byte its own cache holds and ``draft_per_token``), and where
    they came from (``recorded``: ISO date-time, ``transformers``, ``torch``, ``model``, ``dtype``)."""

    timed_passes: float | None = None
    timed_r2: float | None = None
    timed_intercept_ms: float | None = None
    timed_ledger: dict[str, float] | None = None
    timed_weights_ms: float | None = None
    counted_passes: float | None = None
    counted_by_op: dict[str, float] | None = None
    ops_per_step: int | None = None
    data_ops_per_step: int | None = None
    weight_passes: float | None = None
    fixed_bytes: int | None = None
    layers: int | None = None
    op_calls: dict[str, int] | None = None
    host_syncs_per_step: int | None = None
    host_sync_calls: dict[str, int] | None = None
    memory_allocated_passes: float | None = None
    memory_peak_passes: float | None = None
    memory_held_passes: float | None = None
    memory_allocated_by_op: dict[str, float] | None = None
    gpu_passes: dict[str, float] | None = None
    gpu_by_op: dict[str, dict[str, float]] | None = None
    decoding_per_token: float | None = None
    decoding_phases: dict[str, float] | None = None
    prefill_passes: float | None = None
    draft_passes: float | None = None
    draft_per_token: float | None = None
    recorded: str | None = None
    transformers: str | None = None
    torch: str | None = None
    model: str | None = None
    dtype: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()
