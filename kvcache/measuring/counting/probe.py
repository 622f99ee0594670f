"""The attention probe: one decode step observed at ``torch.nn.functional.scaled_dot_product_attention``.

Transformers looks that function up at call time in every release, so wrapping it for one step shows
what attention received: query/key/value/mask shapes, whether grouped-query attention ran natively
(``enable_gqa`` or the query heads packed onto the KV heads) or K/V were expanded to all query heads,
and how many K/V expansions that took (K and V of every layer: 2 per expanded call).

Which forwards: every attention call of one step (:func:`probe`: greedy, beam search and chunked prefill, whose step
is one forward), or, for a strategy that says so (``DecodingStrategy.probe_last_forward``: speculative decoding), only
the model's last forward of the counted step (:func:`probe_last_forward`: an assisted or prompt-lookup iteration's
verifying forward, 1 + K query tokens, not generate's prefill of the prompt nor a self-draft's own forwards).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kvcache.analysing.records.counted import Probe
from kvcache.measuring.generate import leading_steps


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
    recording: bool = True  # False: calls pass unobserved (outside the probed forward)

    def clear(self) -> None:
        """Forget the calls observed so far (a later forward replaces an earlier one)."""
        self.calls = self.expanded_calls = 0
        self.first, self.modes = {}, {}

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
    result, functions = AttentionProbe(heads=heads, kv_heads=kv_heads), FunctionProbe()
    with _observing(result, functions):
        step()
    return _described(result, functions)


def probe_point(point: Any, warmup: int, heads: int, kv_heads: int) -> AttentionProbe:
    """The probe of a counted point: :func:`probe_last_forward` where its strategy says so
    (``probe_last_forward``), else :func:`probe` of one more :meth:`step` (as every key was probed before)."""
    strategy = getattr(point, "strategy", None)
    if getattr(strategy, "probe_last_forward", False) and hasattr(point, "generate"):
        return probe_last_forward(point, warmup, heads, kv_heads)
    return probe(point.step, heads, kv_heads)


def probe_last_forward(point: Any, warmup: int, heads: int, kv_heads: int) -> AttentionProbe:
    """What attention received in the model's last forward of the counted step: one generate call of
    :func:`leading_steps` ``(warmup) + 1`` steps, as :meth:`GeneratePoint.count_step` runs it, observed only inside
    the model's forwards (forward pre-hook to forward hook) after the leading steps' last mark, each forward replacing
    the one before. For an assisted or prompt-lookup iteration that is the verifying forward (the last token and the
    K candidates), which comes after the draft's forwards (a self-draft's run through the same model)."""
    lead = leading_steps(warmup)
    result, functions = AttentionProbe(heads=heads, kv_heads=kv_heads, recording=False), FunctionProbe(recording=False)
    counted = [False]  # between the marks of the counted step

    def on_mark(index: int) -> None:
        counted[0] = index == lead

    def before(*_: Any) -> None:
        if counted[0]:
            result.clear()
            functions.clear()
            result.recording = functions.recording = True

    def after(*_: Any) -> None:
        result.recording = functions.recording = False

    hooks = [point.model.register_forward_pre_hook(before), point.model.register_forward_hook(after)]
    try:
        with _observing(result, functions):
            point.generate(lead + 1, on_mark=on_mark)
    finally:
        for hook in hooks:
            hook.remove()
    return _described(result, functions)


@contextmanager
def _observing(result: AttentionProbe, functions: FunctionProbe) -> Iterator[None]:
    """SDPA wrapped (its calls observed in ``result`` while it is recording) and the attention functions watched by
    ``functions``, for the duration."""
    original = torch.nn.functional.scaled_dot_product_attention

    def wrapped(query: Any, key: Any, value: Any, attn_mask: Any = None, *args: Any, **kwargs: Any) -> Any:
        if result.recording:
            result.observe(query, key, value, attn_mask, bool(kwargs.get("enable_gqa", False)))
        return original(query, key, value, attn_mask, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = wrapped
    try:
        with functions.watching():
            yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def _described(result: AttentionProbe, functions: FunctionProbe) -> AttentionProbe:
    """``result``, or, where SDPA was not called, ``result`` filled from the attention functions that were."""
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
    recording: bool = True  # False: calls pass uncounted (outside the probed forward)

    def clear(self) -> None:
        """Forget the calls counted so far."""
        self.calls = self.expansions = 0
        self.first, self.names = {}, {}

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
                    if probe_.recording:
                        probe_.calls += 1
                        probe_.names[name] = probe_.names.get(name, 0) + 1
                    if probe_.recording and not probe_.first:
                        probe_.first = {"query": _shape(query), "key": _shape(key), "value": _shape(value),
                                        "mask": _shape(attention_mask)}
                    return fn(module, query, key, value, attention_mask, *args, **kwargs)
                return wrapped

            def repeat_fn(fn: Callable) -> Callable:
                def wrapped(hidden_states: Any, n_rep: int, *args: Any, **kwargs: Any) -> Any:
                    if n_rep != 1 and probe_.recording:
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
