"""The generate driver and batches (``--kv-driver generate``, ``--kv-batch``, ``--kv-ragged``) on ``tiny`` in float32
(so that near-ties of bf16 random weights cannot flip a greedy token): generate takes exactly the steps it is asked
for, its greedy tokens are the loop's, and a counted generate step adds generate's own per-step copies."""

from __future__ import annotations

import pytest
import torch

from kvcache.measuring import caches, decode, traffic
from kvcache.measuring.batch import BatchShape
from kvcache.measuring.devices import Device
from kvcache.measuring.generate import GeneratePoint
from kvcache.measuring.models import build_model

CONTEXT = 48
TOKENS = 6


@pytest.fixture(scope="module")
def tiny(one_torch_thread):
    device = Device.from_choice("cpu")
    model, spec = build_model("tiny", device.torch_device, "float32")
    return model, spec, device


def open_point(tiny, cache: str, batch: BatchShape, point_type=None) -> decode.DecodePoint:
    model, spec, device = tiny
    return decode.open_point(model, spec, caches.get(cache), device, CONTEXT, warmup=0, steps=TOKENS + 4,
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
    assert torch.equal(torch.cat(driven.generated, dim=1), torch.cat(tokens, dim=1))


def test_a_counted_generate_step_adds_generates_own_copies(tiny):
    """generate appends the token to its input_ids and a column to its attention mask every step (int64, read and
    written whole): 2 x 16 B per token and sequence more than the loop's step, nothing else that grows."""
    batch = BatchShape()
    lo_loop, hi_loop = (decode.open_point(*tiny[:2], caches.get("dynamic"), tiny[2], c, warmup=2, steps=1,
                                          batch=batch) for c in (64, 128))
    loop_growth = traffic.count(hi_loop.step)[1].total - traffic.count(lo_loop.step)[1].total
    lo, hi = (open_point_at(tiny, c) for c in (64, 128))
    counted = {c: p.count_step(2) for c, p in ((64, lo), (128, hi))}
    growth = counted[128].total - counted[64].total
    assert growth - loop_growth == 2 * 16 * 64
    assert counted[128].ops["cat"].calls > hi_loop.spec.layers * 2  # the cache's cats and generate's own


def open_point_at(tiny, context: int) -> GeneratePoint:
    model, spec, device = tiny
    return decode.open_point(model, spec, caches.get("dynamic"), device, context, warmup=0, steps=4,
                             point_type=GeneratePoint)


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
    assert ragged.live_share(spec, 100) == pytest.approx(250 / 400)
    assert BatchShape(4).live_share(spec, 100) == 1.0
