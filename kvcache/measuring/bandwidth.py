"""The device's copy bandwidth: the yardstick that turns a latency slope into passes over the cache."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from kvcache.analysing.stats import median
from kvcache.measuring.devices import Device

GIB = 1 << 30


@dataclass(frozen=True)
class CopyBandwidth:
    """Copies of a ``nbytes`` tensor; each sample in GB/s counts bytes read plus bytes written (2 × nbytes)."""

    label: str
    nbytes: int
    samples_gbps: tuple[float, ...]

    @property
    def gbps(self) -> float:
        return median(self.samples_gbps)

    def to_dict(self) -> dict:
        return {"label": self.label, "gbps": self.gbps, "nbytes": self.nbytes,
                "samples_gbps": list(self.samples_gbps)}


def measure_copy(device: Device, *, nbytes: int = GIB, repeats: int = 20, label: str = "") -> CopyBandwidth:
    """Copy a ``nbytes`` tensor on ``device`` ``repeats`` times (after one untimed copy), each copy
    bracketed by a device sync; return every copy's read + write bandwidth."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device.torch_device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: page in the destination
    samples = []
    for _ in range(repeats):
        device.sync()
        start = time.perf_counter()
        dst.copy_(src)
        device.sync()
        samples.append(2 * nbytes / (time.perf_counter() - start) / 1e9)
    del src, dst
    return CopyBandwidth(label=label, nbytes=nbytes, samples_gbps=tuple(samples))
