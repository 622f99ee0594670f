"""The batch a decode step serves (``--kv-batch N``, ``--kv-ragged``): how many sequences, how many tokens each
holds, and the logical KV bytes that makes, *live* (what the sequences hold: the gated denominator) and
*allocated* (the left-padded rectangle; their ratio is the padding waste). Plain arithmetic over a
:class:`~kvcache.measuring.geometry.ModelSpec`, no torch (docs/drivers.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchShape:
    """``size`` sequences per step; ``ragged``: their lengths spread evenly over the context (left padding)."""

    size: int = 1
    ragged: bool = False

    def lengths(self, context: int) -> list[int]:
        """Tokens each sequence holds when the longest holds ``context``: all ``context``, or (ragged) sequence
        ``i`` holds ``ceil(context * (size - i) / size)``: ``context``, ..., ``context / size``."""
        if not self.ragged:
            return [context] * self.size
        return [max(1, math.ceil(context * (self.size - i) / self.size)) for i in range(self.size)]

    def pads(self, context: int) -> list[int]:
        """Left-padding slots of each sequence at ``context`` (0 for the longest)."""
        return [context - n for n in self.lengths(context)]

    def live_bytes(self, spec: Any, context: int, added: float = 0) -> float:
        """Logical KV bytes the batch's sequences hold: each its own length + ``added`` decoded tokens."""
        return sum(spec.kv_bytes(n + added) for n in self.lengths(context))

    def live_bytes_of(self, spec: Any, kind: str, context: int, added: float = 0) -> float:
        """:meth:`live_bytes` of the layers of one kind (``full``, ``sliding``, ``linear``)."""
        return sum(spec.kv_bytes_of(kind, n + added) for n in self.lengths(context))

    def allocated_bytes(self, spec: Any, context: int, added: float = 0) -> float:
        """Logical KV bytes of a rectangular batch cache: ``size`` rows of ``context + added`` tokens."""
        return self.size * spec.kv_bytes(context + added)
