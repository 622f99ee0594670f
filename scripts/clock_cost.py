"""The ledger clock's cost on a real step: the default model's ``dynamic`` at 1k, 2k and 16k tokens, 20 plain steps
interleaved with 20 clocked ones (medians, milliseconds), the clocked step raw and less the cost
:func:`kvcache.measuring.ledger.clock_cost_per_op` measured in the same process (docs/results.md, "The clock's own
cost taken out"). One torch thread; nothing else should run meanwhile (these are timings)::

    .venv/bin/python scripts/clock_cost.py --dtype float32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvcache.measuring import caches, decode, ledger
from kvcache.measuring.devices import Device
from kvcache.measuring.models import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--contexts", default="1024,2048,16384")
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = Device.from_choice("cpu")
    model, spec = build_model("smollm2-135m", device.torch_device, args.dtype)
    for context in (int(c) for c in args.contexts.split(",")):
        point = decode.open_point(model, spec, caches.get("dynamic"), device, context, warmup=3, steps=200)
        plain: list[float] = []
        raw: list[float] = []
        less: list[float] = []
        cost = ledger.clock_cost_per_op()
        calls = 0
        for _ in range(5):
            for _ in range(4):
                start = time.perf_counter()
                point.step()
                plain.append(time.perf_counter() - start)
            clock = ledger.OpClock(4, cost_per_op=cost)
            with clock:
                for i in range(4):
                    clock.mark(i)
                    point.step()
                clock.mark(4)
            less += clock.step_s
            raw += [s + cost * n for s, n in zip(clock.step_s, clock.calls)]
            calls = clock.calls[0]
        p, r, k = (statistics.median(x) * 1e3 for x in (plain, raw, less))
        print(f"{args.dtype} {context:>6}: plain {p:7.1f} ms, clocked {r:7.1f} ms ({(r / p - 1) * 100:+.1f}%), less "
              f"the clock's cost {k:7.1f} ms ({(k / p - 1) * 100:+.1f}%); cost {cost * 1e6:.1f} us/op x {calls} ops",
              flush=True)
        del point


if __name__ == "__main__":
    main()
