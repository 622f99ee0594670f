"""Fixes an ``arch:`` config needs where the type's own defaults do not build or run (:mod:`.architectures`), and
its per-layer (heterogeneous) attributes: each generic (a field's rule, never a model's name) and each said in words
in ``changes`` (the record's ``kv.model.changes``). None touches what decides the bytes one cached token adds,
except as the modeling file derives it itself (an unset KV head count is the query head count). docs/architectures.md.
"""

from __future__ import annotations

from typing import Any

from kvcache.analysing.presets import ARCH_PREFIX, ModelError

# attributes the builder cuts (heads, sizes): a per-layer value of one of them could not be cut alike
CUT_PER_LAYER = ("num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size",
                 "moe_intermediate_size", "kv_lora_rank", "q_lora_rank", "vocab_size")
OTHER_VOCABS = ("vocab_size_per_layer_input", "unpadded_vocab_size")
CLIP = 8.0  # |q|, |k|, |v| clamp where a config leaves ``clip_qkv`` unset but its attention clamps with it


def open_per_layer(kind: str, text: Any) -> dict[int, dict[str, Any]] | None:
    """A heterogeneous config's per-layer overrides, its global attributes made readable while it is cut (the
    first layer's values); a one-line ModelError where a layer overrides what the builder cuts."""
    from kvcache.measuring.geometry import per_layer_overrides

    overrides = per_layer_overrides(text)
    if overrides is None:
        return None
    cut = sorted({key for layer in overrides.values() for key in layer if key in CUT_PER_LAYER})
    if cut:
        raise ModelError(f"--kv-model {ARCH_PREFIX}{kind}: per-layer {', '.join(cut)} (a heterogeneous config): "
                         "the builder cuts these globally and cannot keep each layer's ratio")
    text.allow_global_per_layer_attribute_access = True
    return overrides


def close_per_layer(text: Any, overrides: dict[int, dict[str, Any]] | None, depth: int, changes: list[str]) -> None:
    """The per-layer overrides put back on the cut config: layer ``i`` of the cut takes layer ``i mod depth``'s
    (``depth``: the default config's layers); the global access closed again."""
    if overrides is None:
        return
    kept = {i: dict(overrides[i % depth]) for i in range(text.num_hidden_layers) if i % depth in overrides}
    text.__dict__.pop("_heterogeneity_spec", None)
    text.allow_global_per_layer_attribute_access = False
    text.per_layer_config = kept
    names = sorted({key for layer in kept.values() for key in layer})
    changes.append(f"per-layer {', '.join(names)} kept on layers {', '.join(map(str, sorted(kept)))} "
                   "(a heterogeneous config, cut with its layers)")


def fix_defaults(text: Any, changes: list[str]) -> None:
    """Unset fields a modeling file reads as set: the KV head count (MHA, as configs derive it), the layer types
    (every layer full attention), per-layer-type rotary parameters (the default rotary for each type)."""
    if "num_key_value_heads" in vars(text) and text.num_key_value_heads is None:
        text.num_key_value_heads = text.num_attention_heads
        changes.append(f"num_key_value_heads unset->{text.num_attention_heads} (the query heads, as derived)")
    if "layer_types" in vars(text) and text.layer_types is None:
        text.layer_types = ["full_attention"] * text.num_hidden_layers
        changes.append("layer_types unset->full_attention on every layer (the defaults name no pattern)")
    rope = vars(text).get("rope_parameters")
    types = set(getattr(text, "layer_types", None) or [])
    if isinstance(rope, dict) and types and "rope_theta" not in rope and not types & set(rope):
        theta = float(getattr(text, "default_theta", None) or 10000.0)
        text.rope_parameters = {t: {"rope_type": "default", "rope_theta": theta} for t in sorted(types)}
        changes.append(f"rope_parameters empty->default rotary (theta {theta:g}) per layer type "
                       "(the rotary embedding reads one per type)")


def fix_failed_run(config: Any, changes: list[str]) -> bool:
    """After the defaults failed a prefill: a nested attention config's unset ``clip_qkv`` set to :data:`CLIP`
    (DBRX's attention clamps with it whether set or not; where None is allowed, MPT, nothing is changed as that
    run did not fail). Whether anything was changed."""
    from kvcache.measuring.geometry import text_config

    fixed = False
    for key, value in list(vars(text_config(config)).items()):
        if "attn" in key and hasattr(value, "to_dict") and "clip_qkv" in vars(value) and value.clip_qkv is None:
            value.clip_qkv = CLIP
            changes.append(f"{key}.clip_qkv unset->{CLIP:g} (the defaults' prefill failed: its attention clamps "
                           "with it unconditionally)")
            fixed = True
    return fixed


def keep_in_float32(model: Any, dtype: Any) -> str | None:
    """The tensors the model class keeps in float32 at ``dtype`` (its ``_keep_in_fp32_modules_strict``, through the
    release's own dtype plan, as ``from_pretrained`` loads them) put back in float32 after the cast; what was kept,
    in words, or None."""
    import re

    import torch

    planner = getattr(model, "_get_dtype_plan", None)
    patterns = sorted(planner(dtype)) if planner else []
    kept = 0
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and tensor.dtype != torch.float32 and any(re.search(p, name) for p in patterns):
            tensor.data = tensor.data.float()
            kept += 1
    if not kept:
        return None
    return f"{kept} tensors of its float32 modules ({', '.join(patterns)}) kept in float32, as from_pretrained does"


def cut_extra_vocab(text: Any, vocab: int, changes: list[str]) -> None:
    """The decoder's other vocabularies cut to ``vocab``: per-layer input embeddings (``vocab_size_per_layer_input``),
    an output head's own size (``unpadded_vocab_size``: the greedy token must lie within the input's)."""
    for key, value in sorted(vars(text).items()):
        if key in OTHER_VOCABS and isinstance(value, int) and not isinstance(value, bool) and value > vocab:
            setattr(text, key, vocab)
            changes.append(f"{key} {value}->{vocab}")


def cut_nested(text: Any, old_hidden: int, changes: list[str]) -> None:
    """A nested MLP config (one named ``ffn``/``mlp``: DBRX's ``ffn_config``) cut alike: a hidden size that was the
    model's now the cut one, MLP sizes at most twice it. (Other nested configs, an encoder's, are left.)"""
    hidden = text.hidden_size
    for name, nested in sorted(vars(text).items()):
        if not hasattr(nested, "to_dict") or nested is text or not ("ffn" in name or "mlp" in name):
            continue
        if vars(nested).get("hidden_size") == old_hidden != hidden:
            nested.hidden_size = hidden
            changes.append(f"{name}.hidden_size {old_hidden}->{hidden} (the model's)")
        for key, value in sorted(vars(nested).items()):
            if isinstance(value, int) and not isinstance(value, bool) and value > 2 * hidden and (
                    "intermediate" in key or "ffn" in key):
                setattr(nested, key, 2 * hidden)
                changes.append(f"{name}.{key} {value}->{2 * hidden}")


def cut_prefixed_heads(text: Any, changes: list[str], most: int) -> None:
    """A second head geometry (``swa_num_attention_heads`` / ``swa_num_key_value_heads``: Inkling's sliding layers)
    cut as the main one is: its query/KV ratio kept (at most ``most`` query heads), its head_dim kept."""
    for key in sorted(vars(text)):
        prefix = key.removesuffix("num_key_value_heads")
        if not prefix or prefix == key or not isinstance(getattr(text, key), int):
            continue
        heads, kv = vars(text).get(f"{prefix}num_attention_heads"), getattr(text, key)
        if not isinstance(heads, int) or kv < 1:
            continue
        ratio = max(1, heads // kv)
        new_kv = 1 if kv == 1 else (2 if 2 * ratio <= most else 1)
        new_heads = new_kv * min(ratio, most) if kv != heads else 2
        if (new_heads, new_kv) != (heads, kv):
            setattr(text, f"{prefix}num_attention_heads", new_heads)
            setattr(text, key, new_kv)
            changes.append(f"{prefix}heads {heads}->{new_heads}, {prefix}KV heads {kv}->{new_kv} (ratio kept)")
