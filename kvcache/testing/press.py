"""A fake press, for testing the way in for classes that hook the model without kvpress: like kvpress's
``KnormPress``, a forward hook on every attention module that, after a prefill (more than one query token), keeps
the ``keep`` share of each layer's cached tokens with the largest key norms (in order) and drops the rest, so the
cache stores ``keep`` of the context's K/V and a decode step reads only it. Entered as kvpress's are:
``with FakePress(0.5)(model):`` around the prefill. Registered as ``fake-press`` by :func:`register` (not part of
``--kv-caches all``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from kvcache.measuring import compat


def attention_modules(model: Any) -> list[Any]:
    """Every decoder layer's attention module (``self_attn``), as kvpress finds them."""
    inner = model.model.language_model if hasattr(model.model, "language_model") else model.model
    return [layer.self_attn for layer in inner.layers]


class FakePress:
    """Keeps the ``keep`` share of each layer's prefilled tokens (largest key norm first, kept in order)."""

    def __init__(self, keep: float = 0.5) -> None:
        self.keep = keep

    def forward_hook(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        # the keyword was past_key_value up to 4.5x, past_key_values later, cache from 5.2x
        cache = next((kwargs[k] for k in ("past_key_values", "past_key_value", "cache") if kwargs.get(k) is not None),
                     None)
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if cache is None or hidden is None or hidden.shape[1] <= 1:  # a decode step: nothing to do
            return output
        keys, values = compat.layer_kv(cache, module.layer_idx)
        kept = max(1, int(keys.shape[-2] * self.keep))
        order = keys.float().norm(dim=-1).topk(kept, dim=-1).indices.sort(dim=-1).values
        index = order[..., None].expand(-1, -1, -1, keys.shape[-1])
        compat.store_layer_kv(cache, module.layer_idx, keys.gather(2, index).contiguous(),
                              values.gather(2, index[..., :values.shape[-1]]).contiguous())
        return output

    @contextlib.contextmanager
    def __call__(self, model: Any) -> Iterator[None]:
        handles = [m.register_forward_hook(self.forward_hook, with_kwargs=True) for m in attention_modules(model)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


@contextlib.contextmanager
def changes_weights(model: Any) -> Iterator[None]:
    """A bad hook: writes into a weight (in place, by nothing: the values stay, the version counter moves)."""
    with torch.no_grad():
        next(model.parameters()).add_(0)
    yield


def register() -> None:
    """``fake-press``: a DynamicCache that :class:`FakePress` (keep half) compresses after the prefill."""
    from kvcache.measuring.caches import register_cache

    register_cache("fake-press", lambda request: compat.new_dynamic_cache(request.config),
                   description="test-only: a DynamicCache a fake press halves after the prefill (kvpress-like)",
                   fill_context=lambda model: FakePress(0.5)(model), in_all=False, replace=True)
