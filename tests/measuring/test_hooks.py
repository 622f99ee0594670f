"""Classes that hook the model (``fill_context``, ``decode_context``: :mod:`kvcache.measuring.hooks`), with the fake
press of :mod:`kvcache.testing.press` (no kvpress needed): prefilled whatever ``--kv-fill`` says, compressed by the
hook, the decode context held through the steps and left at release; bad hooks are one-line errors naming the
class."""

from __future__ import annotations

import contextlib

import pytest
import torch

from kvcache.measuring import caches, compat, decode, hooks
from kvcache.measuring.cachespec import CacheSpec
from kvcache.testing.press import FakePress, changes_weights

CONTEXT = 32


def dynamic(request):
    return compat.new_dynamic_cache(request.config)


def opened(tiny, cache_spec: CacheSpec, fill: str = "synthetic", steps: int = 2) -> decode.DecodePoint:
    model, spec, device = tiny
    return decode.open_point(model, spec, cache_spec, device, CONTEXT, warmup=1, steps=steps, fill=fill)


def test_fill_context_implies_a_prefill_and_is_checked_at_registration():
    spec = CacheSpec("p", dynamic, fill_context=lambda m: FakePress()(m))
    assert spec.needs_prefill and hooks.fill_of(spec, "synthetic") == "prefill"
    assert hooks.fill_of(CacheSpec("d", dynamic), "synthetic") == "synthetic"
    with pytest.raises(ValueError, match=r"^register_cache\('p'\): fill_context 3 is not accepted"):
        CacheSpec("p", dynamic, fill_context=3)
    with pytest.raises(ValueError, match=r"decode_context 'x' is not accepted"):
        CacheSpec("p", dynamic, decode_context="x")


@pytest.mark.parametrize("fill", ["synthetic", "prefill"])
def test_a_press_class_is_prefilled_and_compressed_under_either_fill(tiny, fill):
    spec = caches.get("fake-press")
    point = opened(tiny, spec, fill)
    try:
        assert point.fill == "prefill"
        keys, _ = compat.layer_kv(point.cache, 0)
        assert keys.shape[-2] == CONTEXT // 2 + 1  # half the context kept, one warm-up step appended
    finally:
        point.release()
    plain = opened(tiny, caches.get("dynamic"), fill)
    try:
        assert plain.fill == fill and compat.layer_kv(plain.cache, 0)[0].shape[-2] == CONTEXT + 1
    finally:
        plain.release()


def test_a_counted_step_of_the_press_reads_half_the_cache(tiny):
    """One counted step's growth in bytes across two contexts: the press's cache grows half as fast (1.50 passes
    per logical byte where dynamic counts 3.00), so its counted figure is not dynamic's."""
    model, spec, device = tiny

    def step_bytes(name: str, context: int) -> int:
        point = decode.open_point(model, spec, caches.get(name), device, context, warmup=1, steps=1)
        try:
            return point.count_step(1).total
        finally:
            point.release()

    grew = {name: step_bytes(name, 128) - step_bytes(name, 64) for name in ("dynamic", "fake-press")}
    assert grew["fake-press"] * 2 == pytest.approx(grew["dynamic"], rel=0.02)


def test_the_decode_context_is_held_through_the_steps_and_left_at_release(tiny):
    seen = []

    @contextlib.contextmanager
    def counting(model):
        seen.append("enter")
        yield
        seen.append("exit")

    spec = CacheSpec("decoder", dynamic, decode_context=counting)
    point = opened(tiny, spec, steps=3)
    assert seen == ["enter"] and point.fill == "synthetic"  # a decode-time hook needs no prefill of its own
    point.step()
    point.count_step()
    assert seen == ["enter"]
    other = opened(tiny, spec)  # a second point on the model: the first one's context is left first
    assert seen == ["enter", "exit", "enter"]
    other.release()
    point.release()
    assert seen == ["enter", "exit", "enter", "exit"]


def raising(model):
    raise RuntimeError("press broke\nsecond line")


@pytest.mark.parametrize("which", ["fill_context", "decode_context"])
@pytest.mark.parametrize("hook, message", [
    (raising, r"raised RuntimeError: press broke$"),
    (lambda model: 42, r"returned int, not a context manager"),
    (changes_weights, r"changed the model's weights \(model\.embed_tokens\.weight\)"),
], ids=["raises", "no-context-manager", "changes-weights"])
def test_a_bad_hook_is_a_one_line_error_naming_the_class(tiny, which, hook, message):
    spec = CacheSpec("bad-hook", dynamic, **{which: hook})
    with pytest.raises(hooks.HookError) as err:
        point = opened(tiny, spec)
        point.release()
    text = str(err.value)
    assert "\n" not in text and text.startswith("cache class 'bad-hook': ")
    assert __import__("re").search(message, text), text
    model, _, _ = tiny
    assert torch.equal(next(model.parameters()), next(model.parameters()))


@contextlib.contextmanager
def leaves_state(model):
    """Like kvpress's AdaKVPress: the prefill leaves an attribute on every attention module for the decode steps."""
    from kvcache.testing.press import attention_modules

    def hook(module, args, kwargs, output):
        module.kept_context = kwargs["hidden_states"].shape[1]

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in attention_modules(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def test_state_a_fill_leaves_on_the_model_is_each_point_own(tiny):
    from kvcache.testing.press import attention_modules

    model, spec, device = tiny
    cache_spec = CacheSpec("stateful", dynamic, fill_context=leaves_state)
    first = decode.open_point(model, spec, cache_spec, device, 16, warmup=0, steps=3)
    second = decode.open_point(model, spec, cache_spec, device, 24, warmup=0, steps=3)
    attn = attention_modules(model)[0]
    assert attn.kept_context == 24
    first.step()
    assert attn.kept_context == 16  # the first point steps with its own state, not the second's
    second.step()
    assert attn.kept_context == 24
    first.release()
    assert attn.kept_context == 24
    second.release()
    assert not hasattr(attn, "kept_context")  # nothing left for the next class's points
