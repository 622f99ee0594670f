"""Model presets and their geometry: the bytes one token adds to the KV cache and the bytes of weights.

The default is SmolLM2-135M's geometry as a ``LlamaForCausalLM`` with random weights (seeded, built
offline): random weights move the same bytes as trained ones. ``tiny`` keeps the head geometry with 2
layers for fast CI; ``smollm2-135m-mha`` has as many KV heads as query heads (nothing to expand).
A local directory with a ``config.json`` (weights loaded when present) or a hub id also works.
"""

from __future__ import annotations

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

    @property
    def bytes_per_token(self) -> int:
        """KV-cache bytes one token adds: K and V, every layer, every KV head."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of all parameters (tied embeddings counted once)."""
        return self.parameters * self.dtype_bytes

    def kv_bytes(self, tokens: float) -> float:
        return self.bytes_per_token * tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "layers": self.layers, "heads": self.heads, "kv_heads": self.kv_heads,
            "head_dim": self.head_dim, "hidden": self.hidden, "vocab": self.vocab, "dtype": self.dtype,
            "bytes_per_token": self.bytes_per_token, "weight_bytes": self.weight_bytes,
            "parameters": self.parameters, "max_position_embeddings": self.max_position_embeddings,
        }


def torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise ModelError(f"--kv-dtype {name!r} is not one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def count_parameters(config: Any) -> int:
    """Parameters of a Llama-style decoder from its config (embeddings, attention, MLP, norms, head)."""
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q = h * config.num_attention_heads * head_dim
    kv = 2 * h * config.num_key_value_heads * head_dim
    o = config.num_attention_heads * head_dim * h
    mlp = 3 * h * config.intermediate_size
    per_layer = q + kv + o + mlp + 2 * h
    head = 0 if getattr(config, "tie_word_embeddings", False) else vocab * h
    return vocab * h + layers * per_layer + h + head


def spec_from_config(name: str, config: Any, dtype: str) -> ModelSpec:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return ModelSpec(
        name=name,
        layers=config.num_hidden_layers,
        heads=config.num_attention_heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_dim=head_dim,
        hidden=config.hidden_size,
        vocab=config.vocab_size,
        max_position_embeddings=config.max_position_embeddings,
        dtype=dtype,
        dtype_bytes=torch_dtype(dtype).itemsize,
        parameters=count_parameters(config),
    )


def load_config(name: str) -> tuple[Any, Path | None]:
    """The config of a preset, a local directory with ``config.json``, or a hub id; and the directory
    holding weights when there is one."""
    from transformers import AutoConfig, LlamaConfig

    if name in PRESETS:
        return LlamaConfig(**PRESETS[name]), None
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"--kv-model {name!r}: directory has no config.json")
        has_weights = any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))
        return AutoConfig.from_pretrained(str(path)), (path if has_weights else None)
    if "/" in name and not path.exists():
        try:  # a hub id: the same loading code, where the machine has network
            config = AutoConfig.from_pretrained(name)
        except Exception as exc:  # noqa: BLE001 - any loading failure is a usage error here
            raise ModelError(f"--kv-model {name!r}: not a preset ({', '.join(PRESETS)}), not a local directory, "
                             f"and not loadable from the hub ({type(exc).__name__})") from None
        return config, Path(name)
    raise ModelError(f"--kv-model {name!r} is not a preset ({', '.join(PRESETS)}) "
                     "nor a directory with a config.json")


def build_model(name: str, device: Any, dtype: str, seed: int = 0) -> tuple[Any, ModelSpec]:
    """The model in eval mode on ``device`` in ``dtype`` (random weights seeded by ``seed`` unless a
    checkpoint has weights), and its :class:`ModelSpec`."""
    import torch

    from kvcache import compat

    config, weights = load_config(name)
    tdtype = torch_dtype(dtype)
    if weights is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(weights), attn_implementation="sdpa", **{compat.dtype_keyword(): tdtype})
    else:
        torch.manual_seed(seed)
        model = compat.from_config(config)
    model = model.to(device=device, dtype=tdtype).eval()
    model.requires_grad_(False)
    return model, spec_from_config(name, model.config, dtype)
