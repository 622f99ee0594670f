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

from kvcache.analysing.records.counted import Probe


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

    def record(self) -> Probe:
        """``kv.probe.<cache>``: the mode most calls ran in (``attention``), the first call's shapes, K/V expansions
        (K and V of each expanded call), calls, calls per mode."""
        attention = max(self.modes, key=self.modes.get) if self.modes else "no scaled_dot_product_attention call"
        first = {"query": None, "key": None, "value": None, "mask": None, "enable_gqa": False, **self.first}
        return Probe.of(attention=attention, **first, expansions=2 * self.expanded_calls, calls=self.calls,
                        modes=dict(self.modes))


def probe(step: Callable[[], Any], heads: int, kv_heads: int) -> AttentionProbe:
    """Run ``step()`` once with SDPA wrapped; return what attention received. A step that calls no SDPA (``eager``,
    ``flex_attention``, an attention function of your own: ``--kv-attn``) is described by the attention functions it
    called instead (:class:`FunctionProbe`): the first call's query/key/value/mask, and K/V expanded to the query
    heads by the release's ``repeat_kv`` (``expansions``: its calls, K and V of each layer)."""
    result = AttentionProbe(heads=heads, kv_heads=kv_heads)
    functions = FunctionProbe()
    original = torch.nn.functional.scaled_dot_product_attention

    def wrapped(query: Any, key: Any, value: Any, attn_mask: Any = None, *args: Any, **kwargs: Any) -> Any:
        result.observe(query, key, value, attn_mask, bool(kwargs.get("enable_gqa", False)))
        return original(query, key, value, attn_mask, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = wrapped
    try:
        with functions.watching():
            step()
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    if result.calls == 0 and (functions.calls or functions.expansions):
        functions.fill(result)
    return result


@dataclass
class FunctionProbe:
    """The attention functions one step called (the release's registry entries, each modeling module's
    ``eager_attention_forward``) and its ``repeat_kv`` calls, found in the loaded Transformers modules and wrapped for
    the step only."""

    calls: int = 0
    expansions: int = 0
    first: dict[str, Any] = field(default_factory=dict)
    names: dict[str, int] = field(default_factory=dict)

    def watching(self) -> Any:
        import contextlib
        import sys

        probe_ = self

        @contextlib.contextmanager
        def patched() -> Any:
            undo: list[Callable[[], None]] = []

            def attention_fn(name: str, fn: Callable) -> Callable:
                def wrapped(module: Any, query: Any, key: Any, value: Any, attention_mask: Any = None, *args: Any,
                            **kwargs: Any) -> Any:
                    probe_.calls += 1
                    probe_.names[name] = probe_.names.get(name, 0) + 1
                    if not probe_.first:
                        probe_.first = {"query": _shape(query), "key": _shape(key), "value": _shape(value),
                                        "mask": _shape(attention_mask)}
                    return fn(module, query, key, value, attention_mask, *args, **kwargs)
                return wrapped

            def repeat_fn(fn: Callable) -> Callable:
                def wrapped(hidden_states: Any, n_rep: int, *args: Any, **kwargs: Any) -> Any:
                    if n_rep != 1:
                        probe_.expansions += 1
                    return fn(hidden_states, n_rep, *args, **kwargs)
                return wrapped

            try:
                for module in [m for n, m in list(sys.modules.items()) if n.startswith("transformers.") and m]:
                    for attr, make in (("eager_attention_forward", lambda f: attention_fn("eager", f)),
                                       ("repeat_kv", repeat_fn)):
                        fn = vars(module).get(attr)
                        if callable(fn):
                            setattr(module, attr, make(fn))
                            undo.append(lambda m=module, a=attr, f=fn: setattr(m, a, f))
                mapping = _attention_mapping()
                for name, fn in list(mapping.items()):
                    if callable(fn):
                        mapping[name] = attention_fn(name, fn)
                        undo.append(lambda n=name, f=fn: mapping.__setitem__(n, f))
                yield probe_
            finally:
                for restore in reversed(undo):
                    restore()
        return patched()

    def fill(self, result: AttentionProbe) -> None:
        """Describe a step without SDPA calls in ``result``'s terms (its keys unchanged)."""
        named = ", ".join(self.names) or "the attention modules' own forward"  # up to 4.47: no attention function
        if self.expansions:
            mode = (f"expanded (K/V repeated to all query heads by repeat_kv; {named}): the copy writes "
                    f"{result.heads // max(result.kv_heads, 1)} copies of K/V, attention reads the copies")
        elif result.heads == result.kv_heads:
            mode = f"mha (nothing to expand; {named})"
        else:
            mode = f"not expanded by repeat_kv ({named})"
        result.first = {**self.first, "enable_gqa": False}
        result.calls = self.calls or self.expansions // 2
        result.modes = {mode: self.calls}
        result.expanded_calls = self.expansions // 2


def _attention_mapping() -> dict[str, Any]:
    """The release's attention registry as a mutable mapping (``AttentionInterface._global_mapping`` 4.51+, the
    ``ALL_ATTENTION_FUNCTIONS`` dict 4.48-4.50), or an empty dict."""
    from transformers import modeling_utils

    interface = getattr(modeling_utils, "AttentionInterface", None)
    mapping = getattr(interface, "_global_mapping", None)
    if isinstance(mapping, dict):
        return mapping
    functions = getattr(modeling_utils, "ALL_ATTENTION_FUNCTIONS", None)
    return functions if isinstance(functions, dict) else {}
