"""Minor page faults and heap growth per decode step: a plain step, the ledger's clocked step (the CPU ledger
today) and a step under torch.profiler (the CPU ledger until 2026-12-03), interleaved on one point.

Counts, not times: a minor fault is a page the process touches for the first time since it got it from the
kernel (zeroed on first touch), so a step that takes its new cache from fresh pages shows about one fault per
4 KiB of cache. The heap is glibc's main arena (``mallinfo2``). Linux with glibc only.

    .venv/bin/python scripts/page_faults.py --model smollm2-135m --cache dynamic --context 16384
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import statistics

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from kvcache.measuring import caches, decode, ledger
from kvcache.measuring.devices import Device
from kvcache.measuring.models import build_model


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--cache", default="dynamic")
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=4, help="steps per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    torch.set_num_threads(1)
    device = Device.from_choice("cpu")
    model, spec = build_model(args.model, device.torch_device, args.dtype)
    point = decode.open_point(model, spec, caches.get(args.cache), device, args.context, warmup=3,
                              steps=args.steps * args.rounds * 3 + 2)

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    per_mode: dict[str, list[tuple[int, int]]] = {"plain": [], "clocked (ledger)": [], "torch.profiler": []}

    def steps(mode: str) -> None:  # args.steps steps, each counted
        for _ in range(args.steps):
            before, heap = faults(), libc.mallinfo2().arena
            with record_function(ledger.STEP_RANGE):
                point.step()
            per_mode[mode].append((faults() - before, libc.mallinfo2().arena - heap))

    for _ in range(args.rounds):
        steps("plain")  # record_function outside a profile records nothing
        with ledger.OpClock(args.steps):  # the ledger's clock, as ledger.profile_steps runs it
            steps("clocked (ledger)")
        with profile(activities=[ProfilerActivity.CPU]):  # the CPU ledger until 2026-12-03
            steps("torch.profiler")
    kv_pages = spec.kv_bytes(args.context) // 4096
    print(f"{args.model} {args.dtype} {args.cache} at {args.context} tokens: the cache holds {kv_pages} pages of 4 KiB")
    print(f"{'mode':18s} {'faults/step median':>18s} {'max':>8s} {'heap MB/step median':>20s}")
    for mode, rows in per_mode.items():
        counts = [f for f, _ in rows]
        heap = statistics.median(h for _, h in rows) / 2**20
        print(f"{mode:18s} {statistics.median(counts):18.0f} {max(counts):8d} {heap:20.1f}")


if __name__ == "__main__":
    main()
