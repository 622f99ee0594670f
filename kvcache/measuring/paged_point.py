"""The ``paged`` class: continuous batching's ``PagedAttentionCache``, stepped one decode token per live sequence.
:class:`PagedPoint` has :class:`~kvcache.measuring.decode.DecodePoint`'s interface over ``batch.size`` sequences
and drives the forward itself, in the calling thread (the counter must see every op), with what the installed
release's continuous batching uses (:mod:`kvcache.measuring.paged_api`). How it steps, seeds and what it skips:
docs/drivers.md; which release passes what: docs/releases.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kvcache.measuring import attention, compat
from kvcache.measuring.decode import FILL_CHUNK, DecodePoint
from kvcache.measuring.paged_api import (
    PagedAPI,
    allocate,
    build_inline_mask,
    cache_layer_types,
    check_geometry,
    installed_api,
    new_paged_cache,
    pool_slots,
    slot_lists,
    supports_logits_to_keep,
)

PAGED_SINCE = (4, 53)
REQUEST_ID = "kvcache-seq-{}"


def unsupported_reason(version: str | None = None) -> str | None:
    """Why ``paged`` cannot run on Transformers ``version`` (default: the installed one), in one line, or None."""
    text = version or compat.TRANSFORMERS
    if compat.InstalledVersion(text) < PAGED_SINCE:
        return (f"paged: transformers {text} has no PagedAttentionCache "
                f"(continuous batching arrived in {'.'.join(map(str, PAGED_SINCE))})")
    return None


def supported_api() -> PagedAPI:
    """The registry's ``prepare``: the installed release's :class:`PagedAPI`, or :class:`compat.Unsupported` (the
    class is skipped with the reason) where the release has no paged cache this class can drive."""
    reason = unsupported_reason()
    if reason:
        raise compat.Unsupported(reason)
    return installed_api()


# --- the point -------------------------------------------------------------------------------------------------

@dataclass
class PagedPoint(DecodePoint):
    """A PagedAttentionCache of the installed release holding ``batch.size`` sequences, stepped one token each.

    ``position`` is the longest sequence's tokens; ``lengths`` every sequence's (host integers, advanced by the
    point: each step adds one token to every sequence). ``next_ids`` and ``position_ids`` are [1, N] on the device.
    """

    lengths: list[int] = field(default_factory=list)
    api: PagedAPI | None = None  # what the installed release offers (kvcache.measuring.paged_api)
    slots: list[torch.Tensor] = field(default_factory=list)  # per layer group: [N, capacity] physical slots
    cu_q: torch.Tensor | None = None
    cu_k: torch.Tensor | None = None
    cu_k_step: torch.Tensor | None = None
    row_starts: torch.Tensor | None = None  # where each sequence's row starts in a flattened slot table
    logits_indices: torch.Tensor | None = None
    read_buffers: list[torch.Tensor] = field(default_factory=list)  # 4.53-4.55: the whole static read index
    mask_buffer: torch.Tensor | None = None  # 4.53-4.55: the whole static mask
    keeps_logits: bool = False  # the model takes logits_to_keep (5.13+ hand it logits_indices)

    def build(self) -> PagedPoint:
        """Make the release's paged cache with room for every sequence, fill each to its length (untimed), switch the
        model to the release's paged SDPA and pick the first input token of every sequence."""
        r = self.api = supported_api()  # Unsupported with the reason where this release has no paged cache to drive
        if getattr(self.model, "_supports_attention_backend", True) is False:
            raise compat.Unsupported(f"paged: {type(self.model).__name__} runs its own attention code, not a "
                                     "registered attention function, so it cannot read a paged cache")
        device, dtype = self.device.torch_device, next(self.model.parameters()).dtype
        n = self.batch.size
        self.lengths = self.batch.lengths(self.context)
        extra = self.max_tokens - self.context  # warm-up + steps + margin, for every sequence
        capacity = [length + extra for length in self.lengths]
        self.cache, block_size = new_paged_cache(r, self.model, device, dtype, capacity)
        check_geometry(self.cache, self.spec)
        tables = []
        for i, tokens in enumerate(capacity):
            allocate(self.cache, REQUEST_ID.format(i), tokens, block_size)
            tables.append(slot_lists(self.cache, REQUEST_ID.format(i), tokens))
        width = max(capacity)
        self.slots = [torch.tensor([table[g] + [0] * (width - len(table[g])) for table in tables],
                                   dtype=r.index_dtype).to(device) for g in range(len(tables[0]))]
        tokens = []
        with torch.inference_mode():
            for i in range(n):  # sequence i: its K/V, then its first token, from a generator seeded seed + i
                gen = torch.Generator(device="cpu").manual_seed(self.seed + i)
                if self.fill == "synthetic":
                    self._fill_synthetic(i, gen, dtype)
                else:
                    self._fill_prefill(i, gen)
                tokens.append(torch.randint(1, self.spec.vocab, (1, 1), generator=gen))
            self.next_ids = torch.cat(tokens, dim=1).to(device)
            self.position_ids = torch.tensor([self.lengths], device=device)
            self.cu_q = torch.arange(n + 1, dtype=torch.int32, device=device)
            self.cu_k = torch.tensor(_cumulative([length + 1 for length in self.lengths]), dtype=torch.int32,
                                     device=device)
            self.cu_k_step = torch.arange(n + 1, dtype=torch.int32, device=device)
            self.row_starts = torch.arange(n, device=device) * width
            self.logits_indices = torch.arange(n, dtype=r.index_dtype, device=device)
            if r.whole_static:
                pool = pool_slots(self.cache)
                self.read_buffers = [torch.empty(pool, dtype=r.index_dtype, device=device) for _ in self.slots]
                self.mask_buffer = torch.empty(1, 1, n, pool, dtype=dtype, device=device)
        # the release's paged SDPA, or the paged implementation this key names (``paged@paged|eager``: --kv-attn)
        chosen = self.cache_spec.attention
        named = attention.SEPARATOR in self.cache_spec.name and attention.paging(chosen)
        compat.set_attention(self.model, chosen if named else r.attention)
        self.keeps_logits = supports_logits_to_keep(self.model)
        self.position = max(self.lengths)
        self.device.sync()
        return self

    # --- filling ---
    def _write(self, layer: int, keys: torch.Tensor, values: torch.Tensor, writes: list[torch.Tensor]) -> None:
        """Write K/V ([1, heads, n, dim]) at the slots ``writes`` (one tensor per group) through the cache's own
        ``update``, reading nothing back (an empty read index)."""
        r = self.api
        reads = [w[:0] for w in writes]
        if r.update_takes_kwargs:
            n = keys.shape[-2]
            lengths = torch.tensor([0, n], dtype=torch.int32, device=keys.device)
            types = cache_layer_types(self.cache)
            kwargs = {r.seqlens_keys[1]: {t: lengths for t in types}, r.max_keys[1]: {t: n for t in types},
                      "read_index": reads, "write_index": writes}
            self.cache.update(keys, values, layer, kwargs)
        elif r.grouped_index:
            self.cache.update(keys, values, layer, read_index=reads, write_index=writes)
        else:
            self.cache.update(keys, values, layer, read_index=reads[0], write_index=writes[0])

    def _fill_synthetic(self, i: int, gen: torch.Generator, dtype: torch.dtype) -> None:
        """Random non-zero K/V for every token of sequence ``i``, every layer, in chunks (O(its length)), drawn as
        DecodePoint draws them, written through the cache's ``update``."""
        shapes = self.spec.cached_shapes()
        device = self.device.torch_device
        length = self.lengths[i]
        for start in range(0, length, FILL_CHUNK):
            n = min(FILL_CHUNK, length - start)
            writes = [slots[i, start:start + n] for slots in self.slots]
            for layer, shape in enumerate(shapes):
                if shape is None:
                    continue
                heads, key_dim, value_dim = shape
                k = torch.randn(1, heads, n, key_dim, generator=gen).to(device, dtype)
                v = torch.randn(1, heads, n, value_dim, generator=gen).to(device, dtype)
                self._write(layer, k, v, writes)

    def _fill_prefill(self, i: int, gen: torch.Generator) -> None:
        """A real forward over sequence ``i``'s random tokens (plain SDPA into a DynamicCache, as DecodePoint's
        prefill), its K/V then written into the paged cache through ``update``."""
        device = self.device.torch_device
        length = self.lengths[i]
        compat.set_attention(self.model, "sdpa")
        ids = torch.randint(1, self.spec.vocab, (1, length), generator=gen).to(device)
        dynamic = compat.new_dynamic_cache(self.model.config)
        kwargs = compat.decode_kwargs(self.model, dynamic, 0, device)
        kwargs["position_ids"] = torch.arange(length, device=device)[None]
        if "cache_position" in kwargs:
            kwargs["cache_position"] = torch.arange(length, device=device)
        out = self.model(input_ids=ids, **kwargs)
        dynamic = compat.cache_from_output(out) or dynamic
        for layer, shape in enumerate(self.spec.cached_shapes()):
            if shape is not None:
                keys, values = compat.layer_kv(dynamic, layer)
                self._write(layer, keys, values, [slots[i, :length] for slots in self.slots])

    # --- stepping ---
    def forward_kwargs(self) -> dict[str, Any]:
        """The keywords the release's batch preparation hands the model for this decode step (see the module
        docstring): built from the host lengths and device tensors, nothing copied from the host."""
        r = self.api
        n = self.batch.size
        seqlens_k = [length + 1 for length in self.lengths]
        cu_q, cu_k = list(range(n + 1)), _cumulative(seqlens_k)
        total_k = cu_k[-1]
        # This step's slot of every sequence: the slot table's entry at its position (a lookup of N entries)
        entries = self.position_ids.view(n) + self.row_starts
        writes = [slots.view(-1).index_select(0, entries) for slots in self.slots]
        if n == 1:
            reads = [slots[0, :seqlens_k[0]] for slots in self.slots]
        else:
            reads = [torch.cat([slots[i, :k] for i, k in enumerate(seqlens_k)]) for slots in self.slots]
        dtype = next(self.model.parameters()).dtype
        if r.whole_static:  # reset_static_tensors + _build_tensors: the whole buffers, every step
            for buffer, read in zip(self.read_buffers, reads):
                buffer.fill_(-1)
                buffer[:total_k] = read
            reads = self.read_buffers
            mask = self.mask_buffer
            mask.fill_(torch.finfo(dtype).min)
        else:
            mask = torch.full((1, 1, n, total_k), torch.finfo(dtype).min, dtype=dtype, device=self.device.torch_device)
        if r.mask_builder is not None:
            r.mask_builder(attention_mask=mask, cumulative_seqlens_q=cu_q, cumulative_seqlens_k=cu_k, sliding_window=1)
        else:
            build_inline_mask(mask, cu_q, cu_k)
        types = cache_layer_types(self.cache)
        kwargs: dict[str, Any] = {
            "input_ids": self.next_ids, "position_ids": self.position_ids, "attention_mask": mask,
            r.seqlens_keys[0]: self.cu_q,
            r.seqlens_keys[1]: {t: self.cu_k for t in types} if r.k_by_type else self.cu_k,
            r.max_keys[0]: 1,
            r.max_keys[1]: {t: max(seqlens_k) for t in types} if r.k_by_type else max(seqlens_k),
            "read_index": reads if r.grouped_index else reads[0],
            "write_index": writes if r.grouped_index else writes[0],
            "logits_indices": self.logits_indices, "cache": self.cache, "use_cache": False,
        }
        if r.block_tables:
            kwargs["block_tables"] = self.cache._block_tables
        if r.block_table_key:
            kwargs["block_table"] = None
        if r.is_causal:
            kwargs["is_causal"] = False
        if r.logits_to_keep and self.keeps_logits:
            kwargs["logits_to_keep"] = self.logits_indices
        return kwargs

    def step(self) -> torch.Tensor:
        """One decode step: one new token for every sequence, the greedy argmax of the last step's logits. Nothing in
        it waits for the device."""
        with torch.inference_mode():
            kwargs = self.forward_kwargs()
            logits = self.model(**kwargs).logits
            if "logits_to_keep" not in kwargs:
                logits = logits[:, self.logits_indices]
            self.next_ids = logits.argmax(-1)
            self.position_ids.add_(1)
            self.cu_k.add_(self.cu_k_step)
        self.lengths = [length + 1 for length in self.lengths]
        self.position = max(self.lengths)
        return logits

    def release(self) -> None:
        super().release()
        self.slots, self.read_buffers = [], []
        self.cu_q = self.cu_k = self.cu_k_step = self.row_starts = self.logits_indices = self.mask_buffer = None


def _cumulative(values: list[int]) -> list[int]:
    out = [0]
    for value in values:
        out.append(out[-1] + value)
    return out
