"""Plain records: what a benchmark run measured, read from and written to pytest-benchmark's JSON.

This module (and everything in the analysing wing: fit, gate, compare, report) never imports torch,
so runs can be compared and reported on a machine that has no torch.

The JSON is pytest-benchmark's (``machine_info``, ``commit_info``, ``benchmarks``, ...) with one
extra top-level key, ``kv``, written by this project's plugin. Timed points are the benchmarks whose
``extra_info.kind == "timed"``; their ``stats.data`` holds one wall-clock time in seconds per timed
decode step. The ``kv`` section (all bandwidths in GB/s = 1e9 bytes/s, counting bytes read plus bytes
written; all times in ms unless a key says ``_s``/``_ns``)::

    kv.schema            2 (files of schema 1 still load: :func:`upgrade_kv`)
    kv.settings          the ``--kv-*`` settings of the run (:class:`kvcache.settings.Settings`)
    kv.environment       {device_name, device_type, transformers, torch, python, platform, threads}
    kv.identity          {device_name, device_type, model, dtype, threads}: what makes runs comparable
    kv.model             {name, layers, heads, kv_heads, head_dim, dtype, bytes_per_token, weight_bytes,
                          max_position_embeddings}
    kv.copy_gbps         median copy bandwidth of the session (read + write of a 1 GiB copy)
    kv.copy              {start_gbps, end_gbps, measurements: [{label, gbps, nbytes, samples_gbps}]}
    kv.fit.<cache>       {intercept_ms, effective_gbps, passes, r2, n_points, passes_ci, intercept_ci,
                          confidence, weight_read_ms, crossover_tokens, contexts}, or {error, n_points}
                          when the points give no passes figure (error: why, one line)
    kv.crossovers        {cache_holds_weights_tokens, <cache>: {timed_tokens, counted_tokens}}: contexts (tokens)
                          at which the cache holds as many bytes as the weights (weight_bytes / bytes_per_token),
                          and at which a step's cache traffic (timed or counted passes) equals one read of the
                          weights (weight_bytes / (passes × bytes_per_token)); null where there is no figure
    kv.drift             {cache, context, first_ms, last_ms, fraction, max_fraction, ok} or {reason}
    kv.traffic.<cache>   {passes, by_op: {op: passes}, contexts, step_bytes: {context: {read, written}},
                          bytes_per_token, calls}
    kv.probe.<cache>     {query, key, value, mask, attention, expansions, enable_gqa, calls}
    kv.verdict.<cache>.<measure>   {status, value, allowed, reason, interval?, grew?}; measures: counted, timed
    kv.points            [{cache, context, round, median_ms, samples_ms, kv_bytes, counted_bytes,
                           achieved_gbps, achieved_fraction, beyond_trained_context, name}]
                          (achieved_gbps: counted bytes of the step / median step; achieved_fraction: its
                          share of kv.copy_gbps, the session median)
    kv.session           {interrupted, exit, failed: [cache]}: whether the session ran to its end
    kv.skipped           [{cache, context, reason}]   (context is null for a whole class)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcache.analysing.stats import median

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)


class RecordError(ValueError):
    """A run file that cannot be read as a kvcache-passes run; the message is one line naming the file."""


@dataclass(frozen=True)
class Point:
    """One timed benchmark: ``steps`` decode steps of ``cache`` at ``context`` tokens in one round.

    ``samples_s`` are per-step wall-clock seconds; ``kv_bytes`` is the logical KV-cache size (bytes of
    K and V held for the tokens in the cache, averaged over the timed steps) that the step must read.
    """

    cache: str
    context: int
    round: int
    kv_bytes: float
    samples_s: tuple[float, ...]
    beyond_trained_context: bool = False
    counted_bytes: float | None = None
    name: str = ""

    @property
    def median_s(self) -> float:
        return median(self.samples_s)


@dataclass
class Run:
    """One benchmark JSON file: its timed points, its ``kv`` section and where it came from."""

    path: str
    points: list[Point] = field(default_factory=list)
    kv: dict[str, Any] = field(default_factory=dict)
    machine_info: dict[str, Any] = field(default_factory=dict)
    datetime: str = ""

    @property
    def environment(self) -> dict[str, Any]:
        return self.kv.get("environment", {})

    @property
    def transformers(self) -> str:
        return str(self.environment.get("transformers", "?"))

    @property
    def device(self) -> str:
        env = self.environment
        return str(env.get("device_name") or env.get("device_type") or "?")

    @property
    def label(self) -> str:
        return f"transformers {self.transformers} on {self.device}"

    def caches(self) -> list[str]:
        """Cache classes that appear anywhere in the run, in first-seen order."""
        seen: dict[str, None] = {}
        for p in self.points:
            seen.setdefault(p.cache)
        for key in ("fit", "traffic", "verdict", "probe"):
            for name in self.kv.get(key, {}) or {}:
                seen.setdefault(name)
        return list(seen)


def point_from_benchmark(bench: dict[str, Any]) -> Point | None:
    """A Point from one entry of pytest-benchmark's ``benchmarks`` list, or None if it is not a timed point."""
    info = bench.get("extra_info") or {}
    if info.get("kind") != "timed":
        return None
    stats = bench.get("stats") or {}
    data = stats.get("data") or []
    if not data:
        return None
    return Point(
        cache=str(info["cache"]),
        context=int(info["context"]),
        round=int(info.get("round", 0)),
        kv_bytes=float(info["kv_bytes"]),
        samples_s=tuple(float(x) for x in data),
        beyond_trained_context=bool(info.get("beyond_trained_context", False)),
        counted_bytes=info.get("counted_bytes"),
        name=str(bench.get("name", "")),
    )


def points_from_benchmarks(benchmarks: list[dict[str, Any]]) -> list[Point]:
    """Timed points of a ``benchmarks`` list, in run order (drift re-measurements excluded)."""
    points = []
    for bench in benchmarks:
        point = point_from_benchmark(bench)
        if point is not None:
            points.append(point)
    return points


def points_from_section(entry: dict[str, Any]) -> Point:
    """A Point from one entry of ``kv.points`` (schema 2: every step's time is kept there)."""
    return Point(cache=str(entry["cache"]), context=int(entry["context"]), round=int(entry.get("round", 0)),
                 kv_bytes=float(entry["kv_bytes"]), samples_s=tuple(float(x) / 1e3 for x in entry["samples_ms"]),
                 beyond_trained_context=bool(entry.get("beyond_trained_context", False)),
                 counted_bytes=entry.get("counted_bytes"), name=str(entry.get("name", "")))


def upgrade_kv(kv: dict[str, Any]) -> dict[str, Any]:
    """A ``kv`` section of schema 1 in the shape of schema 2: verdicts per measure (``value`` for
    ``measured``), the run's identity, and an unknown session state (schema 1 did not record it)."""
    if kv.get("schema") == SCHEMA:
        return kv
    verdicts = {}
    for cache, combined in (kv.get("verdict") or {}).items():
        verdicts[cache] = {}
        for measure in ("counted", "timed"):
            old = (combined or {}).get(measure) or {}
            verdicts[cache][measure] = {"status": old.get("status", "not-measured"), "value": old.get("measured"),
                                        "allowed": old.get("allowed"), "reason": old.get("reason", ""),
                                        **({"interval": old["interval"]} if old.get("interval") else {})}
    from kvcache.analysing import identity

    return {**kv, "schema": SCHEMA, "verdict": verdicts, "identity": kv.get("identity", identity.of_run(kv)),
            "session": kv.get("session", {"interrupted": None, "exit": "unknown (schema 1)", "failed": []})}


def load_run(path: str | Path) -> Run:
    """Read a ``--benchmark-json`` file; raise RecordError with a one-line message naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecordError(f"{p}: cannot read ({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{p}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise RecordError(f"{p}: not a pytest-benchmark JSON file (no 'benchmarks' list)")
    kv = doc.get("kv")
    if not isinstance(kv, dict):
        raise RecordError(f"{p}: no 'kv' section; was it written by `pytest benchmarks --benchmark-json`?")
    if kv.get("schema") not in READABLE_SCHEMAS:
        raise RecordError(f"{p}: kv schema {kv.get('schema')!r} is not one of the supported "
                          f"{', '.join(map(str, READABLE_SCHEMAS))}")
    kv = upgrade_kv(kv)
    try:
        if any("samples_ms" in p for p in kv.get("points") or []):
            points = [points_from_section(point) for point in kv["points"]]
        else:
            points = points_from_benchmarks(doc["benchmarks"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"{p}: malformed benchmark entry ({exc})") from None
    return Run(
        path=str(p),
        points=points,
        kv=kv,
        machine_info=doc.get("machine_info") or {},
        datetime=str(doc.get("datetime", "")),
    )


def jsonable(value: Any) -> Any:
    """Replace non-finite floats by None (JSON has no NaN/inf) recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
