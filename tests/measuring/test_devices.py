"""The device layer: which device ``auto`` picks, free memory and names as the system reports them, the memory
guard on real free memory, and (on a machine with a GPU) that CUDA synchronisation waits and free memory falls
by what is allocated."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from kvcache.analysing.presets import PRESETS
from kvcache.measuring import devices
from kvcache.measuring.caches import get
from kvcache.measuring.decode import PointSkip, check_memory
from kvcache.measuring.geometry import spec_from_config


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(devices, "available", lambda kind: kind in ("cpu", "mps"))
    assert devices.resolve_device("auto").type == "mps"
    monkeypatch.setattr(devices, "available", lambda kind: True)
    assert devices.resolve_device("auto").type == "cuda"
    monkeypatch.setattr(devices, "available", lambda kind: kind == "cpu")
    assert devices.resolve_device("auto").type == "cpu"


def test_absent_device_is_a_one_line_usage_error(monkeypatch):
    monkeypatch.setattr(devices, "available", lambda kind: kind == "cpu")
    with pytest.raises(devices.DeviceError, match=r"--kv-device 'cuda': no cuda device on this machine") as err:
        devices.resolve_device("cuda")
    assert "\n" not in str(err.value)
    with pytest.raises(devices.DeviceError, match="not one of auto, cpu, cuda, mps"):
        devices.resolve_device("tpu")


def meminfo_available() -> int | None:
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")), None)


def test_cpu_free_memory_is_what_the_kernel_reports():
    """On Linux: MemAvailable from /proc/meminfo, in bytes (within what other processes change meanwhile)."""
    available = meminfo_available()
    if available is None:
        pytest.skip("no /proc/meminfo here")
    assert devices.free_bytes(torch.device("cpu")) == pytest.approx(available, rel=0.05)


def test_cpu_name_names_the_processor_and_the_threads():
    name = devices.name(torch.device("cpu"))
    assert name.startswith("cpu: ") and name.endswith(f" ({torch.get_num_threads()} threads)")
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), None)
        if model:
            assert name == f"cpu: {model} ({torch.get_num_threads()} threads)"


def test_memory_guard_skips_with_the_numbers():
    """A context whose cache would not fit in the CPU's free memory is skipped, naming the numbers; one that fits
    is not."""
    from transformers import LlamaConfig

    spec = spec_from_config("smollm2-135m", LlamaConfig(**PRESETS["smollm2-135m"]), "bfloat16")
    cpu = devices.Device.from_choice("cpu")
    free = cpu.free_bytes()
    too_many = int(free / spec.bytes_per_token)  # x 2 for dynamic's copy on append: twice what is free
    with pytest.raises(PointSkip) as info:
        check_memory(spec, get("dynamic"), cpu, too_many)
    message = str(info.value)
    assert message.startswith(f"dynamic at {too_many} tokens needs about ")
    assert f"({spec.bytes_per_token} B/token x {too_many} x 2.0); cpu has " in message
    need_gib, free_gib = (float(x) for x in re.findall(r"([\d.]+) GiB", message))
    assert need_gib == pytest.approx(2 * free / 2**30, rel=0.02)  # its K/V and the copy cat makes of them
    assert free_gib == pytest.approx(free / 2**30, rel=0.05) and message.endswith(" GiB free")
    check_memory(spec, get("dynamic"), cpu, 1024)  # 1024 tokens (47 MB): no skip


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_cuda_synchronizer_waits_for_queued_work():
    dev = torch.device("cuda")
    x = torch.randn(4096, 4096, device=dev)
    done = torch.cuda.Event()
    for _ in range(20):
        x = x @ x / 64
    done.record()
    devices.synchronizer(dev)()
    assert done.query()  # everything queued before the sync has finished


@cuda
def test_cuda_free_memory_falls_by_what_is_allocated():
    dev = torch.device("cuda")
    torch.cuda.synchronize(dev)
    before = devices.free_bytes(dev)
    block = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    after = devices.free_bytes(dev)
    assert 0 < after < before
    assert before - after == pytest.approx(1 << 30, rel=0.05)
    del block
    assert devices.name(dev) == f"cuda: {torch.cuda.get_device_name(dev)}"


def test_model_geometry_is_derived_from_the_config():
    from transformers import LlamaConfig

    spec = spec_from_config("smollm2-135m", LlamaConfig(**PRESETS["smollm2-135m"]), "bfloat16")
    assert spec.bytes_per_token == 23_040
    assert spec.weight_bytes == 269_030_016
    mha = spec_from_config("smollm2-135m-mha", LlamaConfig(**PRESETS["smollm2-135m-mha"]), "bfloat16")
    assert mha.bytes_per_token == 3 * 23_040


def test_the_copy_bandwidth_is_the_kv_copy_record():
    """measure_copy gives ``kv.copy.measurements[]``'s record: every copy's read + write GB/s and their median."""
    from kvcache.analysing.records import CopyMeasurement
    from kvcache.measuring.bandwidth import measure_copy

    found = measure_copy(devices.Device.from_choice("cpu"), nbytes=1 << 16, repeats=3, label="start")
    assert isinstance(found, CopyMeasurement) and len(found.samples_gbps) == 3
    assert found.to_json() == {"gbps": found.gbps, "label": "start", "nbytes": 1 << 16,
                               "samples_gbps": found.samples_gbps}
    assert min(found.samples_gbps) <= found.gbps <= max(found.samples_gbps)
    assert CopyMeasurement.from_json(found.to_json()) == found
