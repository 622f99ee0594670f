"""The device layer's CUDA and MPS paths, exercised without a GPU by standing in for torch's calls."""

from __future__ import annotations

import pytest
import torch

from kvcache.measuring import devices
from kvcache.measuring.caches import get
from kvcache.measuring.decode import PointSkip, check_memory
from kvcache.measuring.models import PRESETS, spec_from_config


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(devices, "available", lambda kind: kind in ("cpu", "mps"))
    assert devices.resolve("auto").type == "mps"
    monkeypatch.setattr(devices, "available", lambda kind: True)
    assert devices.resolve("auto").type == "cuda"
    monkeypatch.setattr(devices, "available", lambda kind: kind == "cpu")
    assert devices.resolve("auto").type == "cpu"


def test_absent_device_is_a_one_line_usage_error(monkeypatch):
    monkeypatch.setattr(devices, "available", lambda kind: kind == "cpu")
    with pytest.raises(devices.DeviceError, match=r"--kv-device 'cuda': no cuda device on this machine") as err:
        devices.resolve("cuda")
    assert "\n" not in str(err.value)
    with pytest.raises(devices.DeviceError, match="not one of auto, cpu, cuda, mps"):
        devices.resolve("tpu")


def test_cuda_synchronize_and_free_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", device)))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Test GPU")
    dev = torch.device("cuda")
    devices.synchronizer(dev)()
    assert calls == [("sync", dev)]
    assert devices.free_bytes(dev) == 3 << 30
    assert devices.name(dev) == "cuda: NVIDIA Test GPU"


def test_cpu_needs_no_sync_and_reports_free_memory():
    devices.synchronizer(torch.device("cpu"))()  # a no-op
    assert devices.free_bytes(torch.device("cpu")) > 0
    assert devices.name(torch.device("cpu")).startswith("cpu: ")


def test_memory_guard_skips_with_the_numbers(monkeypatch):
    """A context whose cache would not fit in the device's free memory is skipped, naming the numbers."""
    from transformers import LlamaConfig

    spec = spec_from_config("smollm2-135m", LlamaConfig(**PRESETS["smollm2-135m"]), "bfloat16")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 30, 80 << 30))
    fake = devices.Device(torch.device("cuda"), lambda: None)
    with pytest.raises(PointSkip, match=r"dynamic at 65536 tokens needs about 2\.81 GiB .* cuda has 1\.00 GiB free"):
        check_memory(spec, get("dynamic"), fake, 65536)
    check_memory(spec, get("dynamic"), fake, 1024)  # fits: no skip


def test_model_geometry_is_derived_from_the_config():
    from transformers import LlamaConfig

    spec = spec_from_config("smollm2-135m", LlamaConfig(**PRESETS["smollm2-135m"]), "bfloat16")
    assert spec.bytes_per_token == 23_040
    assert spec.weight_bytes == 269_030_016
    mha = spec_from_config("smollm2-135m-mha", LlamaConfig(**PRESETS["smollm2-135m-mha"]), "bfloat16")
    assert mha.bytes_per_token == 3 * 23_040
