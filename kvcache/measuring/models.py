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
from dataclasses import dataclass, replace
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
    """The config of a preset, a local directory with ``config.json``, or a hub id; and where weights are
    loaded from when there are any (a directory, or the hub id). A config the suite cannot measure is a
    one-line ModelError (:func:`read_config`); so is a hub id that is not in the local Hugging Face cache
    when the hub cannot be reached (found out in seconds, not after half a minute of retries)."""
    from transformers import LlamaConfig

    if name in PRESETS:
        return LlamaConfig(**PRESETS[name]), None
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"--kv-model {name!r}: directory has no config.json")
        return read_config(name, path), (path if has_weights(path) else None)
    if HUB_ID.match(name) and not path.exists():
        return hub_config(name)
    raise ModelError(f"--kv-model {name!r} is not a preset ({', '.join(PRESETS)}) "
                     "nor a directory with a config.json")


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
        model = compat.from_config(config)
    model = model.to(device=device, dtype=tdtype).eval()
    model.requires_grad_(False)
    spec = spec_from_config(name, model.config, dtype)
    return model, replace(spec, parameters=distinct_parameters(model))


def distinct_parameters(model: Any) -> int:
    """Parameters the model holds, each storage once (tied embeddings are one matrix): what one read of
    every weight moves is this × the dtype's bytes."""
    return sum({p.untyped_storage().data_ptr(): p.numel() for p in model.parameters()}.values())
