"""Counted traffic of a decode step under each SDPA backend a CUDA GPU can run, and under the backend each GPU class
would select (``kv.traffic.<cache>.backends`` and ``.gpus``), counted on any device: while a step is counted,
``scaled_dot_product_attention`` is replaced by :class:`Emulation`, which records each call
(:class:`sdpa_rules.SdpaCall`) and runs what torch does on CUDA for the chosen backend with real ATen ops, so the
counter charges them by its usual rules. What each backend runs, and how a fused kernel is charged:
docs/gpu-backends.md."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kvcache.analysing.sdpa import selection as sdpa_rules

DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
               torch.float64: "float64", torch.bool: "bool"}


def facts(t: torch.Tensor) -> sdpa_rules.TensorFacts:
    """The plain facts torch's rules read of one tensor."""
    return sdpa_rules.TensorFacts(tuple(t.shape), tuple(t.stride()), int(t.storage_offset()),
                                  DTYPE_NAMES.get(t.dtype, str(t.dtype).removeprefix("torch.")), t.element_size())


def call_facts(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any, dropout_p: float,
               is_causal: bool, enable_gqa: bool) -> sdpa_rules.SdpaCall:
    """One SDPA call as :class:`sdpa_rules.SdpaCall` (``requires_grad``: inputs needing grad with grad mode on)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    mask = facts(attn_mask) if isinstance(attn_mask, torch.Tensor) else None
    return sdpa_rules.SdpaCall(facts(query), facts(key), facts(value), mask, float(dropout_p), bool(is_causal),
                               bool(enable_gqa), grad)


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``convert_boolean_attn_mask`` (attention.cpp): a boolean mask as 0 / -inf of the query's dtype."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask.logical_not(), torch.tensor(float("-inf"), dtype=dtype), torch.tensor(0.0, dtype=dtype))


def _math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, dropout_p: float, is_causal: bool,
          scale: Any, enable_gqa: bool) -> torch.Tensor:
    mask = _additive(mask, query.dtype)
    math = torch.ops.aten._scaled_dot_product_attention_math.default
    with torch.inference_mode(False), torch.no_grad():
        return math.decompose(query, key, value, mask, dropout_p, is_causal, None, scale=scale,
                              enable_gqa=enable_gqa)[0]


def _pad_last_dim_8(t: torch.Tensor) -> torch.Tensor:
    """``pad_last_dim<8, false>`` (attention.cpp): pad the head dim to a multiple of 8 (a copy) when it is not one."""
    rest = t.shape[-1] % 8
    return t if rest == 0 else torch.nn.functional.pad(t, (0, 8 - rest))


def _flash(original: Callable, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any,
           dropout_p: float, is_causal: bool, scale: Any, enable_gqa: bool) -> torch.Tensor:
    size = query.shape[-1]
    scale = scale if scale is not None else size ** -0.5  # the scale of the unpadded head dim, as torch computes it
    out = original(_pad_last_dim_8(query), _pad_last_dim_8(key), _pad_last_dim_8(value), None, dropout_p, is_causal,
                   scale=scale, enable_gqa=enable_gqa)
    return out[..., :size] if out.shape[-1] != size else out


def _preprocess_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``preprocess_mask`` (attention.cpp): the mask expanded to (B, H, L, S); ``pad_bias<16>`` when S is not a
    multiple of 16 (padded: a copy, sliced back); made contiguous when its strides are not multiples of 16."""
    mask = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    size = mask.shape[-1]
    if size % 16:
        return torch.nn.functional.pad(mask, (0, 16 - size % 16))[..., :size]
    if any(s % 16 for s in mask.stride()[:3]):
        return mask.contiguous()
    return mask


def _efficient(original: Callable, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any,
               dropout_p: float, is_causal: bool, scale: Any, enable_gqa: bool) -> torch.Tensor:
    mask = _additive(mask, query.dtype)
    if mask is not None:
        mask = _preprocess_mask(mask, query, key)
    return original(query, key, value, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _cudnn(original: Callable, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any,
           dropout_p: float, is_causal: bool, scale: Any, enable_gqa: bool) -> torch.Tensor:
    return original(query, key, value, _additive(mask, query.dtype), dropout_p, is_causal, scale=scale,
                    enable_gqa=enable_gqa)


FUSED = {"flash": _flash, "efficient": _efficient, "cudnn": _cudnn}

#: chooses the backend of call number ``index`` (in the step) from its facts
Chooser = Callable[[int, sdpa_rules.SdpaCall], str]


@dataclass
class Emulation:
    """Replaces ``torch.nn.functional.scaled_dot_product_attention`` while active (:meth:`active`): each call's facts
    are kept in ``calls`` and the call runs as ``chooser`` says (:data:`sdpa_rules.BACKENDS`)."""

    chooser: Chooser
    calls: list[sdpa_rules.SdpaCall] = field(default_factory=list)
    chosen: list[str] = field(default_factory=list)

    def __call__(self, original: Callable, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None,
                 enable_gqa: bool = False) -> torch.Tensor:
        call = call_facts(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        backend = self.chooser(len(self.calls), call)
        self.calls.append(call)
        self.chosen.append(backend)
        if backend == "math":
            return _math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        return FUSED[backend](original, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def active(self) -> Any:
        """A context in which every SDPA call goes through this emulation (:func:`replacing_sdpa`)."""
        return replacing_sdpa(self)


@contextlib.contextmanager
def replacing_sdpa(run: Callable[..., torch.Tensor]) -> Iterator[None]:
    """A context in which ``torch.nn.functional.scaled_dot_product_attention(...)`` is ``run(original, query, key,
    value, attn_mask, dropout_p, is_causal, scale, enable_gqa)``; the original is restored on leaving."""
    original = torch.nn.functional.scaled_dot_product_attention

    def replaced(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                 is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
        return run(original, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    torch.nn.functional.scaled_dot_product_attention = replaced
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def always(backend: str) -> Chooser:
    """A chooser that runs every call under ``backend``."""
    return lambda index, call: backend


def by_rules(gpu: str) -> Chooser:
    """A chooser that runs every call under the backend :func:`sdpa_rules.select` picks on GPU class ``gpu``."""
    return lambda index, call: sdpa_rules.select(call, gpu).backend
