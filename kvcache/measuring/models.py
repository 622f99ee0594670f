"""Building the model a run measures: its config (:mod:`kvcache.measuring.configs`), random weights seeded unless a
checkpoint has weights, in eval mode on the device and dtype asked for; and its geometry
(:class:`~kvcache.measuring.geometry.ModelSpec`).
"""

from __future__ import annotations

from typing import Any

from kvcache.analysing.presets import ARCH_PREFIX, FAMILY_PRESETS, split_layers
from kvcache.measuring.configs import load_config
from kvcache.measuring.geometry import ModelSpec, spec_from_config, torch_dtype


def build_model(name: str, device: Any, dtype: str, seed: int = 0) -> tuple[Any, ModelSpec]:
    """The model in eval mode on ``device`` in ``dtype`` (random weights seeded by ``seed`` unless a
    checkpoint has weights), and its :class:`ModelSpec`."""
    import torch

    from kvcache.measuring import compat

    if name.startswith(ARCH_PREFIX):
        from kvcache.measuring.architectures import build_arch

        return build_arch(name, device, dtype, distinct_parameters, seed)
    config, weights = load_config(name)
    tdtype = torch_dtype(dtype)
    if weights is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(weights), attn_implementation="sdpa", **{compat.dtype_keyword(): tdtype})
    else:
        torch.manual_seed(seed)
        model = compat.from_config(config, dtype=tdtype if built_in_dtype(name, weights) else None)
    model = model.to(device=device, dtype=tdtype).eval()
    model.requires_grad_(False)
    return model, spec_from_config(name, model.config, dtype, parameters=distinct_parameters(model))


def distinct_parameters(model: Any) -> int:
    """Parameters the model holds, each storage once (tied embeddings are one matrix): what one read of
    every weight moves is this × the dtype's bytes."""
    return sum({p.untyped_storage().data_ptr(): p.numel() for p in model.parameters()}.values())


def built_in_dtype(name: str, weights: Any) -> bool:
    """Whether the model ``name`` is built directly in the run's dtype: a checkpoint with ``weights``, or a family
    preset (large); a Llama-geometry preset is built in float32 and then cast."""
    return weights is not None or split_layers(name)[0] in FAMILY_PRESETS
