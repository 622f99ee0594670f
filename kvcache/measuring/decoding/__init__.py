"""Decoding strategies (``--kv-decoding``), the measuring side: a registry of strategy families, each a
:class:`DecodingStrategy` saying how one decode step of a point is run and counted under it, which phases its bytes are
split into and why a class cannot run it on this release. The names and the record keys
(``<cache>[@<attention>]#<strategy>``) are :mod:`kvcache.analysing.decoding`'s; one module here per family:
``greedy`` (the plain step), ``beam`` (beam search), ``chunked`` (chunked prefill). Others register theirs with
:func:`register_strategy` (docs/strategies.md). docs/decoding.md."""

from __future__ import annotations

from typing import Callable

from kvcache.analysing import decoding as names
from kvcache.analysing.decoding import PHASES, Strategy
from kvcache.measuring.counting.traffic import FORWARD
from kvcache.measuring.decoding.base import (
    _STRATEGIES,
    CROP,
    DRAFT,
    OTHER,
    REORDER,
    DecodingStrategy,
    Unregistered,
    register_strategy,
)

__all__ = ["PHASES", "CROP", "DRAFT", "FORWARD", "OTHER", "REORDER", "DecodingStrategy", "Unregistered",
           "register_strategy", "strategies", "strategy_for"]


def strategies() -> dict[str, Callable[[Strategy], DecodingStrategy]]:
    _register_builtin_strategies()
    return dict(_STRATEGIES)


def strategy_for(key: str) -> DecodingStrategy:
    """The strategy of a record key (``dynamic#beam:4`` -> beam search with 4 beams; a plain key: greedy)."""
    strategy = names.strategy_of(key)
    factory = strategies().get(strategy.family)
    if factory is None:
        return Unregistered(strategy)
    return factory(strategy)


_builtins = False


def _register_builtin_strategies() -> None:
    global _builtins
    if _builtins:
        return
    _builtins = True
    from kvcache.measuring.decoding import beam, chunked, greedy, speculative

    greedy.register()
    beam.register()
    chunked.register()
    speculative.register()
