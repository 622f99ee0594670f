"""Devices: which one to use, how to wait for it, how much memory it has free, what it is called."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")


class DeviceError(ValueError):
    """A ``--kv-device`` value that cannot be used here; the message is one line."""


def available(kind: str) -> bool:
    if kind == "cpu":
        return True
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    return False


def resolve_device(choice: str) -> torch.device:
    """``auto`` picks cuda, then mps, then cpu; asking for an absent device is a usage error."""
    if choice not in DEVICE_CHOICES:
        raise DeviceError(f"--kv-device {choice!r} is not one of {', '.join(DEVICE_CHOICES)}")
    if choice == "auto":
        choice = next(k for k in ("cuda", "mps", "cpu") if available(k))
    elif not available(choice):
        raise DeviceError(f"--kv-device {choice!r}: no {choice} device on this machine "
                          f"(available: {', '.join(k for k in DEVICE_CHOICES[1:] if available(k))})")
    return torch.device(choice)


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that returns once all work queued on ``device`` has finished (no-op on CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return lambda: None


def free_bytes(device: torch.device) -> int:
    """Memory that can still be allocated on ``device``, in bytes."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())
    return _cpu_available_bytes()


def _cpu_available_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def name(device: torch.device) -> str:
    """A stable name for baselines: ``cuda: NVIDIA H200``, ``cpu: AMD EPYC ... (2 threads)``."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    if device.type == "mps":
        return f"mps: {platform.machine()} {platform.mac_ver()[0]}".strip()
    return f"cpu: {_cpu_name()} ({torch.get_num_threads()} threads)"


@dataclass(frozen=True)
class Device:
    """A resolved device with its synchronize function."""

    torch_device: torch.device
    sync: Callable[[], None]

    @classmethod
    def from_choice(cls, choice: str) -> Device:
        dev = resolve_device(choice)
        return cls(dev, synchronizer(dev))

    @property
    def type(self) -> str:
        return self.torch_device.type

    @property
    def name(self) -> str:
        return name(self.torch_device)

    def free_bytes(self) -> int:
        return free_bytes(self.torch_device)

    def describe(self) -> dict[str, Any]:
        return {"device_type": self.type, "device_name": self.name}
