"""Model presets and their geometry: the bytes one token adds to the KV cache and the bytes of weights.

The default is SmolLM2-135M's geometry as a ``LlamaForCausalLM`` with random weights (seeded, built
offline): random weights move the same bytes as trained ones. ``tiny`` keeps the head geometry with 2
layers for fast CI; ``smollm2-135m-mha`` has as many KV heads as query heads (nothing to expand).
A local directory with a ``config.json`` (weights loaded when present) or a hub id also works.
"""

from __future__ import annotations

import json
import re
import threading
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
        return len(self.period) if self.period else 1

    def describe_pattern(self) -> str:
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

KIND_OF_LAYER_TYPE = {
    "full_attention": "full", "hybrid": "full", "indexed_attention": "full",
    "sliding_attention": "sliding", "chunked_attention": "sliding", "hybrid_sliding": "sliding",
    "linear_attention": "linear", "conv": "linear", "dummy": "none",
}
KINDS = ("full", "sliding", "linear")  # the kinds passes are reported for ("none": a layer that caches nothing)
LAYERS_SUFFIX = re.compile(r"^(?P<base>.+)@layers=(?P<n>[^@]*)$")


@dataclass(frozen=True)
class LayerKV:
    """What one decoder layer caches: its ``kind`` (full, sliding, linear, none), the K and V bytes one token adds
    to it (``heads`` × (``key_dim`` + ``value_dim``) × dtype bytes; 0 for a layer whose state does not grow) and,
    for a sliding layer, the ``window`` of tokens it retains."""

    kind: str
    bytes_per_token: int
    window: int | None = None
    heads: int = 0
    key_dim: int = 0
    value_dim: int = 0

    def held_tokens(self, tokens: float) -> float:
        """Tokens this layer holds for a context of ``tokens``."""
        if self.bytes_per_token == 0:
            return 0
        return min(tokens, self.window) if self.window else tokens


class ModelError(ValueError):
    """A ``--kv-model``/``--kv-dtype`` value that cannot be used; the message is one line."""


@dataclass(frozen=True)
class ModelSpec:
    """What a model moves: geometry from its config, sizes in bytes for the chosen dtype."""

    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    max_position_embeddings: int
    dtype: str
    dtype_bytes: int
    parameters: int
    layer_kv: tuple[LayerKV, ...] = ()

    @property
    def bytes_per_token(self) -> int:
        """KV-cache bytes one token adds while every layer grows: K and V, every layer, every KV head (each layer's
        own geometry when known: a latent, a window, a state that does not grow)."""
        if self.layer_kv:
            return sum(layer.bytes_per_token for layer in self.layer_kv)
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of all parameters (tied embeddings counted once)."""
        return self.parameters * self.dtype_bytes

    def kv_bytes(self, tokens: float) -> float:
        """Logical KV bytes the cache holds for a context of ``tokens``: per layer, the tokens it retains × its K/V
        bytes per token (sliding layers stop at their window, linear-attention state does not grow)."""
        if self.layer_kv:
            return sum(layer.bytes_per_token * layer.held_tokens(tokens) for layer in self.layer_kv)
        return self.bytes_per_token * tokens

    def cached_shapes(self) -> list[tuple[int, int, int] | None]:
        """Per layer, (heads, key dim, value dim) of the K/V it caches per token; None for a layer that holds none
        (linear-attention state, a layer without attention)."""
        if not self.layer_kv:
            return [(self.kv_heads, self.head_dim, self.head_dim)] * self.layers
        return [(layer.heads, layer.key_dim, layer.value_dim) if layer.bytes_per_token else None
                for layer in self.layer_kv]

    def kind_layers(self) -> dict[str, list[int]]:
        """Layer indices of each kind present (full, sliding, linear), in the order of :data:`KINDS`."""
        out: dict[str, list[int]] = {}
        for kind in KINDS:
            found = [i for i, layer in enumerate(self.layer_kv) if layer.kind == kind]
            if found:
                out[kind] = found
        return out

    @property
    def mixed(self) -> bool:
        """Whether any layer is not a plain full-attention layer (passes are then reported per kind)."""
        return any(layer.kind != "full" for layer in self.layer_kv)

    def kv_bytes_of(self, kind: str, tokens: float) -> float:
        """Logical KV bytes the layers of ``kind`` hold for a context of ``tokens``."""
        return sum(layer.bytes_per_token * layer.held_tokens(tokens) for layer in self.layer_kv if layer.kind == kind)

    def windows(self) -> list[int]:
        return sorted({layer.window for layer in self.layer_kv if layer.window and layer.bytes_per_token})

    def kinds_dict(self) -> dict[str, Any]:
        """``{kind: {layers, bytes_per_token, window}}``: what the record's ``model.kinds`` says."""
        out = {}
        for kind, idxs in self.kind_layers().items():
            windows = sorted({self.layer_kv[i].window for i in idxs if self.layer_kv[i].window})
            out[kind] = {"layers": len(idxs), "bytes_per_token": sum(self.layer_kv[i].bytes_per_token for i in idxs),
                         "window": windows[0] if len(windows) == 1 else (windows or None)}
        return out

    def counted_contexts(self, wanted: tuple[int, ...]) -> tuple[int, ...]:
        """The contexts to count at: ``wanted``, unless a sliding window lies within reach of them (a layer that stops
        growing between the two would bend the slope): then a quarter and a half of the smallest window, where every
        kind grows."""
        windows = self.windows()
        margin = 64  # warm-up steps and the counted step stay well clear of the window
        if windows and max(wanted) + margin >= windows[0]:
            return (max(1, windows[0] // 4), max(2, windows[0] // 2))
        return tuple(wanted)

    def beyond_windows(self, wanted: tuple[int, ...]) -> tuple[int, ...] | None:
        """Two contexts past every sliding window (2× and 3× the largest), to show sliding layers stop growing;
        None when the model has no sliding layer."""
        windows = self.windows()
        if not windows:
            return None
        return (2 * windows[-1], 3 * windows[-1])

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "layers": self.layers, "heads": self.heads, "kv_heads": self.kv_heads,
            "head_dim": self.head_dim, "hidden": self.hidden, "vocab": self.vocab, "dtype": self.dtype,
            "bytes_per_token": self.bytes_per_token, "weight_bytes": self.weight_bytes,
            "parameters": self.parameters, "max_position_embeddings": self.max_position_embeddings,
            **({"kinds": self.kinds_dict()} if self.mixed else {}),
        }


def torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise ModelError(f"--kv-dtype {name!r} is not one of {', '.join(DTYPES)}")
    return getattr(torch, name)


#: Deeper than this, a non-Llama config's parameters are counted on the meta device at a few shallow depths of the
#: same layer pattern and extrapolated (building every layer, even on the meta device, takes about 1.5 ms a layer).
META_LAYERS = 256


def count_parameters(config: Any) -> int:
    """Parameters of a Llama-style decoder from its config (embeddings, attention, MLP, norms, head); any other
    family's model is built on the meta device (nothing allocated) and its parameters counted, tied weights once.
    Deeper than :data:`META_LAYERS` with a repeating layer pattern, it is counted at three shallow depths that
    differ by one period of the pattern and extrapolated (parameters grow by the same amount each period); a
    config whose count does not grow that way is built at its full depth."""
    if getattr(config, "model_type", "llama") != "llama":
        from kvcache.measuring import compat

        layers = config.num_hidden_layers
        period = layer_period(config)
        if layers <= META_LAYERS or period is None:
            return compat.meta_parameters(config)
        first = period * -(-16 // period)  # past any dense first layers (DeepSeek's first_k_dense_replace)
        a, b, c = (compat.meta_parameters(at_depth(config, first + i * period)) for i in range(3))
        if b - a != c - b:
            return compat.meta_parameters(config)
        periods, rest = divmod(layers - first, period)
        tail = compat.meta_parameters(at_depth(config, first + rest)) - a if rest else 0
        return a + periods * (b - a) + tail
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q = h * config.num_attention_heads * head_dim
    kv = 2 * h * config.num_key_value_heads * head_dim
    o = config.num_attention_heads * head_dim * h
    mlp = 3 * h * config.intermediate_size
    per_layer = q + kv + o + mlp + 2 * h
    head = 0 if getattr(config, "tie_word_embeddings", False) else vocab * h
    return vocab * h + layers * per_layer + h + head


def layer_period(config: Any) -> int | None:
    """The shortest period (at most 16 layers) that ``config.layer_types`` repeats with; 1 when the config has none
    (every layer alike); None when it does not repeat."""
    types = list(getattr(config, "layer_types", None) or [])
    if not types:
        return 1
    return next((p for p in range(1, min(16, len(types)) + 1)
                 if all(t == types[i % p] for i, t in enumerate(types))), None)


def at_depth(config: Any, layers: int) -> Any:
    """A copy of ``config`` with ``layers`` decoder layers: every per-layer list (``layer_types`` and the like, one
    entry per layer) cut or repeated to that length."""
    import copy

    depth = config.num_hidden_layers
    out = copy.deepcopy(config)
    for name, value in vars(config).items():
        if isinstance(value, (list, tuple)) and len(value) == depth and depth:
            setattr(out, name, type(value)(value[i % depth] for i in range(layers)))
    out.num_hidden_layers = layers
    return out


def kv_heads_of(config: Any) -> int:
    """KV heads attention runs with: ``num_key_value_heads``; Falcon's ``multi_query`` (one) or ``num_kv_heads``."""
    declared = getattr(config, "num_key_value_heads", None)
    if declared:
        return declared
    if getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture", False):
        return 1
    return getattr(config, "num_kv_heads", None) or config.num_attention_heads


def cache_geometry(config: Any) -> tuple[int, int, int]:
    """(heads, key dim, value dim) of what one attention layer caches per token. Multi-head latent attention
    (DeepSeek-V2/V3: ``kv_lora_rank``) caches its compressed latent and rotary key as one head where this release
    does so (:func:`compat.mla_caches_latent`), else the expanded per-head K and V."""
    from kvcache.measuring import compat

    if getattr(config, "kv_lora_rank", None) and getattr(config, "qk_rope_head_dim", None):
        if compat.mla_caches_latent():
            return 1, config.kv_lora_rank, config.qk_rope_head_dim
        return config.num_attention_heads, config.qk_nope_head_dim + config.qk_rope_head_dim, config.v_head_dim
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return kv_heads_of(config), head_dim, head_dim


def layer_kv_of(config: Any, dtype_bytes: int) -> tuple[LayerKV, ...]:
    """Per decoder layer, what it caches (:class:`LayerKV`), from the layer types this release's caches read."""
    from kvcache.measuring import compat

    heads, key_dim, value_dim = cache_geometry(config)
    per_token = heads * (key_dim + value_dim) * dtype_bytes
    window = getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None)
    out = []
    for layer_type in compat.layer_types(config):
        kind = KIND_OF_LAYER_TYPE.get(layer_type, "full")
        grows = kind in ("full", "sliding")
        out.append(LayerKV(kind, per_token if grows else 0, int(window) if kind == "sliding" and window else None,
                           *((heads, key_dim, value_dim) if grows else (0, 0, 0))))
    return tuple(out)


def spec_from_config(name: str, config: Any, dtype: str, parameters: int | None = None) -> ModelSpec:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dtype_bytes = torch_dtype(dtype).itemsize
    layer_kv = layer_kv_of(config, dtype_bytes)
    uniform = all(layer.kind == "full" for layer in layer_kv) and cache_geometry(config) == (
        kv_heads_of(config), head_dim, head_dim)
    return ModelSpec(
        name=name,
        layers=config.num_hidden_layers,
        heads=config.num_attention_heads,
        kv_heads=kv_heads_of(config),
        head_dim=head_dim,
        hidden=config.hidden_size,
        vocab=config.vocab_size,
        max_position_embeddings=config.max_position_embeddings,
        dtype=dtype,
        dtype_bytes=dtype_bytes,
        parameters=parameters if parameters is not None else count_parameters(config),
        layer_kv=() if uniform else layer_kv,
    )


def load_config(name: str) -> tuple[Any, Path | None]:
    """The config of a preset, a local directory with ``config.json``, or a hub id; and where weights are
    loaded from when there are any (a directory, or the hub id). A config the suite cannot measure is a
    one-line ModelError (:func:`read_config`); so is a hub id that is not in the local Hugging Face cache
    when the hub cannot be reached (found out in seconds, not after half a minute of retries)."""
    from transformers import LlamaConfig

    check_name(name)
    if name in PRESETS:
        return LlamaConfig(**PRESETS[name]), None
    if name in FAMILY_PRESETS or LAYERS_SUFFIX.match(name):
        return preset_config(name), None
    path = Path(name).expanduser()
    if path.is_dir():
        return read_config(name, path), (path if has_weights(path) else None)
    return hub_config(name)


def check_name(name: str) -> None:
    """What :func:`load_config` accepts, checked without importing transformers: a preset (``@layers=N`` a valid
    depth), a directory or a hub id; anything else is a one-line ModelError naming the presets."""
    base, _ = split_layers(name)
    path = Path(name).expanduser()
    if base in PRESETS or base in FAMILY_PRESETS or (HUB_ID.match(name) and not path.exists()):
        return
    if not path.is_dir():
        raise ModelError(f"--kv-model {name!r} is not a preset ({', '.join(preset_names())}) "
                         "nor a directory with a config.json")
    if not (path / "config.json").is_file():
        raise ModelError(f"--kv-model {name!r}: directory has no config.json")


#: Fields of a config.json that name where and with which release it was saved, not the model: left out of its hash.
VOLATILE_CONFIG_FIELDS = ("_name_or_path", "transformers_version")


def model_key(name: str) -> str:
    """What a ``--kv-model`` value is called in a run's identity (``settings.model``, hence its baseline keys): a
    preset or a hub id as given; a local directory as its name plus the first 8 hex digits of the SHA-256 of its
    ``config.json`` (``mymodel@3f2a9c1b``), so the same model typed as a relative or an absolute path, or a moved
    checkout, keeps its identity, and a changed config gets a new one. The JSON is hashed canonically (keys sorted,
    no whitespace, without :data:`VOLATILE_CONFIG_FIELDS`); a file that is not a JSON object, by its bytes.
    Stdlib only: nothing is imported or built."""
    import hashlib

    match = LAYERS_SUFFIX.match(name)
    base = match["base"] if match else name
    if base in PRESETS or base in FAMILY_PRESETS:
        return name
    path = Path(name).expanduser()
    file = path / "config.json"
    try:
        data = file.read_bytes()
    except OSError:
        return name  # a hub id (or nothing the run can load: refused before it runs)
    try:
        raw = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raw = None
    if isinstance(raw, dict):
        raw = {k: v for k, v in raw.items() if k not in VOLATILE_CONFIG_FIELDS}
        data = json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()
    return f"{path.resolve().name or path.resolve()}@{hashlib.sha256(data).hexdigest()[:8]}"


def preset_names() -> list[str]:
    return [*PRESETS, *FAMILY_PRESETS]


def split_layers(name: str) -> tuple[str, int | None]:
    """``"gemma3-270m@layers=6"`` -> ``("gemma3-270m", 6)``; a plain name -> ``(name, None)``. A depth that is not
    a positive multiple of the preset's layer pattern, or ``@layers`` on something not a preset, is a one-line
    ModelError naming the value and the accepted ones."""
    match = LAYERS_SUFFIX.match(name)
    if not match:
        return name, None
    base, text = match["base"], match["n"]
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


def preset_config(name: str) -> Any:
    """The config of a preset, at ``@layers=N`` when given (the layer pattern repeated to N layers)."""
    from transformers import CONFIG_MAPPING, LlamaConfig

    base, layers = split_layers(name)
    if base in PRESETS:
        values = dict(PRESETS[base])
        if layers is not None:
            values["num_hidden_layers"] = layers
        return LlamaConfig(**values)
    preset = FAMILY_PRESETS[base]
    values = dict(preset.config)
    if layers is not None:
        values["num_hidden_layers"] = layers
    if preset.period:
        values["layer_types"] = [preset.period[i % preset.pattern] for i in range(values["num_hidden_layers"])]
    if preset.model_type not in CONFIG_MAPPING:
        raise ModelError(f"--kv-model {name!r}: model_type {preset.model_type!r} {ABSENT_ARCHITECTURE}")
    return CONFIG_MAPPING[preset.model_type](**values)


#: The end of the one-line error of a preset whose architecture the installed release lacks (scripts/versions.py
#: reads it in a run's log to list the release as skipped, not failed).
ABSENT_ARCHITECTURE = "is not in this transformers release"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name
REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                   "max_position_embeddings")  # what spec_from_config derives the geometry from
HUB_TIMEOUT_S = 2.0


def has_weights(directory: Path) -> bool:
    return any(directory.glob("*.safetensors")) or any(directory.glob("pytorch_model*.bin"))


def read_config(name: str, directory: Path) -> Any:
    """The config in ``directory/config.json``, or a one-line ModelError naming the file and what is wrong."""
    from transformers import CONFIG_MAPPING, AutoConfig, __version__

    file = directory / "config.json"
    where = f"--kv-model {name!r}: {file}"
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{where} cannot be read ({_one_line(exc)})") from None
    if not text.strip():
        raise ModelError(f"{where} is empty")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{where} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{where}: the top level is a {type(raw).__name__}, expected an object")
    kind = raw.get("model_type")
    if not kind or not isinstance(kind, str):
        raise ModelError(f"{where} has no model_type (a decoder-only model's, e.g. \"llama\")")
    if kind not in CONFIG_MAPPING:
        raise ModelError(f"{where}: model_type {kind!r} is not known to transformers {__version__}")
    try:
        config = AutoConfig.from_pretrained(str(directory))
    except Exception as exc:  # noqa: BLE001 - whatever transformers refuses is a usage error here
        raise ModelError(f"{where} cannot be loaded ({type(exc).__name__}: {_one_line(exc)})") from None
    problem = config_problem(config, raw)
    if problem:
        raise ModelError(f"{where}: {problem}")
    return config


def config_problem(config: Any, raw: dict[str, Any] | None = None) -> str | None:
    """Why ``config`` cannot be measured here, or None. The suite needs a decoder-only causal LM with a KV
    cache, and the fields its geometry is derived from: ``raw`` (config.json as written) must name them, as
    transformers would silently fill in its own defaults (another model's geometry)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = config.model_type
    not_ours = "not a decoder-only causal LM with a KV cache"
    if getattr(config, "is_encoder_decoder", False):
        return f"model_type {kind!r} is an encoder-decoder model, {not_ours}"
    if kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        return f"model_type {kind!r} is an encoder (is_decoder is not set), {not_ours}"
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return f"model_type {kind!r} has no causal-LM class in transformers, {not_ours}"
    if raw is not None:
        aliases = getattr(type(config), "attribute_map", None) or {}
        missing = [f for f in REQUIRED_FIELDS if f not in raw and aliases.get(f) not in raw]
        if missing:
            return f"lacks {', '.join(missing)} (the geometry of its KV cache is derived from them)"
    for field in (*REQUIRED_FIELDS, "num_key_value_heads", "head_dim"):
        value = getattr(config, field, None)
        if field in REQUIRED_FIELDS or value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return f"{field} is {value!r}, expected a positive whole number"
    return None


def hub_config(name: str) -> tuple[Any, Path]:
    """A hub id's config: from the local Hugging Face cache when it is there (no network), else downloaded
    once the hub is known to answer. Weights: the cached snapshot when it has them, else the hub id."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    label = f"--kv-model {name!r}: not a preset ({', '.join(PRESETS)}), not a local directory"
    try:
        cached = try_to_load_from_cache(name, "config.json")
    except Exception as exc:  # noqa: BLE001 - an id huggingface_hub refuses (HFValidationError)
        raise ModelError(f"{label}, and not a hub id ({_one_line(exc)})") from None
    if isinstance(cached, str):
        snapshot = Path(cached).parent
        config = read_config(name, snapshot)
        if has_weights(snapshot):
            return config, snapshot
        problem = hub_unreachable()
        if problem:
            raise ModelError(f"--kv-model {name!r}: its config is in the local Hugging Face cache but not its "
                             f"weights, and {problem}")
        return config, Path(name)
    problem = hub_unreachable()
    if problem:
        raise ModelError(f"{label}, not in the local Hugging Face cache, and {problem}")
    try:
        file = hf_hub_download(name, "config.json")
    except Exception as exc:  # noqa: BLE001 - any loading failure is a usage error here
        raise ModelError(f"{label}, and not loadable from the hub ({type(exc).__name__})") from None
    return read_config(name, Path(file).parent), Path(name)


def hub_unreachable(timeout: float = HUB_TIMEOUT_S) -> str | None:
    """Why the hub cannot be asked now (HF_HUB_OFFLINE, or no answer within ``timeout`` seconds), or None.
    One request, no retries; in a thread, so that a slow name lookup is bounded as well."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    outcome: list[BaseException | None] = []

    def ask() -> None:
        try:
            get_session().head(constants.ENDPOINT, timeout=timeout)  # any answer will do
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - every failure means the same here
            outcome.append(exc)

    thread = threading.Thread(target=ask, name="kvcache-hub-check", daemon=True)
    thread.start()
    thread.join(timeout + 1)
    if not outcome:
        return f"the hub at {constants.ENDPOINT} cannot be reached (no answer within {timeout:g} s)"
    if outcome[0] is not None:
        return (f"the hub at {constants.ENDPOINT} cannot be reached ({_one_line(outcome[0])}; asked once, "
                f"no answer within {timeout:g} s)")
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(getattr(exc, "strerror", None) or exc).split())[:200] or type(exc).__name__


def build_model(name: str, device: Any, dtype: str, seed: int = 0) -> tuple[Any, ModelSpec]:
    """The model in eval mode on ``device`` in ``dtype`` (random weights seeded by ``seed`` unless a
    checkpoint has weights), and its :class:`ModelSpec`."""
    import torch

    from kvcache.measuring import compat

    config, weights = load_config(name)
    tdtype = torch_dtype(dtype)
    if weights is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(weights), attn_implementation="sdpa", **{compat.dtype_keyword(): tdtype})
    else:
        torch.manual_seed(seed)
        family = split_layers(name)[0] in FAMILY_PRESETS  # large: built in the dtype, not float32 then cast
        model = compat.from_config(config, dtype=tdtype if family else None)
    model = model.to(device=device, dtype=tdtype).eval()
    model.requires_grad_(False)
    return model, spec_from_config(name, model.config, dtype, parameters=distinct_parameters(model))


def distinct_parameters(model: Any) -> int:
    """Parameters the model holds, each storage once (tied embeddings are one matrix): what one read of
    every weight moves is this × the dtype's bytes."""
    return sum({p.untyped_storage().data_ptr(): p.numel() for p in model.parameters()}.values())
