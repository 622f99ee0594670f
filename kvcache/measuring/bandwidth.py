"""The device's copy bandwidth: the yardstick that turns a latency slope into passes over the cache."""

from __future__ import annotations

import time

import torch

from kvcache.analysing.estimates import median
from kvcache.analysing.records import CopyMeasurement
from kvcache.measuring import stages
from kvcache.measuring.devices import Device

GIB = 1 << 30


def measure_copy(device: Device, *, nbytes: int = GIB, repeats: int = 20, label: str = "") -> CopyMeasurement:
    """Copy a ``nbytes`` tensor on ``device`` ``repeats`` times (after one untimed copy), each copy bracketed by a
    device sync: the ``kv.copy.measurements[]`` record, every copy's read + write bandwidth (2 × ``nbytes`` per
    copy, GB/s) and their median."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device.torch_device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: page in the destination
    device.sync()  # done before the timed copies, and before another process's timed part may start
    stages.prepared()
    samples = []
    for _ in range(repeats):
        device.sync()
        start = time.perf_counter()
        dst.copy_(src)
        device.sync()
        samples.append(2 * nbytes / (time.perf_counter() - start) / 1e9)
    stages.reached(stages.MEASURED)
    del src, dst
    return CopyMeasurement(gbps=median(samples), label=label, nbytes=nbytes, samples_gbps=samples)
