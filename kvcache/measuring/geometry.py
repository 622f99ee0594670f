"""A model's geometry: what each decoder layer caches per token (:class:`LayerKV`) and what the whole model moves
(:class:`ModelSpec`: KV-cache bytes per token and per context, weight bytes), read from a Transformers config.
Sizes are in bytes for the chosen dtype; contexts and windows in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcache.analysing.presets import DTYPES, ModelError
from kvcache.measuring.cachespec import LAYER_KINDS


def torch_dtype(name: str) -> Any:
    """The torch dtype a ``--kv-dtype`` name (one of :data:`DTYPES`) stands for; a one-line ModelError otherwise."""
    import torch

    if name not in DTYPES:
        raise ModelError(f"--kv-dtype {name!r} is not one of {', '.join(DTYPES)}")
    return getattr(torch, name)


#: The kind of layer (full, sliding, linear; none: caches nothing) each cache layer type of a config stands for.
KIND_OF_LAYER_TYPE = {
    "full_attention": "full", "hybrid": "full", "indexed_attention": "full",
    "sliding_attention": "sliding", "chunked_attention": "sliding", "hybrid_sliding": "sliding",
    "linear_attention": "linear", "conv": "linear", "dummy": "none",
}
KINDS = LAYER_KINDS  # the kinds passes are reported for ("none": a layer that caches nothing)


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
    attention: str | None = None  # arch: models, the attention implementation the architecture runs by default
    changes: tuple[str, ...] = ()  # arch: models, what differs from the type's default config

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
        """The sliding windows (tokens) of the layers that cache K/V, each once, smallest first."""
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
        """The record's ``model`` section: geometry, sizes in bytes, ``kinds`` when layers differ."""
        return {
            "name": self.name, "layers": self.layers, "heads": self.heads, "kv_heads": self.kv_heads,
            "head_dim": self.head_dim, "hidden": self.hidden, "vocab": self.vocab, "dtype": self.dtype,
            "bytes_per_token": self.bytes_per_token, "weight_bytes": self.weight_bytes,
            "parameters": self.parameters, "max_position_embeddings": self.max_position_embeddings,
            **({"kinds": self.kinds_dict()} if self.mixed else {}),
            **({"attention": self.attention} if self.attention else {}),
            **({"changes": list(self.changes)} if self.changes else {}),
        }


#: Deeper than this, a non-Llama config's parameters are counted on the meta device at a few shallow depths of the
#: same layer pattern and extrapolated (building every layer costs time, even on the meta device).
META_LAYERS = 256


def count_parameters(config: Any) -> int:
    """Parameters of a Llama-style decoder from its config (embeddings, attention, MLP, norms, head); any other
    family's model is built on the meta device (nothing allocated) and its parameters counted, tied weights once.
    Deeper than :data:`META_LAYERS` with a repeating layer pattern, it is counted at three shallow depths that
    differ by one period of the pattern and extrapolated (parameters grow by the same amount each period); a
    config whose count does not grow that way is built at its full depth."""
    if getattr(config, "model_type", "llama") != "llama":
        from kvcache.measuring import compat

        if text_config(config) is not config:  # a nested (multimodal) config: built whole, at its depth
            return compat.meta_parameters(config)
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
    return kv_heads_of(config), head_dim, getattr(config, "v_head_dim", None) or head_dim


def sliding_geometry(config: Any, full: tuple[int, int, int]) -> tuple[int, int, int]:
    """(heads, key dim, value dim) a sliding layer caches: its own ``swa_num_key_value_heads`` and ``swa_head_dim``
    where the config names them (Inkling), else ``full``'s."""
    heads = getattr(config, "swa_num_key_value_heads", None) or full[0]
    dim = getattr(config, "swa_head_dim", None)
    return (heads, dim, dim) if dim else (heads, *full[1:])


def layer_kv_of(config: Any, dtype_bytes: int) -> tuple[LayerKV, ...]:
    """Per decoder layer, what it caches (:class:`LayerKV`), from the layer types this release's caches read."""
    from kvcache.measuring import compat

    window = getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None)
    layers = layer_configs(config)
    out = []
    for index, layer_type in enumerate(compat.layer_types(config)):
        kind = KIND_OF_LAYER_TYPE.get(layer_type, "full")
        heads, key_dim, value_dim = cache_geometry(layers[index % len(layers)])
        if kind == "sliding":
            heads, key_dim, value_dim = sliding_geometry(config, (heads, key_dim, value_dim))
        per_token = heads * (key_dim + value_dim) * dtype_bytes
        grows = kind in ("full", "sliding")
        out.append(LayerKV(kind, per_token if grows else 0, int(window) if kind == "sliding" and window else None,
                           *((heads, key_dim, value_dim) if grows else (0, 0, 0))))
    return tuple(out)


def per_layer_overrides(config: Any) -> dict[int, dict[str, Any]] | None:
    """A heterogeneous config's per-layer overrides (``{layer: {attribute: value}}``, Transformers' per-layer
    configs: Gemma 4's larger head_dim on its full-attention layers); None for a homogeneous config."""
    import copy

    spec = vars(config).get("_heterogeneity_spec")
    return None if spec is None else copy.deepcopy(dict(spec.per_layer_overrides))


def layer_configs(config: Any) -> list[Any]:
    """Per decoder layer, the config it is built from: a heterogeneous config's per-layer view, else ``config``
    itself (one entry)."""
    if per_layer_overrides(config) is None:
        return [config]
    return [config.per_layer_config[i] for i in range(config.num_hidden_layers)]


def text_config(config: Any) -> Any:
    """The decoder's config inside ``config`` (itself where it is not nested): ``get_text_config(decoder=True)``, or
    what a release without the keyword (or the method) has."""
    reader = getattr(config, "get_text_config", None)
    if reader is None:
        return config
    try:
        return reader(decoder=True)
    except TypeError:
        return reader()


def spec_from_config(name: str, config: Any, dtype: str, parameters: int | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of ``config`` in ``dtype`` (a :data:`~kvcache.analysing.presets.DTYPES` name), called
    ``name``; ``parameters`` counted from the config (:func:`count_parameters`) unless given. The geometry of a
    nested config (a multimodal model's) is its decoder's."""
    whole, config = config, text_config(config)
    layer_kv = layer_kv_of(config, dtype_bytes := torch_dtype(dtype).itemsize)
    config = layer_configs(config)[0]  # a heterogeneous config: its global figures are its first layer's
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    uniform = all(layer.kind == "full" and (layer.heads, layer.key_dim, layer.value_dim) == (
        kv_heads_of(config), head_dim, head_dim) for layer in layer_kv)
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
        parameters=parameters if parameters is not None else count_parameters(whole),
        layer_kv=() if uniform else layer_kv,
    )
