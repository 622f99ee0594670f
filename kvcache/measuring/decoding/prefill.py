"""The prefill measure of ``chunked-prefill:C``: the prefill of ``model.generate(max_new_tokens=1)`` on an empty
cache of the class, counted with ``prefill_chunk_size=C`` and without (one forward), at the largest counted context.
Figures per logical KV byte the prefill leaves in the cache (the batch's ``context`` tokens): ``passes`` (chunked),
``unchunked_passes`` and ``extra_passes`` (what chunking adds, by op: a ``cat`` that copies the cache so far on every
chunk shows as cache sizes of ``cat``; weights read once per chunk as the matmuls')."""

from __future__ import annotations

from typing import Any

import torch

from kvcache.analysing.records.counted import PrefillTraffic
from kvcache.measuring import attention, caches, compat
from kvcache.measuring.cachespec import CacheRequest
from kvcache.measuring.counting.traffic import TrafficCount, TrafficCounter, op_passes
from kvcache.measuring.decode import MARGIN_TOKENS
from kvcache.measuring.generate import PAD_TOKEN, _criteria, _without_eos, generation_config


def release_reason() -> str | None:
    """Why the installed release cannot chunk a prefill (its GenerationConfig has no ``prefill_chunk_size``)."""
    from transformers import GenerationConfig

    if not hasattr(GenerationConfig(), "prefill_chunk_size"):
        return (f"chunked prefill: transformers {compat.TRANSFORMERS} has no GenerationConfig.prefill_chunk_size "
                "(added in 4.55)")
    return None


def _never_stop(input_ids: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
    return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def count_prefill(session: Any, key: str, context: int, chunk: int | None) -> TrafficCount:
    """The counted ops of one ``generate(max_new_tokens=1)`` call (its prefill and the first token's pick) over
    ``context`` random tokens per sequence, on a fresh empty cache of ``key``'s class; ``chunk``: the
    ``prefill_chunk_size`` (None: one forward)."""
    model, spec = session.model()
    cache_spec = caches.get(key)
    if cache_spec.prepare is not None:
        cache_spec.prepare()
    attention.switch(model, cache_spec.attention)
    rows = session.batch.size
    dtype = next(model.parameters()).dtype
    where = session.device.torch_device
    cache = cache_spec.build(CacheRequest(model.config, context + MARGIN_TOKENS, where, dtype, rows))
    gen = torch.Generator(device="cpu").manual_seed(session.settings.seed)
    ids = torch.randint(PAD_TOKEN + 1, spec.vocab, (rows, context), generator=gen).to(where)
    options = {"prefill_chunk_size": chunk} if chunk else {}
    counter = TrafficCounter()
    with torch.inference_mode(), _without_eos(model), attention.uncompiled(cache_spec.attention), counter:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                       generation_config=generation_config(model, 1, options), stopping_criteria=_criteria([]),
                       **{compat.cache_keyword(model): cache})
    del cache
    return counter.count


def prefill_record(session: Any, key: str, chunk: int) -> PrefillTraffic:
    """``kv.traffic.<key>.prefill``: the prefill at the largest counted context, chunked and unchunked."""
    reason = release_reason()
    context = max(session.settings.counted_contexts)
    if reason:
        return PrefillTraffic.of(context=context, chunk=chunk, passes=None, by_op={}, error=reason)
    kv = session.held(context, context)
    chunked = count_prefill(session, key, context, chunk)
    whole = count_prefill(session, key, context, None)
    empty = TrafficCount()
    return PrefillTraffic.of(
        context=context, chunk=chunk, chunks=-(-context // chunk), kv_bytes=kv,
        passes=chunked.total / kv, by_op=op_passes(empty, chunked, kv),
        unchunked_passes=whole.total / kv, unchunked_by_op=op_passes(empty, whole, kv),
        extra_passes=(chunked.total - whole.total) / kv, extra_by_op=op_passes(whole, chunked, kv),
        step_bytes={"chunked": chunked.total, "unchunked": whole.total})
