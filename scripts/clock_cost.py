"""The ledger's profiled step against the plain steps between them, and the clock's cost per op taken out of it.
Per class and context, medians in milliseconds (one torch thread; timings: nothing else should run meanwhile);
``--stand-ins``: the clock's calibration alone. Runs and figures: docs/results.md ("The clock's cost, op by op,
with cold caches")::

    .venv/bin/python scripts/clock_cost.py --dtype bfloat16 [--sweep-bytes 0] [--stand-ins]"""

from __future__ import annotations

import argparse
import statistics
from unittest import mock

import torch

from kvcache.measuring import caches, decode, ledger
from kvcache.measuring.devices import Device
from kvcache.measuring.models import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--caches", default="dynamic,static")
    ap.add_argument("--contexts", default="1024,2048,4096,8192,16384")
    ap.add_argument("--steps", type=int, default=20, help="profiled steps a point (as many plain ones)")
    ap.add_argument("--sweep-bytes", type=int, default=None,
                    help="bytes copied before each calibration op (default: the level-2 cache; 0: hot caches)")
    ap.add_argument("--stand-ins", action="store_true",
                    help="no model: the clock's cost on each stand-in (caches cold), then on all of them alike by "
                         "bytes copied before each call")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.stand_ins:
        stand_ins()
        return
    device = Device.from_choice("cpu")
    model, spec = build_model("smollm2-135m", device.torch_device, args.dtype)
    calibrate = ledger.clock_cost_per_op
    costs: list[float] = []

    def measured_cost(counts: dict[str, int]) -> float:
        costs.append(calibrate(counts, sweep_bytes=args.sweep_bytes))
        return costs[-1]

    for cache in args.caches.split(","):
        for context in (int(c) for c in args.contexts.split(",")):
            point = decode.open_point(model, spec, caches.get(cache), device, context, warmup=3,
                                      steps=2 * args.steps)
            with mock.patch.object(ledger, "clock_cost_per_op", measured_cost):
                out = ledger.profile_steps(point.step, device.sync, args.steps)
            plain, profiled = (statistics.median(out[k]) * 1e3 for k in ("plain_s", "step_s"))
            print(f"{args.dtype} {cache:>8} {context:>6}: plain {plain:7.1f} ms, profiled {profiled:7.1f} ms "
                  f"({(profiled / plain - 1) * 100:+.1f}%); clock's cost {costs[-1] * 1e6:.1f} us/op", flush=True)
            del point


def stand_ins() -> None:
    """The calibration's figures: each stand-in alone (caches cold: the level-2 cache copied before each call), then
    every stand-in alike with 0 bytes to 8 MiB copied before each call; microseconds an op, medians of 5."""
    for name in ledger.calibration_ops():
        cost = ledger.clock_cost_per_op({name: 1}, calls=100)
        print(f"{name:>30}: {cost * 1e6:5.1f} us/op", flush=True)
    for size in (0, 256 << 10, 1 << 20, 2 << 20, 8 << 20):
        cost = ledger.clock_cost_per_op(None, calls=100, sweep_bytes=size)
        print(f"all alike, {size >> 10:>5} KiB copied before each call: {cost * 1e6:5.1f} us/op", flush=True)


if __name__ == "__main__":
    main()
