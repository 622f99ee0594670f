"""The ``--kv-model`` and ``--kv-dtype`` names: the presets (their config values), the model-family presets,
``@layers=N`` and checking a name. The default preset is SmolLM2-135M's geometry with seeded random weights (they
move the same bytes as trained ones); ``tiny`` keeps its heads with 2 layers (docs/models.md). Standard library
only: the measuring wing builds the models (:mod:`kvcache.measuring.configs`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SMOLLM2_135M: dict[str, Any] = dict(
    hidden_size=576,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    intermediate_size=1536,
    vocab_size=49152,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    bos_token_id=0,
    eos_token_id=0,
)

PRESETS: dict[str, dict[str, Any]] = {
    "smollm2-135m": SMOLLM2_135M,
    "smollm2-135m-mha": {**SMOLLM2_135M, "num_key_value_heads": 9},
    "tiny": {**SMOLLM2_135M, "num_hidden_layers": 2, "vocab_size": 2048},
}

DTYPES = ("bfloat16", "float16", "float32")


class ModelError(ValueError):
    """A ``--kv-model``/``--kv-dtype`` value that cannot be used; the message is one line."""


@dataclass(frozen=True)
class FamilyPreset:
    """A model family's preset: a named public checkpoint's per-layer geometry, built offline from Transformers'
    own config class (``model_type``) with random weights. ``period`` is the repeating layer pattern (the
    ``layer_types`` of one period, or None when every layer is alike): ``@layers=N`` must be a multiple of it."""

    model_type: str
    checkpoint: str
    config: dict[str, Any]
    period: tuple[str, ...] | None = None
    note: str = ""

    @property
    def pattern(self) -> int:
        """Layers in one period of the pattern (1 when every layer is alike)."""
        return len(self.period) if self.period else 1

    def describe_pattern(self) -> str:
        """The pattern in words: ``"5 sliding : 1 full"``, or ``"every layer alike"``."""
        if not self.period:
            return "every layer alike"
        kinds = {kind: self.period.count(kind) for kind in dict.fromkeys(self.period)}
        return " : ".join(f"{n} {kind.replace('_attention', '')}" for kind, n in kinds.items())


GEMMA3_PERIOD = ("sliding_attention",) * 5 + ("full_attention",)
QWEN3_NEXT_PERIOD = ("linear_attention",) * 3 + ("full_attention",)

# Real per-layer geometry of each checkpoint's config.json (written from the published configs; vocabularies kept
# real). Expert counts of mixture-of-experts MLPs are reduced where noted: the KV cache never sees them.
FAMILY_PRESETS: dict[str, FamilyPreset] = {
    "qwen3-0.6b": FamilyPreset("qwen3", "Qwen/Qwen3-0.6B", dict(
        hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960,
        rope_theta=1000000.0, rms_norm_eps=1e-6, use_sliding_window=False)),
    "mistral-7b": FamilyPreset("mistral", "mistralai/Mistral-7B-v0.1", dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        intermediate_size=14336, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=32768,
        rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=4096)),
    "gemma3-270m": FamilyPreset("gemma3_text", "google/gemma-3-270m", dict(
        hidden_size=640, num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        intermediate_size=2048, vocab_size=262144, tie_word_embeddings=True, max_position_embeddings=32768,
        query_pre_attn_scalar=256, rms_norm_eps=1e-6, sliding_window=512), period=GEMMA3_PERIOD),
    "qwen3-next-80b-a3b": FamilyPreset("qwen3_next", "Qwen/Qwen3-Next-80B-A3B-Instruct", dict(
        hidden_size=2048, num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        intermediate_size=5120, vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=262144,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
        linear_num_value_heads=32, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        num_experts=16, num_experts_per_tok=10, rms_norm_eps=1e-6), period=QWEN3_NEXT_PERIOD,
        note="16 of its 512 experts"),
    "deepseek-v2-lite": FamilyPreset("deepseek_v2", "deepseek-ai/DeepSeek-V2-Lite", dict(
        hidden_size=2048, num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
        q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        intermediate_size=10944, moe_intermediate_size=1408, n_routed_experts=64, n_shared_experts=2,
        num_experts_per_tok=6, first_k_dense_replace=1, vocab_size=102400, tie_word_embeddings=False,
        max_position_embeddings=163840, rms_norm_eps=1e-6), note="first layer dense, as in the checkpoint; "
        "no YaRN rope scaling"),
    "falcon-7b": FamilyPreset("falcon", "tiiuae/falcon-7b", dict(
        hidden_size=4544, num_hidden_layers=32, num_attention_heads=71, multi_query=True,
        new_decoder_architecture=False, parallel_attn=True, bias=False, alibi=False, vocab_size=65024,
        max_position_embeddings=2048, layer_norm_epsilon=1e-5)),
}

LAYERS_SUFFIX = re.compile(r"^(?P<base>.+)@layers=(?P<n>[^@]*)$")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name
#: ``arch:<model_type>``: a small model of any decoder-only causal-LM type of the installed release
#: (:mod:`kvcache.measuring.architectures`; whether the type exists is checked there, with transformers).
ARCH_PREFIX = "arch:"
ARCH_NAME = re.compile(r"^arch:[a-z0-9][a-z0-9_-]*$")
#: The end of the one-line error of a preset whose architecture the installed release lacks (scripts/versions.py
#: reads it in a run's log to list the release as skipped, not failed).
ABSENT_ARCHITECTURE = "is not in this transformers release"


def check_name(name: str) -> None:
    """What :func:`kvcache.measuring.configs.load_config` accepts, checked without importing transformers: a preset
    (``@layers=N`` a valid depth), a directory or a hub id; anything else is a one-line ModelError naming the
    presets."""
    base, _ = split_layers(name)
    if base.startswith(ARCH_PREFIX):
        if not ARCH_NAME.match(base):
            raise ModelError(f"--kv-model {name!r}: {base[len(ARCH_PREFIX):]!r} is not a model type name (e.g. "
                             "arch:llama); list them with `kvcache architectures --list`")
        return
    path = Path(name).expanduser()
    if base in PRESETS or base in FAMILY_PRESETS or (HUB_ID.match(name) and not path.exists()):
        return
    if not path.is_dir():
        raise ModelError(f"--kv-model {name!r} is not a preset ({', '.join(preset_names())}), an arch:<model_type> "
                         "nor a directory with a config.json")
    if not (path / "config.json").is_file():
        raise ModelError(f"--kv-model {name!r}: directory has no config.json")


def preset_names() -> list[str]:
    """Every preset name (Llama-geometry presets, then the family presets)."""
    return [*PRESETS, *FAMILY_PRESETS]


def split_layers(name: str) -> tuple[str, int | None]:
    """``"gemma3-270m@layers=6"`` -> ``("gemma3-270m", 6)``; a plain name -> ``(name, None)``. A depth that is not
    a positive multiple of the preset's layer pattern, or ``@layers`` on something not a preset, is a one-line
    ModelError naming the value and the accepted ones."""
    match = LAYERS_SUFFIX.match(name)
    if not match:
        return name, None
    base, text = match["base"], match["n"]
    if base.startswith(ARCH_PREFIX):  # its layer pattern is known to the measuring wing only
        if not text.isdigit() or int(text) < 1:
            raise ModelError(f"--kv-model {name!r}: layers {text!r} is not a positive whole number")
        return base, int(text)
    if base not in PRESETS and base not in FAMILY_PRESETS:
        raise ModelError(f"--kv-model {name!r}: @layers=N applies to presets only ({', '.join(preset_names())}), "
                         f"not {base!r}")
    preset = FAMILY_PRESETS.get(base)
    pattern = preset.pattern if preset else 1
    shape = preset.describe_pattern() if preset else "every layer alike"
    accepted = f"a positive multiple of {pattern} ({base}'s layer pattern: {shape}), e.g. {pattern}, {2 * pattern}"
    try:
        layers = int(text)
    except ValueError:
        raise ModelError(f"--kv-model {name!r}: layers {text!r} is not a whole number; accepted: {accepted}") from None
    if layers < 1 or layers % pattern:
        raise ModelError(f"--kv-model {name!r}: layers {layers} is not {accepted}")
    return base, layers
