"""Reading a model's config: a preset's (:mod:`kvcache.analysing.presets`), a local directory's ``config.json``, or
a hub id's (from the local Hugging Face cache, else downloaded once the hub answers). Whatever the suite cannot
measure is a one-line :class:`~kvcache.analysing.presets.ModelError`.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from kvcache.analysing.presets import (
    ABSENT_ARCHITECTURE,
    ARCH_PREFIX,
    FAMILY_PRESETS,
    PRESETS,
    ModelError,
    check_name,
    preset_names,
    split_layers,
)

REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                   "max_position_embeddings")  # what geometry.spec_from_config derives the geometry from
HUB_TIMEOUT_S = 2.0  # seconds the hub has to answer before a hub id not in the local cache is refused


def load_config(name: str) -> tuple[Any, Path | None]:
    """The config of a preset, a local directory with ``config.json``, or a hub id; and where weights are
    loaded from when there are any (a directory, or the hub id). A config the suite cannot measure is a
    one-line ModelError (:func:`read_config`); so is a hub id that is not in the local Hugging Face cache
    when the hub cannot be reached (found out in seconds, not after half a minute of retries)."""
    check_name(name)
    if name.startswith(ARCH_PREFIX):
        from kvcache.measuring.architectures import arch_config

        return arch_config(name).config, None
    if split_layers(name)[0] in preset_names():
        return preset_config(name), None
    path = Path(name).expanduser()
    if path.is_dir():
        return read_config(name, path), (path if has_weights(path) else None)
    return hub_config(name)


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


def has_weights(directory: Path) -> bool:
    """Whether ``directory`` holds weights (``*.safetensors`` or ``pytorch_model*.bin``)."""
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
