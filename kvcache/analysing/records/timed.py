"""The records of the timed parts of a run's ``kv`` section (layout: docs/records.md; JSON Schema:
``kv.schema.json``) and what is derived from them: timed points, fits, drift, the per-op ledger, the copy bandwidth,
the run's decode speed and the crossovers; :class:`Point`, one timed point from its measurement to the file.
Bandwidths in GB/s (1e9 bytes/s, bytes read + written), times in ms unless a name says ``_s``. Stdlib only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcache.analysing.estimates import median
from kvcache.analysing.records.jsonrecord import (
    Reader,
    Record,
    RecordError,
    absent_field,
    as_list,
    as_object,
    extra_field,
    list_of,
)

#: The fields of a fit per generated token, left out where the strategy gains one token a step.
PER_TOKEN = frozenset({"tokens_per_step", "passes_per_token", "passes_per_token_ci", "per_token_problem"})


@dataclass
class Fit(Record):
    """``kv.fit.<cache>`` with a passes figure (made by :func:`kvcache.analysing.fit.fit_passes`): passes =
    slope (s per KV byte) × copy bandwidth; ``*_ms`` in ms, ``*_gbps`` in GB/s (read + write), ``*_ci``
    [low, high] bootstrap intervals at ``confidence`` over ``resamples`` resamples (a bound is None where it is not
    finite), ``crossover_tokens`` in tokens, ``ci_relative_width`` the passes interval's width over passes. A strategy
    that gains several tokens a step (speculative decoding): ``tokens_per_step``, the tokens each sequence gained per
    timed step (the same at every point), ``passes_per_token`` = passes / tokens_per_step with its interval
    ``passes_per_token_ci`` (the passes interval over the same tokens), or ``per_token_problem``: why there is no
    such figure (the points gained different tokens per step). All four left out when None."""

    passes: float | None
    intercept_ms: float | None = None
    effective_gbps: float | None = None
    passes_ci: list[float | None] | None = None
    r2: float | None = None
    n_points: int | None = None
    cache: str | None = None
    slope_ms_per_gb: float | None = None
    contexts: list[int] | None = None
    copy_gbps: float | None = None
    intercept_ci: list[float | None] | None = None
    effective_gbps_ci: list[float | None] | None = None
    confidence: float | None = None
    resamples: int | None = None
    weight_read_ms: float | None = None
    crossover_tokens: float | None = None
    ci_relative_width: float | None = None
    tokens_per_step: float | None = None
    passes_per_token: float | None = None
    passes_per_token_ci: list[float | None] | None = None
    per_token_problem: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = field(default=PER_TOKEN, repr=False, compare=False)  # left out when None


@dataclass
class FitFailure(Record):
    """``kv.fit.<cache>`` when the points give no passes figure: ``error`` says why (one line)."""

    error: str
    n_points: int | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


def fit_of(entry: Any, where: str) -> Fit | FitFailure:
    """The record of one ``kv.fit.<cache>`` object: a failure when it holds an ``error``."""
    return (FitFailure if isinstance(entry, dict) and "error" in entry else Fit).from_json(entry, where)


@dataclass
class LedgerRow(Record):
    """``kv.ledger.<cache>.<op>``: timed passes of one op (or of ``(other ops)``, ``(unattributed)``,
    ``(profiled step)``, ``(plain step)``): the slope of its seconds per step against KV bytes × the copy bandwidth
    (any sign), its interval, and ``ms``, its median milliseconds per step at the largest profiled context. On
    ``(profiled step)`` only, ``over_plain``: per context (tokens, as a string), the profiled step over the plain
    step just before it, minus 1, the median of the point's pairs (what the instrument did to the step)."""

    timed: float | None
    timed_ci: list[float | None] | None = None
    ms: float | None = None
    over_plain: dict[str, float] | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class LedgerPoint(Record):
    """``kv.ledger_points[]``: one profiled (cache, context): ``kv_bytes`` (bytes), seconds of each profiled
    step (``step_s``) and of each op in it (``ops_s``: {op: [seconds per step]}), and seconds of each plain step
    taken between the profiled ones on the same point (``plain_s``; empty with ``--kv-driver generate`` and in runs
    before 2026-12-06)."""

    cache: str
    context: int
    kv_bytes: float
    step_s: list[float] = field(default_factory=list)
    ops_s: dict[str, list[float]] = field(default_factory=dict)
    plain_s: list[float] = field(default_factory=list)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class Speed(Record):
    """``kv.speed``: the run's decode speed, ``weights_ms`` (median ms per profiled step of the ``ops`` that read
    the weights, over ``steps`` profiled steps)."""

    weights_ms: float | None = None
    ops: list[str] = field(default_factory=list)
    steps: int | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class Drift(Record):
    """``kv.drift`` measured: median step (ms) of the first timed point and of its re-measurement at the end;
    ``fraction`` = last / first - 1 (None when not finite), ``ok`` when within ``max_fraction``; ``effect``: what a
    drift beyond the limit does. ``problem``: why, on the drift-like record of a change of decode speed against
    the baseline (:func:`kvcache.analysing.judge.gate.speed_shift`; never in a written section)."""

    ok: bool
    cache: str | None = None
    context: int | None = None
    first_ms: float | None = None
    last_ms: float | None = None
    fraction: float | None = None
    max_fraction: float | None = None
    effect: str | None = None
    problem: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = field(default=frozenset({"problem"}), repr=False, compare=False)  # left out when None


@dataclass
class UnmeasuredDrift(Record):
    """``kv.drift`` when it could not be measured: ``reason`` says why."""

    reason: str
    max_fraction: float | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


def drift_of(entry: Any, where: str) -> Drift | UnmeasuredDrift:
    """The record of a ``kv.drift`` object: unmeasured when it holds a ``reason``."""
    return (UnmeasuredDrift if isinstance(entry, dict) and "reason" in entry else Drift).from_json(entry, where)


@dataclass
class PointCompile(Record):
    """``kv.points[].compiled`` (--kv-compile): one timed point's compilation: seconds compiling in its untimed
    preparation (``compile_s``), dynamo's counters over the timed steps (``graphs_compiled``, ``recompiles``,
    ``graph_breaks``), compiled graph calls per timed step (0: it ran eagerly), and ``problem``: why its timed figure
    is inconclusive (None when it is not)."""

    mode: str | None = None
    compile_s: float | None = None
    graphs_compiled: int | None = None
    recompiles: int | None = None
    graph_breaks: int | None = None
    graph_calls_per_step: float | None = None
    problem: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class Point(Record):
    """One timed point, from its measurement to the file: ``cache`` at ``context`` tokens in ``round``, and
    ``samples_s``, the seconds of each timed step as measured. ``kv_bytes``: logical KV bytes held (bytes of K and V
    for the tokens in the cache, averaged over the timed steps), ``counted_bytes``: bytes one step moves,
    ``achieved_gbps`` = counted bytes / median step in GB/s, ``achieved_fraction`` its share of the session's copy
    bandwidth (the analysis's). ``kind``: ``timed``, or ``drift`` for the first point measured again at the end (never
    in ``kv.points``). ``tokens_per_step``: the tokens each sequence gained per timed step, the mean over the timed
    steps (speculative decoding; left out where a step gains one token).

    Its JSON is one entry of ``kv.points`` (the transport to the controller writes the same): the steps in ms,
    ``samples_ms`` and their ``median_ms``, derived from ``samples_s``. A pytest-benchmark ``benchmarks[]`` entry is
    read by :meth:`from_benchmark` (run files without ``kv.points`` samples)."""

    cache: str
    context: int
    kv_bytes: float
    round: int = 0
    samples_s: list[float] | None = None
    counted_bytes: float | None = None
    achieved_gbps: float | None = None
    achieved_fraction: float | None = None
    beyond_trained_context: bool = False
    name: str = ""
    compiled: PointCompile | None = None
    kv_bytes_allocated: float | None = None  # --kv-batch: KV bytes of the left-padded batch (kv_bytes: live ones)
    kind: str = "timed"
    tokens_per_step: float | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = field(default=frozenset({"kind", "tokens_per_step"}), repr=False,
                                   compare=False)  # left out when timed, and when None

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"compiled": PointCompile.from_json}

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> Point:
        """The point of a ``kv.points`` entry (steps in ms: ``samples_ms``; ``median_ms`` is derived from them) or
        of a record that names the steps in seconds (``samples_s``)."""
        where = where or "point"
        data = dict(as_object(data, where))
        samples_ms = data.pop("samples_ms", None)
        read = None
        if samples_ms is not None and "samples_s" not in data:
            data["samples_s"] = [float(x) / 1e3 for x in as_list(samples_ms, f"{where}.samples_ms")]
            read = (list(data["samples_s"]), samples_ms, data.get("median_ms"))
        if data.get("samples_s") is not None or "median_ms" not in data:
            data.pop("median_ms", None)  # derived from the samples (kept as read only where none are)
        point = super().from_json(data, where)
        point._read_ms = read
        return point

    def _as_read(self) -> tuple[list[float], float | None] | None:
        """The ms read from the file (``samples_ms``, ``median_ms``) while ``samples_s`` are still the seconds
        derived from them: written back as read (ms / 1e3 * 1e3 is not always the same float)."""
        read = getattr(self, "_read_ms", None)
        if read is None or read[0] != self.samples_s:
            return None
        return read[1], read[2]

    def to_json(self) -> dict[str, Any]:
        """The ``kv.points`` entry: ``samples_s`` written as ``median_ms`` and ``samples_ms``, in that place."""
        out: dict[str, Any] = {}
        for key, value in super().to_json().items():
            if key == "samples_s":
                out["median_ms"], out["samples_ms"] = self.median_ms, self.samples_ms
            else:
                out[key] = value
        return out

    @classmethod
    def from_benchmark(cls, bench: dict[str, Any]) -> Point | None:
        """The timed point of one entry of pytest-benchmark's ``benchmarks`` list (``extra_info`` and every step's
        seconds in ``stats.data``), or None if it is not one."""
        info, stats = bench.get("extra_info"), bench.get("stats")
        if not (isinstance(info, dict) and info.get("kind") == "timed" and isinstance(stats, dict)
                and stats.get("data")):
            return None
        return cls(cache=str(info["cache"]), context=int(info["context"]), round=int(info.get("round", 0)),
                   kv_bytes=float(info["kv_bytes"]), samples_s=[float(s) for s in stats["data"]],
                   beyond_trained_context=bool(info.get("beyond_trained_context", False)),
                   counted_bytes=info.get("counted_bytes"), name=str(bench.get("name", "")))

    @property
    def median_s(self) -> float:
        """The median step in seconds (needs ``samples_s``)."""
        if not self.samples_s:
            raise RecordError(f"point {self.cache} at {self.context}: no samples")
        return median(self.samples_s)

    @property
    def median_ms(self) -> float | None:
        """The median step in ms; None without samples."""
        if not self.samples_s:
            return self.extra.get("median_ms")
        read = self._as_read()
        return read[1] if read is not None and read[1] is not None else self.median_s * 1e3

    @property
    def samples_ms(self) -> list[float] | None:
        """Every step in ms; None without samples."""
        read = self._as_read()
        if read is not None:
            return list(read[0])
        return None if self.samples_s is None else [s * 1e3 for s in self.samples_s]


@dataclass
class CopyMeasurement(Record):
    """One copy-bandwidth measurement (``label``: when in the session): the median ``gbps`` of its copies of a
    ``nbytes`` tensor, each sample counting bytes read + written, in GB/s."""

    gbps: float | None
    label: str = ""
    nbytes: int | None = None
    samples_gbps: list[float] = field(default_factory=list)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class Copy(Record):
    """``kv.copy``: the copy bandwidth (GB/s, read + write) at the start and end of the session, every measurement."""

    start_gbps: float | None = None
    end_gbps: float | None = None
    measurements: list[CopyMeasurement] = field(default_factory=list)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"measurements": list_of(CopyMeasurement.from_json)}


@dataclass
class CacheCrossovers(Record):
    """``kv.crossovers.<cache>``: the contexts (tokens) at which a step's cache traffic equals one read of the
    weights, from the timed passes (``timed_tokens``) and the counted ones (``counted_tokens``), and at which the
    bytes the class holds (``kv.memory.<cache>.held_passes`` × KV bytes) equal the weights (``held_tokens``)."""

    timed_tokens: float | None = None
    counted_tokens: float | None = None
    held_tokens: float | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = field(default=frozenset({"held_tokens"}), repr=False, compare=False)  # left out when None


@dataclass
class Crossovers(Record):
    """``kv.crossovers``: ``cache_holds_weights_tokens`` (the context at which the cache holds as many bytes as the
    weights) beside one :class:`CacheCrossovers` per class, keyed by the class's name in the same object."""

    cache_holds_weights_tokens: float | None = None
    by_cache: dict[str, CacheCrossovers] = field(default_factory=dict)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def from_json(cls, data: Any, where: str = "crossovers") -> Crossovers:
        data = as_object(data, where)
        classes = {k: v for k, v in data.items() if k != "cache_holds_weights_tokens"}
        return cls(cache_holds_weights_tokens=data.get("cache_holds_weights_tokens"),
                   by_cache={k: CacheCrossovers.from_json(v, f"{where}.{k}") for k, v in classes.items()},
                   absent=frozenset() if "cache_holds_weights_tokens" in data else frozenset(
                       {"cache_holds_weights_tokens"}))

    def to_json(self) -> dict[str, Any]:
        head = {} if "cache_holds_weights_tokens" in self.absent and self.cache_holds_weights_tokens is None else {
            "cache_holds_weights_tokens": self.cache_holds_weights_tokens}
        return {**head, **{cache: entry.to_json() for cache, entry in self.by_cache.items()}}
