"""Test-only cache classes and hooks for checking the gates: a clean dynamic cache and its twins, one with a
planted extra full copy of K and V per step (+2 passes: the copy reads the cache and writes it again), one with
a planted whole-cache read (a reduction over K and V: +1 pass), one with three tiny extra ops per layer and no
cache traffic (+3 ops per layer per step, passes unchanged); and a model hook that reads the embedding matrix
once more per step (+its share of the weight bytes in weight passes); one whose beam-search reorder copies the cache
twice (``twin-reorder``: +2 passes under ``--kv-decoding beam:N``, none greedy). Registered as ``twin-clean``,
``twin-planted``, ``twin-read``, ``twin-extra-ops`` and ``twin-reorder`` by the suite's ``benchmarks/conftest.py``
(never by the production registry), with ``fake-press`` (:mod:`kvcache.testing.press`: a class that hooks the model);
not part of ``--kv-caches all``."""

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
#: {id of a model's config: the cache of that model's newest point}: the per-model state of :class:`ModelStateCache`
MODEL_STATE: dict[int, Any] = {}


class ModelStateCache(cache_utils.DynamicCache):
    """DynamicCache whose per-step work lives on the model, as a KV-compression press's does (state set when a
    cache is made for the model, read at every step): each update reads the whole of K and V of the model's
    *current* cache, the newest one made for it (+1 pass while one point is open at a time). With two points open on
    one model at once, the older one's steps read the newer one's cache: a count that depends on another point."""

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        from kvcache.measuring import compat

        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        current = MODEL_STATE.get(self._model_key, self)
        try:
            held = compat.layer_kv(current, layer_idx)  # every release's storage (layers, or key/value lists)
        except (IndexError, AttributeError):
            held = None  # the current cache has not reached this layer yet
        if held is not None and held[0] is not None and held[0].numel():
            held[0].sum()
            held[1].sum()
        return keys, values


class PeriodicCopyCache(cache_utils.DynamicCache):
    """DynamicCache that copies the whole of K and V (a clone of each) at every ``PERIOD``-th update of a layer, as a
    cache that flushes or compresses every N steps: +2 passes on that step, +2/N amortised over N steps."""

    PERIOD = 4

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        updates = self.__dict__.setdefault("_updates", {})
        updates[layer_idx] = updates.get(layer_idx, 0) + 1
        if updates[layer_idx] % self.PERIOD == 0:
            return keys.clone(), values.clone()
        return keys, values


class DoubleGatherCache(cache_utils.DynamicCache):
    """DynamicCache whose update gathers every row of K and V by index twice (``torch.gather`` over the sequence, as
    a compression that keeps all of its tokens and then reorders them again): each gather reads the rows it selects
    and writes them, +2 passes per gather, +4 in all."""

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        import torch

        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        rows = torch.arange(keys.shape[-2], device=keys.device)
        for _ in range(2):
            index = rows[None, None, :, None].expand(*keys.shape[:-1], keys.shape[-1])
            keys = torch.gather(keys, 2, index)
            index = rows[None, None, :, None].expand(*values.shape[:-1], values.shape[-1])
            values = torch.gather(values, 2, index)
        return keys, values


class SyncingCache(cache_utils.DynamicCache):
    """DynamicCache whose update reads one number of the new keys back to the host (``.item()``) in every layer: one
    host sync per layer per step (a GPU's host waits there), a few bytes, no cache traffic."""

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        if key_states[..., :1].sum().item() != key_states[..., :1].sum().item():  # NaN only: never taken
            raise ValueError("NaN keys")
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class FixedWindowCache(cache_utils.DynamicCache):
    """DynamicCache that keeps only the last ``WINDOW`` tokens of each layer (dropping the rest after each append):
    a step whose bytes do not grow with context, so it has no counted passes."""

    WINDOW = 64

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        from kvcache.measuring import compat

        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        kept = keys[..., -self.WINDOW:, :].clone(), values[..., -self.WINDOW:, :].clone()
        compat.store_layer_kv(self, layer_idx, *kept)  # every release's storage (layers, or key/value lists)
        return kept


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
    def model_state(req: Any) -> Any:
        from kvcache.measuring import compat

        cache = compat.new_cache(ModelStateCache, req.config)
        cache._model_key = id(req.config)
        MODEL_STATE[cache._model_key] = cache  # the model's current cache is now this one
        return cache

    register_cache("planted-model-state", model_state, in_all=False, replace=True,
                   description="test-only: DynamicCache plus a per-step read of the model's current cache, per-model "
                               "state as a press keeps (+1 pass when no other point is open)")
    register_cache("planted-periodic", lambda req: _new(PeriodicCopyCache, req), in_all=False, replace=True,
                   period=PeriodicCopyCache.PERIOD,
                   description=f"test-only: DynamicCache plus a whole copy of K/V every {PeriodicCopyCache.PERIOD} "
                               "steps (declared period=4: +0.5 passes amortised)")
    register_cache("planted-double-gather", lambda req: _new(DoubleGatherCache, req), in_all=False, replace=True,
                   description="test-only: DynamicCache plus two gathers of every K/V row per step (+4 passes)")
    register_cache("planted-syncs", lambda req: _new(SyncingCache, req), in_all=False, replace=True,
                   description="test-only: DynamicCache plus two host syncs (.item()) per layer per step")
    register_cache("planted-fixed-window", lambda req: _new(FixedWindowCache, req), in_all=False, replace=True,
                   description=f"test-only: DynamicCache keeping its last {FixedWindowCache.WINDOW} tokens: a step "
                               "that does not grow with context")
    register_cache("planted-recompile", lambda req: _new(RecompilingCache, req), in_all=False, replace=True,
                   description="test-only: DynamicCache that makes a compiled step recompile at every step")
    register_cache("planted-graph-break", lambda req: _new(GraphBreakCache, req), in_all=False, replace=True,
                   description="test-only: DynamicCache whose update breaks the compiled graph")
    from kvcache.testing import press

    press.register()


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
