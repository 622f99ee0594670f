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


def test_the_profile_read_from_the_result_is_the_profile_torch_parses(tiny, monkeypatch):
    """The ledger reads the profiler's result directly (a fraction of a second where ``prof.events()`` takes
    seconds); the same profile through ``prof.events()`` gives the same steps and ops, to the nanosecond.
    ``prof.events()`` has fewer events: it drops an op that is the only child of an op of the same name
    (``div_`` in ``div_``), which, being inside an op, is charged to none."""
    dp = point(tiny, "twin-planted")
    read: dict[str, list] = {}
    from_result = ledger.result_intervals

    def both(prof):
        read["result"], read["events"] = from_result(prof), ledger.event_intervals(prof.events(), cuda=False)
        return read["result"]

    monkeypatch.setattr(ledger, "result_intervals", both)
    profiled = ledger.profile_steps(dp.step, dp.device.sync, 3)
    assert read["result"] is not None and len(read["result"]) >= len(read["events"]) > 100
    parsed = ledger.charge_to_steps(read["events"])
    assert profiled["step_s"] == pytest.approx(parsed["step_s"], rel=1e-6) and len(parsed["step_s"]) == 3
    assert profiled["ops_s"].keys() == parsed["ops_s"].keys()
    for op, seconds in parsed["ops_s"].items():
        assert profiled["ops_s"][op] == pytest.approx(seconds, rel=1e-6, abs=1e-9), op


def test_an_op_is_charged_to_the_step_around_it_only_when_no_op_is_around_it():
    """``ledger.charge_to_steps`` on made-up intervals: (thread, start, end, name, seconds)."""
    step, aten = ledger.STEP_RANGE, "aten::"
    intervals = [
        (1, 200, 300, step, 1.0),  # the second step (in start order), listed first
        (1, 210, 250, aten + "_scaled_dot_product_flash_attention_for_cpu", 0.4),
        (1, 215, 240, aten + "copy_", 0.2),  # inside attention: attention's, not charged again
        (1, 250, 290, "nn.Module: Linear", 0.3),  # not an op; holds one
        (1, 260, 280, aten + "add", 0.2),
        (1, 0, 100, step, 2.0),
        (1, 10, 20, aten + "cat", 0.1),
        (1, 90, 110, aten + "mul", 0.05),  # ends after its step: not inside it, and in no step
        (1, 120, 130, aten + "mul", 0.01),  # between the steps
        (2, 20, 30, aten + "cat", 0.5),  # another thread: no step around it there
    ]
    out = ledger.charge_to_steps(intervals)
    assert out["step_s"] == [2.0, 1.0]
    assert out["ops_s"] == {"cat": [0.1, 0.0], "scaled_dot_product_attention": [0.0, 0.4], "add": [0.0, 0.2]}
