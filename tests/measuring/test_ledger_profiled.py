"""The ledger's profiled steps on ``tiny``: time is charged to the ops the counter names, and a decode step copies
nothing from the host (on CUDA such a copy would wait for the device inside the timed step)."""

from __future__ import annotations

import pytest

from kvcache.measuring import caches, decode, ledger, traffic
from kvcache.measuring.devices import Device
from kvcache.measuring.models import build_model


@pytest.fixture(scope="module")
def tiny(one_torch_thread):
    device = Device.from_choice("cpu")
    model, spec = build_model("tiny", device.torch_device, "bfloat16")
    return model, spec, device


def point(tiny, cache: str, context: int = 512) -> decode.DecodePoint:
    model, spec, device = tiny
    return decode.open_point(model, spec, caches.get(cache), device, context, warmup=1, steps=4)


@pytest.mark.parametrize("cache", ["dynamic", "twin-planted"])
def test_profiled_time_goes_to_the_ops_the_counter_names(tiny, cache):
    dp = point(tiny, cache)
    _, counted = traffic.count(dp.step)
    profiled = ledger.profile_steps(dp.step, dp.device.sync, 3)
    assert len(profiled["step_s"]) == 3
    assert {"scaled_dot_product_attention", "cat", "linear"} <= set(profiled["ops_s"]) <= set(counted.ops)
    if cache == "twin-planted":
        assert "clone" in profiled["ops_s"]
    for i, step in enumerate(profiled["step_s"]):
        attributed = sum(values[i] for values in profiled["ops_s"].values())
        assert 0 < attributed <= step


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_decode_step_makes_no_tensor_from_host_data(tiny, cache):
    dp = point(tiny, cache)
    _, counted = traffic.count(dp.step)
    assert "lift_fresh" not in counted.ops  # torch.tensor(host data) inside the step
    assert int(dp.position_ids) == dp.position  # the position kept on the device follows the step
