"""Attention implementations crossed with cache classes (``--kv-attn``, :mod:`kvcache.measuring.attention`): keys,
accepted names and skips; per attention, the greedy tokens of a DynamicCache under SDPA, the probe, and a user's own
attention function counted exactly (SDPA plus one extra read of K and V: +1.00 pass, ``sum 1.00``).

Tokens are compared on ``tiny`` in float32, re-initialised "lively" (as test_fixed_caches.py: the suite's random
weights make greedy decoding repeat its input token whatever attention computes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.measuring import attention, caches, compat, decode  # noqa: E402
from kvcache.measuring.counting import traffic  # noqa: E402
from kvcache.measuring.counting.probe import probe  # noqa: E402
from kvcache.measuring.devices import Device  # noqa: E402
from kvcache.measuring.models import build_model  # noqa: E402
from kvcache.testing.classes import lively  # noqa: E402

CPU = Device.from_choice("cpu")
STEPS = 8
CONTEXT = 40
PLUGINS = Path(__file__).resolve().parent.parent / "suite" / "plugins"

pytestmark = pytest.mark.usefixtures("one_torch_thread")
needs_registry = pytest.mark.skipif(not compat.has_attention_registry(),
                                    reason="no attention registry in this release (4.48+)")


@pytest.fixture(scope="module")
def extra_read():
    """The user's attention module of the suite test (tests/suite/plugins/kv_extra_read.py), imported."""
    if not compat.has_attention_registry() or not hasattr(
            __import__("transformers").modeling_utils, "AttentionInterface"):
        pytest.skip("AttentionInterface.register is 4.51+")
    sys.path.insert(0, str(PLUGINS))
    try:
        import kv_extra_read
    finally:
        sys.path.remove(str(PLUGINS))
    return kv_extra_read.NAME


@pytest.fixture(scope="module")
def tiny(one_torch_thread):
    model, spec = build_model("tiny", CPU.torch_device, "float32")
    return lively(model), spec


def greedy(tiny, name: str) -> list[int]:
    model, spec = tiny
    dp = decode.open_point(model, spec, caches.get(name), CPU, CONTEXT, warmup=0, steps=STEPS)
    tokens = []
    for _ in range(STEPS):
        dp.step()
        tokens.append(int(dp.next_ids.view(-1)[0]))
    dp.release()
    return tokens


# --- keys, names, skips (no model) ------------------------------------------------------------------------------

def test_keys_keep_plain_names_under_the_default_and_cross_class_by_class():
    assert attention.cross(("dynamic", "static"), ["sdpa", "eager"]) == [
        "dynamic", "dynamic@eager", "static", "static@eager"]
    assert attention.cross(("dynamic@eager",), ["sdpa", "eager"]) == ["dynamic@eager"]
    assert attention.split("paged@paged|eager") == ("paged", "paged|eager")
    assert caches.get("dynamic@sdpa") is caches.get("dynamic")


def test_register_cache_refuses_a_name_with_the_separator():
    with pytest.raises(ValueError, match="contains '@'") as info:
        caches.register_cache("mine@v2", lambda request: None)
    assert "\n" not in str(info.value)


def test_an_unknown_name_is_one_line_naming_the_accepted_ones():
    with pytest.raises(attention.AttentionError) as info:
        attention.parse_attentions("sdpa,nonsense")
    text = str(info.value)
    assert "'nonsense'" in text and "eager" in text and "sdpa" in text and "\n" not in text
    with pytest.raises(caches.CacheError, match="unknown attention implementation 'nonsense'"):
        caches.parse_caches("dynamic@nonsense")
    with pytest.raises(attention.AttentionError, match="names no attention"):
        attention.parse_attentions(" , ")


def test_own_attention_and_paging_pairs_are_skipped_with_the_reason():
    reasons = {name: caches.cache_unavailable_reason(caches.get(name), "cpu")
               for name in ("static-sliced@eager", "dynamic@paged|eager", "dynamic@flash_attention_2",
                            "dynamic@kernels-community/flash-attn")}
    assert "brings its own attention" in reasons["static-sliced@eager"]
    assert "does not page" in reasons["dynamic@paged|eager"]
    flash = reasons["dynamic@flash_attention_2"]
    if not torch.cuda.is_available():
        assert flash and ("CUDA GPU" in flash or "not available in transformers" in flash), flash
    hub = reasons["dynamic@kernels-community/flash-attn"]
    assert hub is None or hub.startswith("Hub kernel"), hub
    assert all("\n" not in r for r in reasons.values() if r)


# --- per attention: tokens, probe, counted traffic ---------------------------------------------------------------

@needs_registry
def test_every_attention_decodes_the_tokens_of_sdpa(tiny, extra_read):
    reference = greedy(tiny, "dynamic")
    assert len(set(reference)) > 1  # lively weights: tokens depend on the context
    for name in ("dynamic@eager", "static@eager", f"dynamic@{extra_read}", f"static@{extra_read}"):
        assert greedy(tiny, name) == reference, name


@needs_registry
def test_the_probe_sees_eager_expand_k_and_v(tiny):
    model, spec = tiny
    dp = decode.open_point(model, spec, caches.get("dynamic@eager"), CPU, CONTEXT, warmup=1, steps=2)
    seen = probe(dp.step, spec.heads, spec.kv_heads).record()
    dp.release()
    assert seen.attention.startswith("expanded") and "eager" in seen.attention, seen
    assert seen.expansions == 2 * spec.layers and seen.calls == spec.layers, seen
    assert seen.key[1] == spec.kv_heads, seen  # what the function received, before repeat_kv


@needs_registry
def test_a_users_attention_function_is_counted_exactly(tiny, extra_read):
    """Prediction: SDPA's count plus exactly 1.00 pass (one more read of all K and V), all of it ``sum``."""
    model, spec = tiny
    passes = {}
    for name in ("dynamic", f"dynamic@{extra_read}"):
        counts, held = {}, {}
        for context in (64, 128):
            dp = decode.open_point(model, spec, caches.get(name), CPU, context, warmup=1, steps=1)
            counts[context] = dp.count_step(1)
            held[context] = dp.position * spec.bytes_per_token
            dp.release()
        passes[name] = traffic.counted_passes(counts, spec.bytes_per_token, kv_bytes=held)
    mine = passes[f"dynamic@{extra_read}"]
    assert mine.passes == pytest.approx(passes["dynamic"].passes + 1.0, abs=1e-9), mine
    assert mine.by_op["sum"] == pytest.approx(1.0, abs=1e-9), mine


@needs_registry
def test_an_entry_point_registers_an_attention_name(monkeypatch, extra_read):
    """The group ``kvcache_passes.attention``: each entry point's object is called; what it registers is accepted."""
    import importlib.metadata

    from transformers import modeling_utils

    def register():
        modeling_utils.AttentionInterface.register("kv_from_entry_point", modeling_utils.AttentionInterface()["sdpa"])

    class EntryPoint:
        name, value = "mine", "my_package:register"

        def load(self):
            return register

    def entry_points(group=None, **kwargs):
        return [EntryPoint()] if group == attention.ATTENTION_ENTRY_POINTS.group else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(attention.ATTENTION_ENTRY_POINTS, "loaded", False)
    try:
        assert attention.accepted("kv_from_entry_point") == "kv_from_entry_point"
    finally:
        modeling_utils.AttentionInterface._global_mapping.pop("kv_from_entry_point", None)
