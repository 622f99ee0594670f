"""Chunked prefill (``chunked-prefill:C``): the prompt's prefill in C-token chunks, as generate runs it with
``GenerationConfig(prefill_chunk_size=C)``. The decode step after it is greedy's (counted as such, keyed
``<cache>#chunked-prefill:C``); what the strategy adds is the ``prefill`` measure: bytes an empty cache's prefill
moves per logical KV byte it leaves in the cache, chunked against unchunked."""

from __future__ import annotations

from typing import Any

from kvcache.measuring.decoding.base import DecodingStrategy, register_strategy


class ChunkedPrefill(DecodingStrategy):
    family = "chunked-prefill"

    @property
    def chunk(self) -> int:
        return int(self.strategy.number or 1)

    def generation_options(self) -> dict[str, Any]:
        return {"prefill_chunk_size": self.chunk}

    def add_figures(self, counting: Any, key: str, result: Any) -> None:
        from kvcache.measuring.decoding.prefill import prefill_record

        result.update(prefill=prefill_record(counting.session, key, self.chunk))


def register() -> None:
    register_strategy("chunked-prefill", ChunkedPrefill)
