"""Test-only cache classes and hooks for checking the gates: a clean dynamic cache and its twins, one with a
planted extra full copy of K and V per step (+2 passes: the copy reads the cache and writes it again), one with
a planted whole-cache read (a reduction over K and V: +1 pass), one with three tiny extra ops per layer and no
cache traffic (+3 ops per layer per step, passes unchanged); and a model hook that reads the embedding matrix
once more per step (+its share of the weight bytes in weight passes); one whose beam-search reorder copies the cache
twice (``twin-reorder``: +2 passes under ``--kv-decoding beam:N``, none greedy). Registered as ``twin-clean``,
``twin-planted``, ``twin-read``, ``twin-extra-ops`` and ``twin-reorder`` by the suite's ``benchmarks/conftest.py``
(never by the production registry); not part of ``--kv-caches all``."""

from __future__ import annotations

import math
from typing import Any

from transformers import cache_utils


class PlantedCopyCache(cache_utils.DynamicCache):
    """DynamicCache that clones the whole of K and V after every append: one extra read + write."""

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        return keys.clone(), values.clone()


class PlantedReadCache(cache_utils.DynamicCache):
    """DynamicCache that reads the whole of K and V once more after every append (a reduction over each):
    +1 pass, an op (``sum``) that reads the cache and writes one number."""

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        keys.sum()
        values.sum()
        return keys, values


class ExtraOpsCache(cache_utils.DynamicCache):
    """DynamicCache that runs three tiny ATen ops (sum, add, mul over the new token's keys) per layer update:
    +3 ops per layer per step, a few bytes each, no cache traffic."""

    EXTRA_OPS = 3

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        key_states.sum().add(1).mul(2)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class PlantedReorderCache(cache_utils.DynamicCache):
    """DynamicCache whose beam-search reorder copies the cache twice: ``reorder_cache`` (``index_select`` of every
    layer's K and V) then a clone of each: +2 passes in a beam step's ``reorder`` phase, nothing under greedy
    decoding (which never reorders)."""

    def reorder_cache(self, beam_idx: Any) -> None:
        super().reorder_cache(beam_idx)
        for layer in self.layers:
            layer.keys, layer.values = layer.keys.clone(), layer.values.clone()


def read_embeddings_each_step(model: Any) -> Any:
    """A forward pre-hook that reads the whole embedding matrix once more per step (a reduction over it);
    returns the hook's handle (``.remove()`` undoes it)."""
    table = model.get_input_embeddings().weight

    def read(*_: Any) -> None:
        table.sum()

    return model.register_forward_pre_hook(read)


class RecompilingCache(cache_utils.DynamicCache):
    """DynamicCache that makes a compiled step recompile at every step: its update reads a string attribute that
    changes each step (dynamo guards a string by value, and no automatic dynamic shapes rescue it)."""

    tag = "step-0"

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        if layer_idx == 0:
            self.tag = f"step-{int(self.tag[5:]) + 1}"
        return (keys * 1 if self.tag.endswith(("0", "2", "4", "6", "8")) else keys), values


class GraphBreakCache(cache_utils.DynamicCache):
    """DynamicCache whose update breaks the graph (a planted ``torch._dynamo.graph_break()``)."""

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        import torch

        torch._dynamo.graph_break()
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def register() -> None:
    """Register the twins (again: idempotent)."""
    from kvcache.measuring.caches import _dynamic, register_cache

    def planted(req: Any) -> Any:
        from kvcache.measuring import compat

        return compat.new_cache(PlantedCopyCache, req.config)

    def planted_read(req: Any) -> Any:
        from kvcache.measuring import compat

        return compat.new_cache(PlantedReadCache, req.config)

    def extra_ops(req: Any) -> Any:
        from kvcache.measuring import compat

        return compat.new_cache(ExtraOpsCache, req.config)

    register_cache("twin-read", planted_read, in_all=False, replace=True,
                   description="test-only: DynamicCache plus one planted whole-cache read per step (+1 pass)")
    register_cache("twin-extra-ops", extra_ops, in_all=False, replace=True,
                   description="test-only: DynamicCache plus three tiny ops per layer per step (+3 ops/layer, "
                               "no cache traffic)")
    register_cache("twin-clean", _dynamic, in_all=False, replace=True,
                   description="test-only: DynamicCache, the clean twin of twin-planted")
    register_cache("twin-planted", planted, in_all=False, memory_factor=3.0, replace=True,
                   description="test-only: DynamicCache plus one planted full copy of K/V per step (+2 passes)")
    register_cache("twin-reorder", lambda req: _new(PlantedReorderCache, req), in_all=False, replace=True,
                   description="test-only: DynamicCache whose reorder_cache copies the cache twice (+2 passes under "
                               "beam search, none under greedy)")
    register_cache("planted-recompile", lambda req: _new(RecompilingCache, req), in_all=False, replace=True,
                   description="test-only: DynamicCache that makes a compiled step recompile at every step")
    register_cache("planted-graph-break", lambda req: _new(GraphBreakCache, req), in_all=False, replace=True,
                   description="test-only: DynamicCache whose update breaks the compiled graph")


def _new(cls: type, req: Any) -> Any:
    from kvcache.measuring import compat

    return compat.new_cache(cls, req.config)


def lively(model: Any, seed: int = 0) -> Any:
    """Re-initialise a built model so that greedy decoding depends on the context: unit-variance embeddings,
    1/sqrt(fan-in) projections, an untied head (the suite's random weights make every greedy token the same, so
    token equality would prove nothing). For tests that compare the tokens of two decode paths."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight), requires_grad=False)
        model.config.tie_word_embeddings = False
        for name, param in model.named_parameters():
            if param.dim() == 2:
                std = 1.0 if "embed" in name else 1 / math.sqrt(param.shape[1])
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return model
