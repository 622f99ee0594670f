"""Fixtures of the measuring wing's tests; the test-only twins are registered as the suite's conftest does."""

import pytest
import torch

from kvcache.measuring.devices import Device
from kvcache.measuring.models import build_model
from kvcache.testing import classes as testing

testing.register()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module: on a busy machine OpenMP threads spin-wait for a core (a step runs
    10x slower with 2 threads than with 1). Counts and comparisons do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(one_torch_thread):
    """The ``tiny`` model in float32 on the CPU, built once per module: ``(model, spec, device)`` (a module that
    needs another dtype or a livelier model defines its own)."""
    device = Device.from_choice("cpu")
    model, spec = build_model("tiny", device.torch_device, "float32")
    return model, spec, device
