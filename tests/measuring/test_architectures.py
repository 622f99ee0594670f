"""``--kv-model arch:<model_type>`` (issue 47): any decoder-only causal-LM type of the installed release, built small
from its own config class. Counted passes per cached byte must not depend on the shrink: the same at two depths
(one and two periods of the layer pattern) and two widths, for a GQA, an MQA, a sliding-window hybrid and a
multi-head-latent architecture. Tiny counted contexts keep it to seconds."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.analysing.presets import ModelError, check_name  # noqa: E402
from kvcache.analysing.records.identity import model_key  # noqa: E402
from kvcache.analysing.settings import Settings  # noqa: E402
from kvcache.measuring import architectures, configs  # noqa: E402
from kvcache.measuring.devices import Device  # noqa: E402
from kvcache.measuring.session import KVSession  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ORIGINAL = architectures.arch_config

#: model type: what it stands for (GQA, MQA, sliding-window hybrid, multi-head latent)
SHRINK_CASES = {"llama": "MHA", "mistral": "GQA", "gpt_bigcode": "MQA", "gemma3_text": "sliding-window hybrid",
                "deepseek_v2": "MLA", "gemma4_text": "per-layer head_dim (a heterogeneous config)"}


def counted(name: str, monkeypatch, width: int = 1, cache: str = "dynamic") -> tuple[float, dict[str, float]]:
    """(passes, by_op) of one counted step of ``name`` built at ``width``."""
    monkeypatch.setattr(architectures, "arch_config", functools.partial(ORIGINAL, width=width))
    settings = Settings(model=name, device="cpu", dtype="float32", caches=(cache,), counted_contexts=(8, 16))
    kv = KVSession(settings, Device.from_choice("cpu"))
    result = kv.count(cache)
    return result.passes, dict(result.by_op)


@pytest.mark.parametrize("kind", list(SHRINK_CASES))
def test_passes_do_not_depend_on_the_shrink(kind, monkeypatch):
    period = architectures.pattern_period(architectures.text_config(architectures.arch_model(kind).config))
    base = max(2, period)
    passes, by_op = counted(f"arch:{kind}", monkeypatch)
    deeper, _ = counted(f"arch:{kind}@layers={2 * base}", monkeypatch)
    wider, _ = counted(f"arch:{kind}", monkeypatch, width=2)
    assert passes > 0.9, (kind, passes, by_op)
    assert deeper == pytest.approx(passes, abs=0.02), (kind, "depth", passes, deeper)
    assert wider == pytest.approx(passes, abs=0.02), (kind, "width", passes, wider)


def test_arch_keeps_what_decides_the_bytes_per_token():
    llama = architectures.arch_model("llama").config
    assert (llama.head_dim, llama.num_attention_heads // llama.num_key_value_heads) == (128, 1)
    mqa = architectures.arch_model("gpt_bigcode").config
    assert mqa.multi_query and mqa.hidden_size // mqa.num_attention_heads == 64
    gemma = architectures.arch_model("gemma3_text").config
    assert gemma.num_hidden_layers == 6 and gemma.layer_types.count("sliding_attention") == 5
    assert gemma.sliding_window == 4096 and gemma.head_dim == 256
    mla = architectures.arch_model("deepseek_v3")
    assert (mla.config.kv_lora_rank, mla.config.qk_rope_head_dim, mla.config.num_attention_heads) == (512, 64, 128)
    assert any(change.startswith("vocab ") for change in mla.changes)


def test_per_layer_configs_keep_each_layers_geometry():
    from kvcache.measuring.geometry import spec_from_config

    built = architectures.arch_model("gemma4_text", layers=12)
    config = built.config
    assert [config.per_layer_config[i].head_dim for i in (0, 5, 6, 11)] == [256, 512, 256, 512]
    shapes = spec_from_config("arch:gemma4_text", config, "float32", parameters=0).cached_shapes()
    assert [shape[1] for shape in shapes] == [256] * 5 + [512] + [256] * 5 + [512]
    assert any(change.startswith("per-layer head_dim kept on layers 5, 11") for change in built.changes)


@pytest.mark.parametrize("kind, words", [
    ("nemotron", "num_key_value_heads unset->"), ("lfm2_moe", "layer_types unset->full_attention"),
    ("cohere_compass_text", "rope_parameters empty->default rotary"), ("inkling_text", "swa_heads 64->8")])
def test_defaults_that_do_not_build_are_fixed_and_said(kind, words):
    assert any(change.startswith(words) for change in architectures.arch_model(kind).changes), kind


def test_a_per_layer_head_count_is_refused_in_one_line():
    with pytest.raises(ModelError, match="per-layer .*num_attention_heads"):
        architectures.arch_model("dots3_note_text")


def test_llama_counts_three_passes_and_names_its_attention(monkeypatch):
    passes, by_op = counted("arch:llama", monkeypatch)
    assert passes == pytest.approx(3.0, abs=0.01) and set(by_op) == {"cat", "scaled_dot_product_attention"}


@pytest.mark.parametrize("name, words", [
    ("arch:nosuch", "not a causal-LM model type of transformers"),
    ("arch:bert", "is an encoder"),
    ("arch:bart", "is an encoder-decoder model"),
])
def test_bad_types_are_one_line_errors_naming_the_list(name, words):
    with pytest.raises(ModelError) as caught:
        configs.load_config(name)
    message = str(caught.value)
    assert words in message and "kvcache architectures --list" in message and "\n" not in message


def test_arch_names_without_transformers():
    check_name("arch:llama")
    check_name("arch:gemma3_text@layers=12")
    for bad in ("arch:", "arch:Llama!", "arch:llama@layers=0"):
        with pytest.raises(ModelError):
            check_name(bad)
    assert model_key("arch:jetmoe") == "arch:jetmoe"  # baselines keyed by the architecture
