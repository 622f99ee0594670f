"""Models in any release: building one from a config, the dtype keyword of ``from_pretrained``, the keywords of a
single-token forward and the cache it returns, registering and switching attention functions, and what each
decoder layer caches (its layer type; DeepSeek's latent)."""

from __future__ import annotations

import inspect
import re
from functools import cache
from typing import Any, Callable

import torch
from transformers import cache_utils

from kvcache.measuring.compat.version import TRANSFORMERS, VERSION, Unsupported, release_lacks

# --- driving a decode step ------------------------------------------------------------------------

@cache
def _forward_params(forward: Callable) -> frozenset:
    return frozenset(inspect.signature(forward).parameters)


def _base_params(model: Any) -> frozenset:
    """The parameters of the base model's forward (``model.model``; Falcon: ``.transformer``)."""
    base = getattr(model, "model", None) or getattr(model, "transformer", None) or model
    return _forward_params(type(base).forward)


def cache_keyword(model: Any, params: frozenset | None = None) -> str:
    """The forward's (and generate's) cache keyword: ``past_key_values`` up to 5.23, ``cache`` from 5.24."""
    return "cache" if "cache" in (params if params is not None else _base_params(model)) else "past_key_values"


def decode_kwargs(model: Any, cache: Any, position: int, device: Any, position_ids: torch.Tensor | None = None,
                  attention_mask: torch.Tensor | None = None) -> dict[str, Any]:
    """Keywords for one single-token forward at ``position`` (the cache slot it writes) with ``cache``.

    The cache keyword is ``past_key_values`` up to 5.23 and ``cache`` from 5.24 (:func:`cache_keyword`);
    ``cache_position`` is passed while the model still takes it (up to 5.3). ``position_ids``: a [batch, 1] tensor
    already on the device (a decode loop keeps one and advances it there, so that no step copies a position from
    the host: on CUDA that copy would wait for the device); made here when not given. Its first row is the longest
    sequence (a left-padded batch's row 0 has no padding), so its position is the slot the step writes: that row,
    a view, is the ``cache_position``. ``attention_mask``: the [batch, tokens] padding mask of a ragged batch.
    """
    params = _base_params(model)
    ids = position_ids if position_ids is not None else torch.tensor([[position]], device=device)
    kwargs: dict[str, Any] = {cache_keyword(model, params): cache, "use_cache": True, "position_ids": ids}
    if "cache_position" in params:
        kwargs["cache_position"] = ids[0]
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    return kwargs


def cache_from_output(output: Any) -> Any:
    """The cache object a forward returned (``cache`` from 5.24, ``past_key_values`` before)."""
    fields = getattr(type(output), "__dataclass_fields__", {})
    return getattr(output, "cache" if "cache" in fields else "past_key_values", None)


# --- attention functions -----------------------------------------------------------------------------

def register_attention(name: str, fn: Callable, *, with_sdpa_mask: bool = True) -> None:
    """Register an attention function under ``name`` for ``set_attention``.

    4.51+: ``AttentionInterface.register``; 4.48-4.50: the ``ALL_ATTENTION_FUNCTIONS`` dict; up to 4.47
    there is no functional interface (:class:`Unsupported`). From 4.53 a custom name gets no mask unless a
    mask function is registered too, so ``with_sdpa_mask`` registers ``sdpa_mask`` for it. A bad argument is a
    one-line ValueError naming it and what it accepts, before anything is registered.
    """
    from transformers import modeling_utils

    if not isinstance(name, str) or not name.strip() or "@" in name:
        raise ValueError(f"register_attention({name!r}): name {name!r} is not accepted; give a non-empty text "
                         "without '@' (it separates a class from its attention implementation: dynamic@eager)")
    if not callable(fn):
        raise ValueError(f"register_attention({name!r}): fn {fn!r} is not accepted; give an attention function "
                         "fn(module, query, key, value, attention_mask, **kwargs) -> (output, weights)")
    if not isinstance(with_sdpa_mask, bool):
        raise ValueError(f"register_attention({name!r}): with_sdpa_mask {with_sdpa_mask!r} is not accepted; give "
                         "True or False")

    interface = getattr(modeling_utils, "AttentionInterface", None)
    if interface is not None:
        interface.register(name, fn)
    elif isinstance(getattr(modeling_utils, "ALL_ATTENTION_FUNCTIONS", None), dict):
        modeling_utils.ALL_ATTENTION_FUNCTIONS[name] = fn
    else:
        raise Unsupported(f"no attention registry in transformers {TRANSFORMERS}: a custom attention function "
                          "needs AttentionInterface / ALL_ATTENTION_FUNCTIONS (4.48+)")
    if with_sdpa_mask:
        try:
            from transformers import masking_utils
        except ImportError:  # before 4.53 masks are built by the model, whatever the name
            return
        masking_utils.AttentionMaskInterface.register(name, masking_utils.sdpa_mask)


def attention_name(model: Any) -> str:
    """The attention implementation a built model runs under (``config._attn_implementation``)."""
    return str(model.config._attn_implementation)


def has_attention_registry() -> bool:
    """Whether the release looks attention functions up by name when a layer runs (4.48+: the
    ``ALL_ATTENTION_FUNCTIONS`` dict, ``AttentionInterface`` from 4.51), asked of the code, not the version."""
    from transformers import modeling_utils

    return hasattr(modeling_utils, "AttentionInterface") or isinstance(
        getattr(modeling_utils, "ALL_ATTENTION_FUNCTIONS", None), dict)


def set_attention(model: Any, name: str) -> None:
    """Switch the attention implementation of a built model (``set_attn_implementation`` from 4.54;
    before that the config attribute, read at call time from 4.48)."""
    if attention_name(model) == name:
        return
    if name not in ("sdpa", "eager") and getattr(model, "_supports_attention_backend", True) is False:
        raise Unsupported(f"{type(model).__name__} runs its own attention code, not a registered attention function "
                          f"such as {name!r} (no AttentionInterface support)")
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
        return
    if not has_attention_registry():  # up to 4.47 a model picks its attention class when it is built
        raise release_lacks(f"switching a built model's attention to {name!r}")
    model.config._attn_implementation = name
    for module in model.modules():
        if getattr(module, "config", None) is not None and module.config is not model.config:
            module.config._attn_implementation = name


def from_config(config: Any, dtype: Any = None) -> Any:
    """A randomly initialised causal LM from a config (attention ``sdpa``), built in ``dtype`` when given (a large
    model then never exists in float32)."""
    from transformers import AutoModelForCausalLM

    config._attn_implementation = "sdpa"
    if dtype is None:
        return AutoModelForCausalLM.from_config(config)
    return AutoModelForCausalLM.from_config(config, **{dtype_keyword(): dtype})


def meta_parameters(config: Any) -> int:
    """Parameters of the causal LM a config describes, counted on the meta device (nothing allocated or initialised);
    tied weights once."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@cache
def dtype_keyword() -> str:
    """``from_pretrained``'s dtype keyword: ``torch_dtype`` up to 4.55, ``dtype`` after. Asked of the code: from
    4.56 ``PreTrainedModel._from_config`` pops ``dtype`` (and ``torch_dtype`` only for compatibility); the version
    number answers only where the source cannot be read."""
    from transformers import modeling_utils

    try:
        source = inspect.getsource(modeling_utils.PreTrainedModel._from_config)
    except (OSError, TypeError, AttributeError):
        return "dtype" if VERSION >= (4, 56) else "torch_dtype"
    return "dtype" if re.search(r"""pop\(\s*["']dtype["']""", source) else "torch_dtype"


# --- what each layer of a model caches ---------------------------------------------------------------------

def layer_types(config: Any) -> list[str]:
    """The cache layer type of every decoder layer (``full_attention``, ``sliding_attention``,
    ``linear_attention``, ``conv``, ``hybrid``, ``dummy``...), as this release's caches read them from the config:
    ``cache_utils.get_layer_types_and_kwargs`` (5.x); before it, ``config.layer_types`` when the config has it,
    else every layer sliding when ``sliding_window`` is set and not switched off (Qwen2/Qwen3 configs carry a
    ``sliding_window`` with ``use_sliding_window=False``: full attention), full otherwise."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    reader = getattr(cache_utils, "get_layer_types_and_kwargs", None)
    if reader is not None:
        return list(reader(text)[0])
    declared = getattr(text, "layer_types", None)
    if declared:
        return list(declared)
    sliding = getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True) is not False
    return ["sliding_attention" if sliding else "full_attention"] * text.num_hidden_layers


def mla_caches_latent() -> bool:
    """Whether this release's DeepSeek-V2/V3 attention caches the compressed latent (``kv_lora_rank`` as keys,
    the rotary key ``qk_rope_head_dim`` as values, one head) and expands it every step (``expand_kv``), rather
    than caching the expanded per-head K and V."""
    try:
        from transformers.models.deepseek_v2 import modeling_deepseek_v2
    except ImportError:
        return False
    return hasattr(modeling_deepseek_v2.DeepseekV2Attention, "expand_kv")
