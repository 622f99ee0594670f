"""The generate driver and batches (``--kv-driver generate``, ``--kv-batch``, ``--kv-ragged``) on ``tiny`` in float32
(so that near-ties of bf16 random weights cannot flip a greedy token): generate takes exactly the steps it is asked
for, its greedy tokens are the loop's, and a counted generate step adds generate's own per-step copies."""

from __future__ import annotations

import pytest
import torch

from kvcache.measuring import caches, decode
from kvcache.measuring.batch import BatchShape
from kvcache.measuring.counting import traffic
from kvcache.measuring.devices import Device
from kvcache.measuring.generate import GeneratePoint
from kvcache.measuring.models import build_model
from kvcache.testing.classes import lively

CONTEXT = 48
TOKENS = 6
ONE = BatchShape()


@pytest.fixture(scope="module")
def tiny(one_torch_thread):
    device = Device.from_choice("cpu")
    model, spec = build_model("tiny", device.torch_device, "float32")
    return lively(model), spec, device  # greedy tokens that depend on the context, or their equality proves nothing


def open_point(tiny, cache: str, batch: BatchShape = ONE, point_type=None, *, context: int = CONTEXT,
               warmup: int = 0, steps: int = TOKENS + 4) -> decode.DecodePoint:
    model, spec, device = tiny
    return decode.open_point(model, spec, caches.get(cache), device, context, warmup=warmup, steps=steps,
                             batch=batch, point_type=point_type)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("batch", [BatchShape(), BatchShape(3, ragged=True)], ids=["batch1", "batch3-ragged"])
def test_generate_takes_the_steps_asked_and_the_loops_tokens(tiny, cache, batch):
    loop = open_point(tiny, cache, batch)
    tokens = []
    for _ in range(TOKENS):
        loop.step()
        tokens.append(loop.next_ids.clone())
    driven = open_point(tiny, cache, batch, GeneratePoint)
    driven.timed_generate(2, TOKENS - 2)
    assert len(driven.step_seconds) == TOKENS - 2 and len(driven.step_start_ns) == TOKENS - 2
    assert all(s > 0 for s in driven.step_seconds)
    assert driven.step_start_ns == sorted(driven.step_start_ns)
    assert driven.position == CONTEXT + TOKENS
    expected = torch.cat(tokens, dim=1)
    assert len(set(expected.flatten().tolist())) > 1, f"degenerate generation {expected}"
    assert torch.equal(torch.cat(driven.generated, dim=1), expected)


def test_a_counted_generate_step_adds_generates_own_copies(tiny):
    """generate appends the token to its input_ids and a column to its attention mask every step (int64, read and
    written whole): 2 x 16 B per token and sequence more than the loop's step, nothing else that grows."""
    lo_loop, hi_loop = (open_point(tiny, "dynamic", context=c, warmup=2, steps=1) for c in (64, 128))
    loop_growth = traffic.count(hi_loop.step)[1].total - traffic.count(lo_loop.step)[1].total
    lo, hi = (open_point(tiny, "dynamic", point_type=GeneratePoint, context=c, steps=4) for c in (64, 128))
    counted = {c: p.count_step(2) for c, p in ((64, lo), (128, hi))}
    growth = counted[128].total - counted[64].total
    assert growth - loop_growth == 2 * 16 * 64
    assert counted[128].ops["cat"].calls > hi_loop.spec.layers * 2  # the cache's cats and generate's own


def test_the_models_own_eos_token_neither_stops_nor_checks_a_step(tiny):
    """generate fills what the driver's config leaves unset from the model's generation config (4.50+): an
    end-of-sequence token there must not come back, even when it is the very token greedy decoding picks."""
    model = tiny[0]
    first = open_point(tiny, "dynamic", steps=1)
    first.step()
    eos = int(first.next_ids[0, 0])
    own = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = eos
    try:
        driven = open_point(tiny, "dynamic", point_type=GeneratePoint)
        driven.timed_generate(1, TOKENS - 1)
        assert len(driven.step_seconds) == TOKENS - 1  # no early stop at the eos token (picked at the first step)
        assert int(driven.generated[0][0, 0]) == eos
        assert model.generation_config.eos_token_id == eos  # the model's own config is left as it was
    finally:
        model.generation_config.eos_token_id = own


def test_warmup_0_still_keeps_whole_steps(tiny):
    """The first generate step's start mark is inside its forward: with warm-up 0 one more step runs first, so every
    kept step is a whole one, and a counted step sees the forward (its ops per step are not empty)."""
    model = tiny[0]
    driven = open_point(tiny, "dynamic", point_type=GeneratePoint)
    driven.timed_generate(0, 3)
    assert len(driven.step_seconds) == 3 and driven.position == CONTEXT + 4
    counted = open_point(tiny, "dynamic", point_type=GeneratePoint).count_step(0, {model: traffic.FORWARD})
    assert counted.scopes[traffic.FORWARD].total > 0


def test_batch_shape():
    assert BatchShape(4).lengths(100) == [100] * 4
    assert BatchShape(4, ragged=True).lengths(100) == [100, 75, 50, 25]
    assert BatchShape(4, ragged=True).pads(100) == [0, 25, 50, 75]
    assert BatchShape(3, ragged=True).lengths(10) == [10, 7, 4]


def test_batch_bytes(tiny):
    _, spec, _ = tiny
    ragged = BatchShape(4, ragged=True)
    assert ragged.live_bytes(spec, 100) == spec.kv_bytes(250)
    assert ragged.allocated_bytes(spec, 100) == spec.kv_bytes(400)
