"""Token identity of the fixed caches: greedy generation with ``inplace`` gives the tokens and the bitwise
logits of ``dynamic``, ``static-sliced`` the tokens (and close logits) of ``static``; an InplaceCache that
has to grow still matches; and deliberately broken variants are caught by the same check: an attention function
without causality in prefill, and in the decode path an ``inplace`` writing one slot off, a ``static-sliced``
handing attention views one slot short, and one grouping query heads onto the wrong KV heads.

Random weights as the suite builds them (std 0.02, tied embeddings) make greedy decoding repeat its input
token forever, whatever attention computes, so a token comparison would prove nothing. The models here
are re-initialised "lively" (unit-variance embeddings, 1/sqrt(fan-in) projections, an untied head): each
next token then depends on attention over the whole context, and the generations are checked to vary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402, N812

from kvcache.measuring import caches, compat  # noqa: E402
from kvcache.measuring.caches import CacheSpec  # noqa: E402
from kvcache.measuring.decode import DecodePoint  # noqa: E402
from kvcache.measuring.devices import Device  # noqa: E402
from kvcache.measuring.fixed import InplaceCache, StaticSlicedCache, sliced_sdpa  # noqa: E402
from kvcache.measuring.geometry import ModelSpec  # noqa: E402
from kvcache.measuring.models import build_model  # noqa: E402
from kvcache.testing.classes import lively  # noqa: E402

CPU = Device.from_choice("cpu")
NEW_TOKENS = 32
PROMPTS = [(0, 20), (1, 41), (2, 60)]  # (seed, prompt length)
BROKEN_ATTENTION = "kvcache_test_noncausal_prefill"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclasses.dataclass
class Generation:
    """Greedy tokens and the logits of every decode step, and the cache they came from."""

    tokens: list[int]
    logits: torch.Tensor
    cache: Any


def generate(model: Any, spec: ModelSpec, cache_spec: CacheSpec, *, prompt: int, seed: int,
             new_tokens: int = NEW_TOKENS) -> Generation:
    """Prefill ``prompt`` random tokens (seeded), then ``new_tokens`` greedy single-token steps."""
    point = DecodePoint(model, spec, cache_spec, CPU, prompt, prompt + new_tokens + 8, fill="prefill",
                        seed=seed).build()
    tokens, logits = [], []
    for _ in range(new_tokens):
        logits.append(point.step()[0, -1].clone())
        tokens.append(int(point.next_ids))
    return Generation(tokens, torch.stack(logits), point.cache)


def token_mismatch(got: Generation, want: Generation) -> str | None:
    """None when the two generations chose the same tokens, else where and how they first differ."""
    for i, (a, b) in enumerate(zip(got.tokens, want.tokens)):
        if a != b:
            return f"token {i} differs: {a} != {b} (got {got.tokens[:i + 1]}, want {want.tokens[:i + 1]})"
    if len(got.tokens) != len(want.tokens):
        return f"lengths differ: {len(got.tokens)} != {len(want.tokens)}"
    return None


def assert_varied(gen: Generation) -> None:
    """Guard the premise: a generation that repeats one token cannot tell attention results apart."""
    assert len(set(gen.tokens)) >= len(gen.tokens) // 4, f"degenerate generation {gen.tokens}"


def inplace_with_capacity(capacity: int) -> CacheSpec:
    return dataclasses.replace(caches.get("inplace"), name=f"inplace-{capacity}",
                               build=lambda req: InplaceCache(req.config, capacity=capacity))


def noncausal_prefill_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """sliced_sdpa with a bug: the prefill drops the mask and ``is_causal`` (every token sees the future)."""
    if query.shape[-2] > 1:
        groups = query.shape[1] // key.shape[1]
        extra = {"enable_gqa": True} if groups > 1 else {}
        out = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout, scale=scaling, **extra)
        return out.transpose(1, 2).contiguous(), None
    return sliced_sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def tiny(request):
    model, spec = build_model("tiny", CPU.torch_device, request.param, seed=0)
    return lively(model), spec


@pytest.fixture(scope="module")
def tiny_runs(tiny):
    """Generations on ``tiny`` by cache class and prompt, computed once per dtype."""
    model, spec = tiny
    done: dict[tuple[str, int, int], Generation] = {}

    def run(name: str, seed: int, prompt: int) -> Generation:
        if (name, seed, prompt) not in done:
            done[name, seed, prompt] = generate(model, spec, caches.get(name), prompt=prompt, seed=seed)
        return done[name, seed, prompt]

    return run


@pytest.mark.parametrize(("seed", "prompt"), PROMPTS)
def test_inplace_matches_dynamic_bitwise(tiny_runs, seed, prompt):
    dynamic, inplace = tiny_runs("dynamic", seed, prompt), tiny_runs("inplace", seed, prompt)
    assert_varied(dynamic)
    assert token_mismatch(inplace, dynamic) is None
    assert torch.equal(inplace.logits, dynamic.logits)
    assert isinstance(inplace.cache, InplaceCache)
    assert compat.seq_length(inplace.cache) == prompt + NEW_TOKENS


@pytest.mark.parametrize(("seed", "prompt"), PROMPTS)
def test_static_sliced_matches_static(tiny_runs, seed, prompt):
    static, sliced = tiny_runs("static", seed, prompt), tiny_runs("static-sliced", seed, prompt)
    assert_varied(static)
    assert token_mismatch(sliced, static) is None
    # attention over the filled slots only sums in a different order than over the masked full buffer
    tol = 1e-4 if static.logits.dtype == torch.float32 else 0.1
    torch.testing.assert_close(sliced.logits.float(), static.logits.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize(("seed", "prompt"), [(3, 10), (4, 20)])
def test_inplace_cache_grows_past_its_capacity(tiny, tiny_runs, seed, prompt):
    """Capacity 16 < prompt + 32 tokens: the buffer doubles (copying the filled part) and nothing changes."""
    model, spec = tiny
    dynamic = tiny_runs("dynamic", seed, prompt)
    grown = generate(model, spec, inplace_with_capacity(16), prompt=prompt, seed=seed)
    assert token_mismatch(grown, dynamic) is None
    assert torch.equal(grown.logits, dynamic.logits)
    cache = grown.cache
    assert cache.growths > 0
    total = prompt + NEW_TOKENS
    for layer in range(spec.layers):
        keys, values = compat.layer_kv(cache, layer)
        assert keys.shape[-2] == values.shape[-2] == total
        capacity = cache._buffers[layer][0].shape[-2]
        assert total <= capacity < 2 * total


def test_grown_inplace_keeps_every_token(tiny):
    """After growing, the buffer holds exactly what DynamicCache's cat would hold."""
    model, spec = tiny
    a = DecodePoint(model, spec, inplace_with_capacity(4), CPU, 9, 40, fill="prefill", seed=5).build()
    b = DecodePoint(model, spec, caches.get("dynamic"), CPU, 9, 40, fill="prefill", seed=5).build()
    for _ in range(12):
        a.step()
        b.step()
    assert a.cache.growths > 0
    for layer in range(spec.layers):
        for got, want in zip(compat.layer_kv(a.cache, layer), compat.layer_kv(b.cache, layer)):
            assert torch.equal(got, want)


@pytest.mark.parametrize(("seed", "prompt"), PROMPTS)
def test_noncausal_prefill_is_caught(tiny, tiny_runs, seed, prompt):
    """The identity check catches an attention function that forgets causality during prefill."""
    compat.register_attention(BROKEN_ATTENTION, noncausal_prefill_sdpa, with_sdpa_mask=True)
    broken = dataclasses.replace(caches.get("static-sliced"), name="broken-sliced", attention=BROKEN_ATTENTION)
    model, spec = tiny
    got = generate(model, spec, broken, prompt=prompt, seed=seed)
    want = tiny_runs("static", seed, prompt)
    mismatch = token_mismatch(got, want)
    assert mismatch is not None and mismatch.startswith("token ")
    assert not torch.allclose(got.logits.float(), want.logits.float(), atol=0.1)


# --- broken decode paths: each must fail the identity check -------------------------------------------------
# Each bug below touches only single-token steps (the prefill is right), so only the decode path can give it away.

class OneSlotAheadInplace(InplaceCache):
    """``inplace`` with an off-by-one: a decoded token is written one slot past the filled part, so attention reads
    the slot before it (the previous token, or on the first step a zeroed slot) in its place."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zeroed: set[int] = set()  # layers whose unfilled slots were zeroed: no torch.empty garbage is read

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: Any = None, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if key_states.shape[-2] != 1 or layer_idx not in self._buffers:
            return super().update(key_states, value_states, layer_idx, cache_kwargs, *args, **kwargs)
        n, (buffer_k, buffer_v) = self._lengths[layer_idx], self._buffers[layer_idx]
        if layer_idx not in self.zeroed:
            buffer_k[..., n:, :].zero_()
            buffer_v[..., n:, :].zero_()
            self.zeroed.add(layer_idx)
        buffer_k[..., n + 1:n + 2, :].copy_(key_states)
        buffer_v[..., n + 1:n + 2, :].copy_(value_states)
        self._lengths[layer_idx] = n + 1
        keys, values = buffer_k[..., :n + 1, :], buffer_v[..., :n + 1, :]
        compat.store_layer_kv(self, layer_idx, keys, values)
        return keys, values


class OneShortSliced(StaticSlicedCache):
    """``static-sliced`` whose update hands attention views one slot short in decode: the new token is stored but
    attention never sees it."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: Any = None, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().update(key_states, value_states, layer_idx, cache_kwargs, *args, **kwargs)
        if key_states.shape[-2] == 1:
            return keys[:, :, :-1], values[:, :, :-1]
        return keys, values


def round_robin_gqa_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """sliced_sdpa with a packing bug in single-token decode: query head h is grouped onto KV head h % kv_heads
    (round robin, as ``repeat`` would lay them out) instead of h // groups (as ``repeat_interleave`` does)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if query.shape[-2] != 1 or heads == kv_heads:
        return sliced_sdpa(module, query, key, value, attention_mask, *args, **kwargs)
    groups = heads // kv_heads
    order = torch.tensor([k + g * kv_heads for k in range(kv_heads) for g in range(groups)])
    out, weights = sliced_sdpa(module, query[:, order], key, value, attention_mask, *args, **kwargs)
    restore = torch.argsort(order)
    return out[:, :, restore], weights  # out is [batch, q_len, heads, head_dim]: each head's output back in place


ROUND_ROBIN_ATTENTION = "kvcache_test_round_robin_gqa"
# broken variant -> (reference class, how to break the fixed class's spec, the fixed class)
BROKEN_DECODE = {
    "inplace-one-slot-ahead": ("dynamic", lambda spec: dataclasses.replace(
        spec, build=lambda req: OneSlotAheadInplace(req.config, capacity=req.max_tokens)), "inplace"),
    "static-sliced-one-short": ("static", lambda spec: dataclasses.replace(
        spec, build=lambda req: compat.new_cache(OneShortSliced, req.config, req.max_tokens, req.device, req.dtype)),
        "static-sliced"),
    "static-sliced-round-robin-gqa": ("static", lambda spec: dataclasses.replace(
        spec, attention=ROUND_ROBIN_ATTENTION), "static-sliced"),
}


@pytest.mark.parametrize(("seed", "prompt"), PROMPTS)
@pytest.mark.parametrize("broken", list(BROKEN_DECODE))
def test_broken_decode_path_is_caught(tiny, tiny_runs, broken, seed, prompt):
    """The identity check catches a fixed cache whose decode path is wrong, while its prefill is right."""
    reference, make, fixed = BROKEN_DECODE[broken]
    base = caches.get(fixed)
    reason = caches.cache_unavailable_reason(base, "cpu")  # runs its prepare (static-sliced: registers its attention)
    if reason is not None:
        pytest.skip(reason)
    compat.register_attention(ROUND_ROBIN_ATTENTION, round_robin_gqa_sdpa, with_sdpa_mask=True)
    spec = dataclasses.replace(make(base), name=broken)
    model, model_spec = tiny
    got = generate(model, model_spec, spec, prompt=prompt, seed=seed)
    want = tiny_runs(reference, seed, prompt)
    assert_varied(want)
    assert token_mismatch(tiny_runs(fixed, seed, prompt), want) is None  # the unbroken class passes the check
    mismatch = token_mismatch(got, want)
    assert mismatch is not None and mismatch.startswith("token "), broken


def test_token_mismatch_helper():
    a = Generation([1, 2, 3], torch.zeros(3), None)
    assert token_mismatch(a, Generation([1, 2, 3], torch.zeros(3), None)) is None
    assert token_mismatch(a, Generation([1, 5, 3], torch.zeros(3), None)).startswith("token 1 differs: 2 != 5")
    assert token_mismatch(a, Generation([1, 2], torch.zeros(2), None)) == "lengths differ: 3 != 2"


# --- the default model, at a small context -----------------------------------------------------------
# In float32: through 30 lively layers in bfloat16 the rounding difference between attending over the
# filled slots and over the masked full buffer flips near-tied argmaxes of static vs static-sliced (and of
# static vs dynamic): bfloat16 cannot tell those classes apart by tokens, float32 can (margins ~1e-3,
# differences ~1e-6).

@pytest.fixture(scope="module")
def smollm2():
    model, spec = build_model("smollm2-135m", CPU.torch_device, "float32", seed=0)
    return lively(model), spec


@pytest.mark.parametrize(("fixed", "reference"), [("inplace", "dynamic"), ("static-sliced", "static")])
def test_default_model_token_identity(smollm2, fixed, reference):
    model, spec = smollm2
    want = generate(model, spec, caches.get(reference), prompt=64, seed=0)
    got = generate(model, spec, caches.get(fixed), prompt=64, seed=0)
    assert_varied(want)
    assert token_mismatch(got, want) is None
    if fixed == "inplace":
        assert torch.equal(got.logits, want.logits)
    else:
        torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)
