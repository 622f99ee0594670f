"""Model families (issue 14): presets and their ``@layers=N`` rule, the logical KV bytes a cache holds per layer kind
(sliding windows, linear-attention state, a latent), counted passes per layer kind, and a user's own config
directory of each family through ``--kv-model PATH``. The small configs here keep each family's layer structure
(pattern, window, latent, linear layers) with few dimensions, so that the counts run in seconds."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.analysing import presets  # noqa: E402
from kvcache.analysing.settings import Settings  # noqa: E402
from kvcache.commands.traffic import kind_lines  # noqa: E402
from kvcache.measuring import compat, configs, geometry  # noqa: E402
from kvcache.measuring.devices import Device  # noqa: E402
from kvcache.measuring.session import KVSession, Skipped  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = dict(hidden_size=64, intermediate_size=128, vocab_size=256, max_position_embeddings=4096)
# One config.json per family, as a user would have it: the family's structure at small dimensions.
CONFIGS = {
    "gemma3_text": dict(SMALL, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                        sliding_window=32, query_pre_attn_scalar=32,
                        layer_types=["sliding_attention"] * 5 + ["full_attention"]),
    "mistral": dict(SMALL, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    sliding_window=32),
    "qwen3_next": dict(SMALL, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                       linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                       layer_types=["linear_attention"] * 3 + ["full_attention"]),
    "deepseek_v2": dict(SMALL, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None,
                        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                        first_k_dense_replace=1),
}


def config_dir(tmp_path, model_type: str):
    directory = tmp_path / model_type
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": model_type, **CONFIGS[model_type]}))
    return str(directory)


def session(model: str, caches=("dynamic",), counted=(8, 16)) -> KVSession:
    settings = Settings(model=model, device="cpu", dtype="bfloat16", caches=tuple(caches), counted_contexts=counted)
    return KVSession(settings, Device.from_choice("cpu"))


# --- presets and @layers=N ------------------------------------------------------------------------------------

def test_default_model_geometry_unchanged():
    """SmolLM2's bytes per token and KV bytes are what the committed baselines were measured against."""
    spec = geometry.spec_from_config("smollm2-135m", configs.load_config("smollm2-135m")[0], "bfloat16")
    assert spec.bytes_per_token == 23040 and spec.kv_bytes(1000) == 23040 * 1000
    assert not spec.mixed and "kinds" not in spec.to_dict()


@pytest.mark.parametrize("name", list(presets.FAMILY_PRESETS))
def test_every_preset_config_builds(name):
    config, weights = configs.load_config(name)
    spec = geometry.spec_from_config(name, config, "bfloat16")
    assert weights is None and spec.bytes_per_token > 0 and spec.layers == presets.FAMILY_PRESETS[name].config[
        "num_hidden_layers"]


def test_family_presets_and_checkpoints_are_built_in_their_dtype(tmp_path):
    """One rule (models.built_in_dtype) for building (models.build_model) and for the memory check before it
    (preflight): a family preset or a checkpoint with weights is built in the run's dtype, a Llama preset in
    float32 and then cast."""
    from kvcache.measuring import models

    assert models.built_in_dtype("gemma3-270m@layers=6", None) and models.built_in_dtype("tiny", tmp_path)
    assert not models.built_in_dtype("tiny", None) and not models.built_in_dtype("smollm2-135m@layers=4", None)


def test_held_bytes_per_kind_of_gemma3():
    """Gemma-3-270M: 15 sliding layers stop at their 512-token window, 3 full layers keep growing."""
    spec = geometry.spec_from_config("gemma3-270m", configs.load_config("gemma3-270m")[0], "bfloat16")
    per_layer = 1 * (256 + 256) * 2
    assert spec.kinds_dict() == {"full": {"layers": 3, "bytes_per_token": 3 * per_layer, "window": None},
                                 "sliding": {"layers": 15, "bytes_per_token": 15 * per_layer, "window": 512}}
    assert spec.kv_bytes(256) == 18 * per_layer * 256
    assert spec.kv_bytes(4096) == 3 * per_layer * 4096 + 15 * per_layer * 512
    assert spec.counted_contexts((256, 512)) == (128, 256)  # below the window, where every kind grows
    assert spec.beyond_windows((128, 256)) == (1024, 1536)


def test_layers_override_keeps_the_pattern():
    config, _ = configs.load_config("gemma3-270m@layers=12")
    assert config.num_hidden_layers == 12 and compat.layer_types(config).count("full_attention") == 2


@pytest.mark.parametrize("name, accepted", [
    ("gemma3-270m@layers=4",
     "layers 4 is not a positive multiple of 6 (gemma3-270m's layer pattern: 5 sliding : 1 full)"),
    ("qwen3-next-80b-a3b@layers=0", "multiple of 4"),
    ("gemma3-270m@layers=six", "layers 'six' is not a whole number"),
    ("no-such-model@layers=2", "@layers=N applies to presets only"),
])
def test_bad_layers_is_one_line(name, accepted):
    with pytest.raises(presets.ModelError) as info:
        configs.load_config(name)
    message = str(info.value)
    assert accepted in message and "\n" not in message and repr(name) in message


# --- counted passes per kind, from a user's own config directory --------------------------------------------------

def test_sliding_layers_stop_growing_past_the_window(tmp_path):
    """Gemma-3 structure: sliding and full layers grow alike below the window (DynamicCache: cat 2 + attention 1);
    past it the sliding layers' bytes per step stay the same and the suite says so; the full layers keep growing."""
    kv = session(config_dir(tmp_path, "gemma3_text"), counted=(8, 16))
    result = kv.count("dynamic")
    kinds = result.kinds
    assert kinds["full"].passes == pytest.approx(3.0, abs=0.01)
    assert kinds["sliding"].passes == pytest.approx(3.0, abs=0.01)
    assert kinds["sliding"].beyond.growth_bytes == 0 and kinds["sliding"].stops_growing_at == 32
    assert kinds["full"].beyond.growth_bytes > 0
    assert any("stops growing past its window" in line for line in kind_lines(result))


def test_memory_per_layer_kind(tmp_path):
    """Gemma-3 structure, below every window: DynamicCache's ``cat`` allocates each layer's whole K/V anew and the
    layer then holds exactly it, in sliding and full layers alike (1.00 each, per KV byte of that kind); StaticCache
    allocates nothing that grows and holds its buffers (held 1.00). A linear-attention state grows by nothing."""
    kv = session(config_dir(tmp_path, "gemma3_text"), caches=("dynamic", "static"), counted=(8, 16))
    kv.count("dynamic")
    kv.count("static")
    dynamic, static = kv.memories["dynamic"].kinds, kv.memories["static"].kinds
    for kind in ("sliding", "full"):
        assert dynamic[kind].allocated_passes == pytest.approx(1.0, abs=0.01)
        assert dynamic[kind].held_passes == pytest.approx(1.0, abs=0.01)
        assert static[kind].allocated_passes == pytest.approx(0.0, abs=0.01)
        assert static[kind].held_passes == pytest.approx(1.0, abs=0.01)
    assert dynamic["sliding"].layers + dynamic["full"].layers == kv.spec().layers
    linear = session(config_dir(tmp_path, "qwen3_next"))
    linear.count("dynamic")
    state = linear.memories["dynamic"].kinds["linear"]
    assert state.held_passes is None and state.held_growth_bytes == 0


def test_all_sliding_model_stops_growing(tmp_path):
    kv = session(config_dir(tmp_path, "mistral"))
    result = kv.count("static")
    steps = list(result.beyond.step_bytes.values())
    assert steps[0] == steps[1] and result.kinds["sliding"].passes == pytest.approx(1.0, abs=0.02)


def test_linear_hybrid_only_full_layers_grow(tmp_path):
    kv = session(config_dir(tmp_path, "qwen3_next"))
    result = kv.count("dynamic")
    linear, full = result.kinds["linear"], result.kinds["full"]
    assert linear.grows is False and linear.passes is None and linear.growth_bytes == 0
    assert full.passes == pytest.approx(3.0, abs=0.01) and result.passes == pytest.approx(3.0, abs=0.01)


def layer_bytes(layer) -> int:
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    return 0 if keys is None else (keys.numel() + values.numel()) * keys.element_size()


def test_held_bytes_are_what_the_cache_stores(tmp_path):
    """The logical KV bytes of the spec (per layer: its heads and dims, a window, a latent) are the bytes a
    DynamicCache actually stores after the fill and one step, for every family."""
    for model_type in CONFIGS:
        kv = session(config_dir(tmp_path, model_type))
        dp = kv.open("dynamic", 16, warmup=1, steps=1)
        spec = kv.spec()
        held = [layer_bytes(layer) for layer in dp.cache.layers]
        expected = [layer.bytes_per_token * layer.held_tokens(dp.position) for layer in spec.layer_kv] or [
            spec.bytes_per_token // spec.layers * dp.position] * spec.layers
        assert held == expected, model_type  # linear layers hold a state of fixed size, not K/V


def test_latent_attention_counts_its_expansion(tmp_path):
    """DeepSeek-V2's cache holds the compressed latent; every step expands all of it again (per-op breakdown)."""
    kv = session(config_dir(tmp_path, "deepseek_v2"))
    result = kv.count("dynamic")
    assert result.passes > 5 and "linear" in result.by_op
    assert result.stored_passes == pytest.approx(result.passes)


def test_class_without_sliding_support_is_skipped(tmp_path):
    kv = session(config_dir(tmp_path, "gemma3_text"), caches=("inplace",))
    with pytest.raises(Skipped, match="inplace cannot serve sliding layers"):
        kv.count("inplace")


def test_quantized_reports_passes_per_stored_byte():
    kv = session("tiny", caches=("quantized-fp8",), counted=(64, 128))
    result = kv.count("quantized-fp8")
    assert result.stored_passes == pytest.approx(2 * result.passes, rel=0.02)


@pytest.mark.parametrize("name, package", [("quantized-quanto", "optimum-quanto"), ("quantized-hqq", "hqq")])
def test_group_wise_quantized_backends_count_or_skip_naming_the_package(name, package):
    """quanto and hqq (the ``quantized`` extra) run on CPU: int4 with scales holds about 0.28 of the bf16 bytes, so
    passes per stored byte are 3-4x the passes per KV byte; optimum-quanto's cache holds tensor subclasses, counted by
    the tensors they wrap. Without the package: skipped, naming it. Contexts past the 128 tokens kept unquantized."""
    from kvcache.measuring import caches

    reason = caches.cache_unavailable_reason(caches.get(name), "cpu")
    if reason is not None:
        assert f"pip install {package}" in reason, reason
        pytest.skip(reason)
    result = session("tiny", caches=(name,), counted=(256, 512)).count(name)
    assert result.passes > 3  # every step dequantizes the whole quantized part
    assert 3 * result.passes < result.stored_passes < 4 * result.passes


def test_passes_per_kind_do_not_depend_on_depth():
    """gemma3-270m at @layers=6 and @layers=12 (whole patterns): the same passes per layer kind within 0.01."""
    figures = {}
    for layers in (6, 12):
        kv = session(f"gemma3-270m@layers={layers}", counted=(256, 512))
        kinds = kv.count("dynamic").kinds
        figures[layers] = {kind: entry.passes for kind, entry in kinds.items()}
    assert figures[6].keys() == figures[12].keys() == {"full", "sliding"}
    for kind in figures[6]:
        assert figures[6][kind] == pytest.approx(figures[12][kind], abs=0.01)


def test_before_layer_types_a_switched_off_window_is_full_attention(monkeypatch):
    """Before configs declared ``layer_types`` (4.51-4.52 for Qwen3), a Qwen2/Qwen3 config carries a ``sliding_window``
    with ``use_sliding_window=False``: its layers are full attention, as that release's attention reads it."""
    from types import SimpleNamespace

    monkeypatch.setattr(compat.modeling.cache_utils, "get_layer_types_and_kwargs", None, raising=False)
    qwen = SimpleNamespace(num_hidden_layers=2, sliding_window=4096, use_sliding_window=False)
    mistral = SimpleNamespace(num_hidden_layers=2, sliding_window=4096)
    assert compat.layer_types(qwen) == ["full_attention"] * 2
    assert compat.layer_types(mistral) == ["sliding_attention"] * 2
