"""Greedy decoding (``greedy``, the default): one token per step, the session's own point as it is; its records keep
the class's key (``dynamic``)."""

from __future__ import annotations

from typing import Any, Callable

from kvcache.measuring.decoding.base import DecodingStrategy, register_strategy


class Greedy(DecodingStrategy):
    """The plain step: nothing attached to the point, nothing added to the record (runs as before the option)."""

    def point(self, base: type) -> Callable[..., Any]:
        return base


def register() -> None:
    register_strategy("greedy", Greedy)
