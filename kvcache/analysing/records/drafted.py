"""``kv.traffic.<cache>.draft``: the draft of a speculative strategy's counted step (records.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcache.analysing.records.jsonrecord import Record, absent_field, extra_field


@dataclass
class DraftTraffic(Record):
    """``kv.traffic.<cache>.draft`` (``assisted:MODEL:K``, ``prompt-lookup:K``): the counted step's draft, beside the
    main cache and never in its denominator: the draft ``model`` and its ``cache`` class, candidates ``drafted`` and
    ``accepted`` (``acceptance`` = accepted / drafted); the draft phase per KV byte the draft's cache holds
    (``passes``, ``passes_per_token``, ``by_op``; that cache's ``bytes_per_token``: None for prompt lookup, which has
    none); ``step_bytes`` {context: bytes of the draft phase}."""

    model: str | None = None
    cache: str | None = None
    drafted: int | None = None
    accepted: float | None = None
    acceptance: float | None = None
    bytes_per_token: int | None = None
    passes: float | None = None
    passes_per_token: float | None = None
    by_op: dict[str, float] = field(default_factory=dict)
    step_bytes: dict[str, int] | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()
