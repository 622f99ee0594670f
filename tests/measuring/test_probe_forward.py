"""Which forward the attention probe describes (:func:`kvcache.measuring.counting.probe.probe_point`, as the counted
side runs it after a point's counted step): a speculative key's probe is the verifying forward of the counted
iteration (1 + K query tokens, a mask, K/V repeated to every query head), the forward whose ``reshape`` bytes the
counted step holds, not generate's prefill of the prompt nor a self-draft's own forwards; every other key's is, as
before, every attention call of one more step (``probe(point.step)``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.measuring import caches, decode, decoding  # noqa: E402
from kvcache.measuring.batch import BatchShape  # noqa: E402
from kvcache.measuring.counting.probe import probe, probe_point  # noqa: E402
from kvcache.measuring.generate import GeneratePoint, leading_steps  # noqa: E402

CONTEXT = 48
WARMUP = 2  # the suite's counted warm-up (COUNT_WARMUP)


def open_point(tiny, key: str, generating: bool = True) -> decode.DecodePoint:
    """A point of ``key`` opened as the counted side opens it (``KVSession.open``: its strategy's point, generate's or
    the loop's, one sequence of the strategy's rows, its extra slots)."""
    model, spec, device = tiny
    strategy = decoding.strategy_for(key)
    point_type = strategy.point(GeneratePoint if generating else decode.DecodePoint)
    warmup, steps = (0, leading_steps(WARMUP) + 1) if generating else (WARMUP, 1)
    return decode.open_point(model, spec, caches.get(key), device, CONTEXT, warmup=warmup,
                             steps=steps + strategy.extra_slots(), batch=BatchShape(strategy.rows()),
                             point_type=point_type)


@pytest.mark.parametrize("key, k", [("dynamic#assisted:self:1", 1), ("dynamic#assisted:self:3", 3),
                                    ("static#prompt-lookup:2", 2), ("dynamic#assisted:tiny@layers=1:2", 2)])
def test_a_speculative_probe_is_the_verifying_forward_of_the_counted_iteration(tiny, key, k):
    model, spec, _ = tiny
    dp = open_point(tiny, key)
    try:
        count = dp.count_step(WARMUP, {model: "forward"})
        seen = probe_point(dp, WARMUP, spec.heads, spec.kv_heads).record()
        itemsize = next(model.parameters()).element_size()
    finally:
        dp.release()
    # one forward of the model (not the draft's, not generate's prefill): 1 + K queries against the sequence, a mask
    assert seen.calls == spec.layers, seen
    assert seen.query[1:3] == [spec.heads, k + 1], seen
    assert seen.mask is not None and seen.mask[-2] == k + 1 and seen.mask[-1] == seen.key[2], seen
    assert seen.key[2] > CONTEXT + k, seen  # the whole sequence's K/V (a prefill's queries would be as many)
    # K/V repeated to every query head, K and V of each layer: exactly the counted forward's reshape bytes
    assert seen.attention.startswith("expanded") and not seen.enable_gqa, seen
    assert seen.key[1] == seen.value[1] == spec.heads and seen.expansions == 2 * spec.layers, seen
    key_len, head_dim = seen.key[2], seen.key[3]
    expanded = seen.expansions * (spec.kv_heads + spec.heads) * key_len * head_dim * itemsize  # read 1, written N
    assert count.scope("forward").ops["reshape"].total == expanded, (count.scope("forward").ops, seen)


@pytest.mark.parametrize("key, generating", [("dynamic", True), ("static", True), ("dynamic#beam:2", True),
                                             ("dynamic#chunked-prefill:16", True), ("dynamic", False),
                                             ("dynamic#beam:2", False)])
def test_every_other_key_is_probed_as_before_one_more_step(tiny, key, generating):
    _, spec, _ = tiny
    seen = {}
    for how in ("probe_point", "probe"):
        dp = open_point(tiny, key, generating)
        try:
            dp.count_step(WARMUP)
            if how == "probe_point":
                seen[how] = probe_point(dp, WARMUP, spec.heads, spec.kv_heads).record()
            else:
                seen[how] = probe(dp.step, spec.heads, spec.kv_heads).record()
        finally:
            dp.release()
    assert seen["probe_point"] == seen["probe"], seen
    assert seen["probe"].calls == spec.layers, seen  # one forward
    assert not decoding.strategy_for(key).probe_last_forward
