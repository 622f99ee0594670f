"""The attention probe: one decode step observed at ``torch.nn.functional.scaled_dot_product_attention``.

Transformers looks that function up at call time in every release, so wrapping it for one step shows
what attention received: query/key/value/mask shapes, whether grouped-query attention ran natively
(``enable_gqa`` or the query heads packed onto the KV heads) or K/V were expanded to all query heads,
and how many K/V expansions that took (K and V of every layer: 2 per expanded call).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


def _shape(t: Any) -> list[int] | None:
    return list(t.shape) if isinstance(t, torch.Tensor) else None


@dataclass
class AttentionProbe:
    """What one step's attention calls looked like (the first call's shapes; counts over all calls)."""

    heads: int
    kv_heads: int
    calls: int = 0
    expanded_calls: int = 0
    first: dict[str, Any] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)

    def classify(self, query: torch.Tensor, key: torch.Tensor, enable_gqa: bool) -> str:
        q_heads, k_heads = query.shape[1], key.shape[1]
        if self.heads == self.kv_heads:
            return "mha (nothing to expand)"
        if enable_gqa and q_heads > k_heads:
            return "native gqa (enable_gqa)"
        if k_heads == q_heads and k_heads == self.heads:
            return "expanded (K/V repeated to all query heads)"
        if k_heads == q_heads and k_heads == self.kv_heads:
            return "native gqa (query heads packed onto KV heads)"
        return f"other (query heads {q_heads}, key heads {k_heads})"

    def observe(self, query: Any, key: Any, value: Any, attn_mask: Any, enable_gqa: bool) -> None:
        mode = self.classify(query, key, enable_gqa)
        self.calls += 1
        self.modes[mode] = self.modes.get(mode, 0) + 1
        if mode.startswith("expanded"):
            self.expanded_calls += 1
        if not self.first:
            self.first = {"query": _shape(query), "key": _shape(key), "value": _shape(value),
                          "mask": _shape(attn_mask), "enable_gqa": bool(enable_gqa)}

    def to_dict(self) -> dict[str, Any]:
        attention = max(self.modes, key=self.modes.get) if self.modes else "no scaled_dot_product_attention call"
        return {**{"query": None, "key": None, "value": None, "mask": None, "enable_gqa": False}, **self.first,
                "attention": attention, "expansions": 2 * self.expanded_calls, "calls": self.calls,
                "modes": dict(self.modes)}


def probe(step: Callable[[], Any], heads: int, kv_heads: int) -> AttentionProbe:
    """Run ``step()`` once with SDPA wrapped; return what attention received."""
    result = AttentionProbe(heads=heads, kv_heads=kv_heads)
    original = torch.nn.functional.scaled_dot_product_attention

    def wrapped(query: Any, key: Any, value: Any, attn_mask: Any = None, *args: Any, **kwargs: Any) -> Any:
        result.observe(query, key, value, attn_mask, bool(kwargs.get("enable_gqa", False)))
        return original(query, key, value, attn_mask, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = wrapped
    try:
        step()
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    return result
