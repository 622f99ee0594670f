"""``--kv-model arch:<model_type>``: a small model of any decoder-only causal-LM type of the installed Transformers,
built offline from that type's own config class (its defaults) with seeded random weights. Cut: the depth (a whole
period of its layer pattern), the hidden and MLP sizes, the vocabulary, the expert counts, the query heads; kept:
what decides the bytes one cached token adds and how attention reads them (head_dim, the query/KV head ratio, MQA,
sliding windows and layer kinds, multi-head latent ranks). Every change is listed (:class:`ArchModel`), and so is
the attention implementation the architecture runs by default (SDPA where it supports it). docs/architectures.md.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from kvcache.analysing.presets import ARCH_PREFIX, ModelError
from kvcache.measuring.arch_defaults import (
    close_per_layer,
    cut_extra_vocab,
    cut_nested,
    cut_prefixed_heads,
    fix_defaults,
    fix_failed_run,
    keep_in_float32,
    open_per_layer,
)
from kvcache.measuring.geometry import text_config

HIDDEN = 256  # the hidden size where the config takes head_dim apart from it (× ``width``)
VOCAB = 1024  # tokens of the cut vocabulary
MIN_POSITIONS = 2048  # trained context at least this (the suite's counted contexts and steps lie within it)
NO_LIMIT = 1 << 20  # tokens recorded as the trained context of a config that names none (ALiBi)
MAX_HEADS = 16  # query heads at most, the query/KV ratio kept below it
EXPERTS = 4  # routed experts kept (of a mixture of experts)
EXPERTS_PER_TOKEN = 2
LIST_HINT = "list them with `kvcache architectures --list`"
EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts",
                 "n_experts", "num_experts_routed")
PER_TOKEN_FIELDS = ("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "top_k", "n_activated_experts",
                    "moe_k", "num_selected_experts")
GROUP_FIELDS = ("n_group", "topk_group", "num_expert_group", "topk_groups")


@dataclass(frozen=True)
class ArchModel:
    """A built ``arch:`` config: ``changes`` says in words what differs from the type's defaults."""

    model_type: str
    config: Any
    changes: tuple[str, ...]


def causal_lm_types() -> dict[str, str | None]:
    """Every model type this release maps to a causal-LM class, sorted: None for a decoder-only one (``arch:``
    accepts it), else why not (an encoder-decoder, an encoder whose causal-LM class is its decoder mode)."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    out: dict[str, str | None] = {}
    for kind in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if kind not in CONFIG_MAPPING:
            out[kind] = "no config class in this release"
            continue
        try:
            defaults = _quiet(CONFIG_MAPPING[kind])
        except Exception:  # noqa: BLE001 - a config that does not build is the sweep's skip, not a refusal here
            out[kind] = None
            continue
        if getattr(defaults, "is_encoder_decoder", False):
            out[kind] = "an encoder-decoder model (its causal-LM class is the decoder half)"
        elif kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(defaults, "is_decoder", False):
            out[kind] = "an encoder (its causal-LM class is a decoder mode of a masked LM)"
        else:
            out[kind] = None
    return out


def check_type(kind: str) -> None:
    """A one-line ModelError unless ``kind`` is a decoder-only causal-LM type of this release."""
    from transformers import __version__

    types = causal_lm_types()
    name = f"--kv-model {ARCH_PREFIX}{kind}"
    if kind not in types:
        raise ModelError(f"{name}: {kind!r} is not a causal-LM model type of transformers {__version__}; {LIST_HINT}")
    if types[kind]:
        raise ModelError(f"{name}: {kind!r} is {types[kind]}, not a decoder-only causal LM; {LIST_HINT}")


def arch_config(name: str, width: int = 1) -> ArchModel:
    """An ``arch:<model_type>[@layers=N]`` name's small config and what was changed (:func:`arch_model`)."""
    from kvcache.analysing.presets import split_layers

    base, layers = split_layers(name)
    return arch_model(base[len(ARCH_PREFIX):], layers, width)


def arch_model(kind: str, layers: int | None = None, width: int = 1) -> ArchModel:
    """The small config of model type ``kind`` (:func:`check_type`): ``layers`` deep (default: one period of its
    layer pattern, at least 2), hidden ``HIDDEN × width`` where head_dim is its own field, else query heads ×
    head_dim (``width`` then doubles the heads, the ratio kept)."""
    from transformers import CONFIG_MAPPING

    check_type(kind)
    config = _quiet(CONFIG_MAPPING[kind])
    text = text_config(config)
    per_layer, depth = open_per_layer(kind, text), text.num_hidden_layers
    missing = [f for f in ("num_hidden_layers", "num_attention_heads", "hidden_size")
               if not isinstance(getattr(text, f, None), int)]
    if missing:
        raise ModelError(f"--kv-model {ARCH_PREFIX}{kind}: its config ({type(text).__name__}) has no "
                         f"{', '.join(missing)}: not one decoder stack this builder can cut")
    changes: list[str] = []
    hidden = text.hidden_size
    fix_defaults(text, changes)
    _cut_depth(text, layers, changes)
    _cut_heads(text, width, changes)
    cut_prefixed_heads(text, changes, MAX_HEADS)
    _cut_sizes(text, changes)
    cut_nested(text, hidden, changes)
    cut_extra_vocab(text, VOCAB, changes)
    close_per_layer(text, per_layer, depth, changes)
    _fix_tokens(text, changes)
    _trained_context(text, changes)
    _nested_attention(text, changes)
    if text is not config:
        _fix_tokens(config, changes)
    return ArchModel(kind, config, tuple(changes))


def pattern_period(text: Any) -> int:
    """Layers of one period of the layer pattern: the fewest first layers holding every kind that
    ``layer_types`` names, repeated where the list repeats; 1 where every layer is alike."""
    from kvcache.measuring.geometry import layer_period

    types = list(getattr(text, "layer_types", None) or [])
    if not types:
        return 1
    period = layer_period(text)
    if period is not None:
        return period
    kinds = set(types)
    return next(n for n in range(1, len(types) + 1) if set(types[:n]) == kinds)


def _cut_depth(text: Any, layers: int | None, changes: list[str]) -> None:
    from kvcache.measuring.geometry import at_depth

    depth = text.num_hidden_layers
    period = pattern_period(text)
    wanted = layers if layers is not None else max(2, period)
    if wanted % period and layers is not None:
        raise ModelError(f"--kv-model: layers {layers} is not a multiple of {period} (its layer pattern)")
    if wanted != depth:
        cut = at_depth(text, wanted)
        for key, value in vars(cut).items():
            if key != "num_hidden_layers" and value is not getattr(text, key, None):
                setattr(text, key, value)
        text.num_hidden_layers = wanted
        changes.append(f"layers {depth}->{wanted}")
    for key in ("first_k_dense_replace", "num_dense_layers"):
        value = getattr(text, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= wanted > 1:
            setattr(text, key, 1)
            changes.append(f"{key} {value}->1")


def _heads(text: Any) -> tuple[int, int, int]:
    from kvcache.measuring.geometry import kv_heads_of

    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return heads, kv_heads_of(text), head_dim


def _cut_heads(text: Any, width: int, changes: list[str]) -> None:
    """Fewer query heads, the query/KV ratio kept (MQA stays one KV head, MHA equal counts); head_dim kept. A
    multi-head latent (``kv_lora_rank``) keeps its heads: each step expands the latent to all of them."""
    heads, kv, head_dim = _heads(text)
    if "head_dim" in vars(text) and text.head_dim is None:  # unset: the modeling file may read the None itself
        text.head_dim = head_dim
        changes.append(f"head_dim unset->{head_dim} (hidden / heads, as it is derived)")
    mla = bool(getattr(text, "kv_lora_rank", None))
    own_head_dim = getattr(text, "head_dim", None) is not None and "head_dim" in vars(text)
    if mla:
        new_heads, new_kv = heads, kv
    elif kv == heads:
        new_heads = new_kv = 2 * width
    elif kv == 1:
        new_heads, new_kv = min(heads, MAX_HEADS // 2) * (1 if own_head_dim else width), 1
    else:
        ratio = max(1, heads // kv)
        new_kv = (2 if 2 * ratio <= MAX_HEADS else 1) * (1 if own_head_dim else width)
        new_heads = new_kv * min(ratio, MAX_HEADS)
    hidden = HIDDEN * width if own_head_dim or mla else new_heads * head_dim
    old_hidden = text.hidden_size
    if (new_heads, new_kv) != (heads, kv):
        text.num_attention_heads = new_heads
        if getattr(text, "num_key_value_heads", None) is not None and not _multi_query(text):
            text.num_key_value_heads = new_kv
        if getattr(text, "num_kv_heads", None) is not None and not _multi_query(text):
            text.num_kv_heads = new_kv
        changes.append(f"heads {heads}->{new_heads}, KV heads {kv}->{new_kv} (head_dim {head_dim} kept)")
    if own_head_dim:
        text.head_dim = head_dim
    if hidden != old_hidden:
        text.hidden_size = hidden
        changes.append(f"hidden {old_hidden}->{hidden}")


def _multi_query(text: Any) -> bool:
    return bool(getattr(text, "multi_query", False)) and not getattr(text, "new_decoder_architecture", False)


def _cut_sizes(text: Any, changes: list[str]) -> None:
    """MLP sizes at most twice the hidden size, the vocabulary :data:`VOCAB`, experts cut."""
    hidden = text.hidden_size
    experts = any(isinstance(getattr(text, key, None), int) for key in EXPERT_FIELDS)
    if not experts and isinstance(getattr(text, "moe_intermediate_size", None), int):
        for key in EXPERT_FIELDS:  # a mixture of experts whose defaults leave the count unset
            if key in vars(text) and getattr(text, key) is None:
                setattr(text, key, EXPERTS)
                changes.append(f"{key} unset->{EXPERTS} (the defaults name no expert count)")
                experts = True
        if experts and "n_shared_experts" in vars(text) and text.n_shared_experts is None:
            text.n_shared_experts = 1
            changes.append("n_shared_experts unset->1 (the defaults name no expert count)")
    for key, value in sorted(vars(text).items()):
        if value is None and key in PER_TOKEN_FIELDS and experts:  # routing unset in the defaults: top_k None
            setattr(text, key, EXPERTS_PER_TOKEN)
            changes.append(f"{key} unset->{EXPERTS_PER_TOKEN} (the defaults route to no expert)")
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if ("intermediate" in key or "ffn" in key or key == "n_inner") and value > 2 * hidden:
            setattr(text, key, 2 * hidden)
            changes.append(f"{key} {value}->{2 * hidden}")
        elif key in EXPERT_FIELDS and value > EXPERTS:
            setattr(text, key, EXPERTS)
            changes.append(f"{key} {value}->{EXPERTS}")
        elif key in PER_TOKEN_FIELDS and value > EXPERTS_PER_TOKEN and experts:  # 4.x: top_k is also sampling's
            setattr(text, key, EXPERTS_PER_TOKEN)
            changes.append(f"{key} {value}->{EXPERTS_PER_TOKEN}")
        elif key in GROUP_FIELDS and value > 1:
            setattr(text, key, 1)
            changes.append(f"{key} {value}->1")
    vocab = getattr(text, "vocab_size", None)
    if isinstance(vocab, int) and vocab > VOCAB:
        text.vocab_size = VOCAB
        changes.append(f"vocab {vocab}->{VOCAB}")


def _trained_context(text: Any, changes: list[str]) -> None:
    """``max_position_embeddings`` where the config names its trained context otherwise (``n_positions``...), or
    :data:`NO_LIMIT` where it has none (ALiBi); at least :data:`MIN_POSITIONS`."""
    value = getattr(text, "max_position_embeddings", None)
    if isinstance(value, int):
        if value < MIN_POSITIONS:  # learned absolute positions: the counted contexts must lie within them
            text.max_position_embeddings = MIN_POSITIONS
            changes.append(f"max_position_embeddings {value}->{MIN_POSITIONS} (the counted contexts lie beyond it)")
        return
    for key in ("n_positions", "max_sequence_length", "seq_length", "n_ctx", "max_seq_len", "max_len"):
        value = getattr(text, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            text.max_position_embeddings = max(value, MIN_POSITIONS)
            setattr(text, key, max(value, MIN_POSITIONS))
            changes.append(f"max_position_embeddings taken from {key} ({value}"
                           f"{f'->{MIN_POSITIONS}' if value < MIN_POSITIONS else ''})")
            return
    text.max_position_embeddings = NO_LIMIT
    changes.append(f"no trained context in the config: max_position_embeddings recorded as {NO_LIMIT}")


def _nested_attention(text: Any, changes: list[str]) -> None:
    """A nested attention config (DBRX's ``attn_config``) given the ``rope_theta`` its modeling file reads there
    where the defaults keep it in the outer config's ``rope_parameters`` only."""
    theta = (getattr(text, "rope_parameters", None) or {}).get("rope_theta")
    for key, value in list(vars(text).items()):
        if "attn" not in key or not hasattr(value, "to_dict") or theta is None:
            continue
        if "rope_theta" not in vars(value):
            value.rope_theta = theta
            changes.append(f"{key}.rope_theta set to {theta:g} (from rope_parameters; the attention reads it there)")


def _fix_tokens(config: Any, changes: list[str]) -> None:
    """Special token ids beyond the cut vocabulary moved to its last token (an embedding's padding index must lie
    within it)."""
    vocab = getattr(text_config(config), "vocab_size", None) or VOCAB
    for key, value in sorted(vars(config).items()):
        if not key.endswith("_token_id"):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= vocab:
            setattr(config, key, vocab - 1)
            changes.append(f"{key} {value}->{vocab - 1} (within the vocabulary)")
        elif isinstance(value, list) and any(isinstance(v, int) and v >= vocab for v in value):
            setattr(config, key, [min(v, vocab - 1) for v in value])
            changes.append(f"{key} clipped to {vocab - 1} (within the vocabulary)")


def _quiet(cls: Any) -> Any:
    """``cls()`` with Transformers' config warnings silenced (defaults of one type warn about another's ids)."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        return copy.deepcopy(cls())
    finally:
        logging.set_verbosity(level)


def build_arch(name: str, device: Any, dtype: str, parameters: Any, seed: int = 0,
               retry: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """The ``arch:`` model (random weights seeded by ``seed``, built in float32 then cast, eval mode) under the
    architecture's default attention implementation, and its :class:`~kvcache.measuring.geometry.ModelSpec` naming
    that implementation and the changes. Its geometry is checked against what a short prefill caches in every
    layer: a mismatch is a one-line ModelError (the run would count the wrong bytes). ``parameters(model)``: the
    parameters it holds (:func:`kvcache.measuring.models.distinct_parameters`)."""
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM

    from kvcache.measuring import compat
    from kvcache.measuring.geometry import KIND_OF_LAYER_TYPE, spec_from_config, torch_dtype

    built = arch_config(name)
    if retry:  # the defaults' prefill failed: built again with the fix for it (:func:`fix_failed_run`)
        fix_failed_run(built.config, [])
        built = dataclasses.replace(built, changes=retry)
    unknown = sorted(set(compat.layer_types(text_config(built.config))) - set(KIND_OF_LAYER_TYPE))
    if unknown:  # before the model is built: its modeling file may need what the geometry cannot state
        raise ModelError(f"--kv-model {name!r}: layer type {', '.join(unknown)} is not one the suite's geometry "
                         f"knows ({', '.join(KIND_OF_LAYER_TYPE)}): its bytes per token cannot be stated")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(built.config)
    model = model.to(device=device, dtype=torch_dtype(dtype)).eval()
    kept = keep_in_float32(model, torch_dtype(dtype)) if retry else None  # only where the plain cast failed
    model.requires_grad_(False)
    text = text_config(model.config)
    spec = spec_from_config(name, text, dtype, parameters=parameters(model))
    attention = str(model.config._attn_implementation)
    spec = dataclasses.replace(spec, attention=attention, changes=built.changes + ((kept,) if kept else ()))
    if not any(spec.cached_shapes()):
        raise ModelError(f"--kv-model {name!r}: no layer of {text.num_hidden_layers} caches K/V (layer types "
                         f"{', '.join(sorted(set(compat.layer_types(text))))}): no KV cache to count")
    try:
        check_cached_shapes(name, model, spec, device)
    except (RuntimeError, TypeError):
        changes = list(built.changes)
        fixed = fix_failed_run(built.config, changes)
        if retry or not (fixed or keep_in_float32(model, torch_dtype(dtype))):
            raise
        return build_arch(name, device, dtype, parameters, seed, retry=tuple(changes))
    return model, spec


def check_cached_shapes(name: str, model: Any, spec: Any, device: Any) -> None:
    """A one-line ModelError unless a 4-token prefill caches, in every layer, the (heads, key dim, value dim) the
    spec says (none where it says the layer caches no K/V)."""
    import torch

    from kvcache.measuring import compat

    cache = compat.new_dynamic_cache(model.config)
    ids = torch.arange(1, 5, device=device)[None] % spec.vocab
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, **{compat.cache_keyword(model): cache})
    cache = compat.cache_from_output(out) or cache
    for index, wanted in enumerate(spec.cached_shapes()):
        try:
            keys, values = compat.layer_kv(cache, index)
        except (IndexError, AttributeError):
            keys = values = None
        got = None
        if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.dim() == 4 and keys.numel():
            got = (keys.shape[1], keys.shape[-1], values.shape[-1])
        if got != wanted:
            raise ModelError(f"--kv-model {name!r}: layer {index} caches {got or 'no K/V'} (heads, key dim, value "
                             f"dim), its geometry says {wanted or 'none'}: not measurable as built")


def default_kv_bytes(kind: str, tokens: int = 32768, dtype: str = "bfloat16") -> float | None:
    """KV bytes the type's default (real) config holds for a context of ``tokens`` in ``dtype`` (every layer, sliding
    layers at their window); None where that geometry cannot be read."""
    from transformers import CONFIG_MAPPING

    from kvcache.measuring.geometry import spec_from_config

    try:
        text = text_config(_quiet(CONFIG_MAPPING[kind]))
        _trained_context(text, [])
        return spec_from_config(f"{ARCH_PREFIX}{kind}", text, dtype, parameters=0).kv_bytes(tokens)
    except Exception:  # noqa: BLE001 - a geometry this reader does not know is a blank, not a failure
        return None
