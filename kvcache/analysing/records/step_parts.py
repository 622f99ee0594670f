"""Parts of a counted step's record (``kv.traffic.<cache>``) that some classes and keys have: the steps of a window
covering a class's period (:class:`AmortisedTraffic`), a decoding strategy's phases (:class:`PhaseTraffic`) and a
chunked prefill (:class:`PrefillTraffic`). Passes are bytes read + written per logical KV byte. Stdlib only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcache.analysing.records.jsonrecord import Record, absent_field, extra_field


@dataclass
class AmortisedTraffic(Record):
    """``kv.traffic.<cache>.amortised``: a class whose work comes every ``period`` decode steps (a quantized cache's
    residual flushed every ``residual_length`` tokens, a compression every N steps; ``period_source``: ``declared``
    at registration), counted over ``window`` consecutive steps at each context (a window covering the period):
    ``passes`` per step amortised over the window (Δ bytes of the window / Δ KV bytes held over its steps), per op in
    ``by_op``; ``step_passes``: what its steady step moves (the cheapest step of the window at each context);
    ``periodic_passes``/``periodic_by_op``: the amortised passes minus the steady step's, the periodic part named
    by op; ``step_bytes`` {context: bytes the window's steps read + wrote}; ``error``: why it was not counted over a
    window (``--kv-driver generate``), the figures then null."""

    period: int | None = None
    window: int | None = None
    period_source: str | None = None
    passes: float | None = None
    by_op: dict[str, float] = field(default_factory=dict)
    step_passes: float | None = None
    periodic_passes: float | None = None
    periodic_by_op: dict[str, float] = field(default_factory=dict)
    step_bytes: dict[str, int] | None = None
    error: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class PhaseTraffic(Record):
    """``kv.traffic.<cache>.phases.<phase>`` (forward, reorder, crop, draft): the counted step's ops charged to one
    phase of its decoding strategy: ``passes`` (Δ bytes read + written in that phase / Δ logical KV bytes held, the
    same denominator as the step's), per op in ``by_op``; ``step_bytes`` {context: bytes of that phase}."""

    passes: float | None = None
    by_op: dict[str, float] = field(default_factory=dict)
    step_bytes: dict[str, int] | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class PrefillTraffic(Record):
    """``kv.traffic.<cache>.prefill`` (``chunked-prefill:C``): bytes an empty cache's prefill of ``context`` tokens
    moves per logical KV byte it leaves in the cache (``kv_bytes``): ``passes`` in ``chunk``-token chunks, per op
    in ``by_op``; ``unchunked_passes``/``unchunked_by_op`` in one forward; ``extra_passes`` (chunked − unchunked)
    and ``extra_by_op``: what chunking adds, in cache sizes; ``chunks``; ``step_bytes`` {chunked, unchunked};
    passes None with ``error`` where the release cannot chunk a prefill."""

    context: int | None = None
    chunk: int | None = None
    chunks: int | None = None
    kv_bytes: float | None = None
    passes: float | None = None
    by_op: dict[str, float] = field(default_factory=dict)
    unchunked_passes: float | None = None
    unchunked_by_op: dict[str, float] = field(default_factory=dict)
    extra_passes: float | None = None
    extra_by_op: dict[str, float] = field(default_factory=dict)
    step_bytes: dict[str, int] | None = None
    error: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()
