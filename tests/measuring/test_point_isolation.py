"""One open point per model at a time (issue 48): a class whose per-step work lives on the model (a KV-compression
press's state) is counted the same under every SDPA backend as in its own count, because the backends' steps never
run while another point of the same model is open. ``planted-model-state`` (kvcache.testing.classes) reads the whole
of the model's newest cache every step: +1 pass over ``dynamic`` when counted alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.analysing.settings import Settings  # noqa: E402
from kvcache.measuring.devices import Device  # noqa: E402
from kvcache.measuring.session import KVSession  # noqa: E402


@pytest.fixture(scope="module")
def counted(one_torch_thread):
    settings = Settings(model="tiny", device="cpu", dtype="bfloat16", warmup=1, counted_contexts=(256, 512),
                        gpus=("a100",))
    session = KVSession(settings, Device.from_choice("cpu"))
    return session.count("planted-model-state")


def test_a_class_with_per_model_state_counts_alike_under_every_fused_backend(counted):
    assert counted.passes == pytest.approx(4.0, abs=1e-6)  # cat 2 + attention 1 + the model-state read 1
    assert counted.by_op["sum"] == pytest.approx(1.0, abs=1e-6)
    for backend in ("flash", "efficient", "cudnn"):
        entry = counted.backends[backend]
        assert entry.passes == pytest.approx(4.0, abs=1e-6), (backend, entry.by_op)
        assert entry.by_op["sum"] == pytest.approx(1.0, abs=1e-6)
    assert counted.gpus["a100"].passes == pytest.approx(4.0, abs=1e-6)
