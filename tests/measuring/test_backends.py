"""The SDPA backends counted on CPU (``kvcache.measuring.counting.backends``): torch's math composite decomposed into
its ATen ops (the float32 upcast included), the fused kernels charged by what the CUDA wrapper gives them, and the
backend
each GPU class selects (``--kv-gpus``), on ``tiny`` (2 layers, SmolLM2's heads), transformers 5.24, bf16."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.analysing.settings import Settings  # noqa: E402
from kvcache.measuring.counting import backends  # noqa: E402
from kvcache.measuring.counting.traffic import count  # noqa: E402
from kvcache.measuring.devices import Device  # noqa: E402
from kvcache.measuring.session import KVSession  # noqa: E402


@pytest.fixture(scope="module")
def counted(one_torch_thread):
    settings = Settings(model="tiny", device="cpu", dtype="bfloat16", warmup=1, counted_contexts=(256, 512),
                        gpus=("t4", "a100", "h100"))
    session = KVSession(settings, Device.from_choice("cpu"))
    return {cache: session.count(cache) for cache in ("dynamic", "static", "dynamic@eager")}


def test_math_counts_the_composite_op_by_op(counted):
    math = counted["dynamic"].backends["math"]
    assert math.passes == pytest.approx(25.26, abs=0.01)
    assert math.by_op["clone"] == pytest.approx(8.0)  # K/V in float32 repeated to 9 query heads: 3 × 2 × 2 - 4 read
    assert math.by_op["to"] == pytest.approx(3.0)  # bf16 K/V read, float32 written: 1 + 2
    assert math.by_op["mul"] == pytest.approx(6.0)  # the scale multiplied into the float32 K
    assert counted["static"].backends["math"].passes == pytest.approx(7.38, abs=0.01)


def test_fused_backends_read_the_cache_once(counted):
    dynamic = counted["dynamic"].backends
    for backend in ("flash", "efficient", "cudnn"):
        assert dynamic[backend].passes == pytest.approx(3.0, abs=1e-6)
    static = counted["static"].backends
    assert static["flash"].passes is None and "attn_mask" in static["flash"].error
    assert static["efficient"].by_op["pad"] > 0  # preprocess_mask: the expanded mask padded to 16 (a copy)
    assert static["cudnn"].passes == pytest.approx(counted["static"].passes, abs=0.01)


def test_gpu_classes_take_the_backend_torch_would(counted):
    gpus = counted["dynamic"].gpus
    assert gpus["t4"].backend == "math" and gpus["t4"].passes == pytest.approx(25.26, abs=0.01)
    assert set(gpus["t4"].rejected) == {"flash", "efficient"}
    assert gpus["a100"].backend == "flash" and gpus["a100"].passes == pytest.approx(3.0)
    assert gpus["h100"].backend == "cudnn"
    assert counted["static"].gpus["a100"].backend == "efficient"


def test_attention_that_is_not_sdpa_is_not_predicted(counted):
    eager = counted["dynamic@eager"]
    assert eager.backends is None
    assert all(e.backend is None and "not sdpa" in e.error for e in eager.gpus.values())


def test_a_mixed_selection_counts_each_call_under_its_own_backend():
    q = torch.randn(1, 9, 1, 64, dtype=torch.bfloat16)
    k = torch.randn(1, 3, 64, 64, dtype=torch.bfloat16)
    emulation = backends.Emulation(lambda index, call: "math" if index == 0 else "flash")

    def two_calls():
        with emulation.active():
            return [torch.nn.functional.scaled_dot_product_attention(q, k, k, enable_gqa=True) for _ in range(2)]

    outputs, traffic = count(two_calls)
    assert emulation.chosen == ["math", "flash"]
    assert "bmm" in traffic.ops and "scaled_dot_product_attention" in traffic.ops
    assert torch.allclose(outputs[0].float(), outputs[1].float(), atol=2e-2)
    assert torch.nn.functional.scaled_dot_product_attention is not emulation  # restored
