"""Fixtures of the measuring wing's tests; the test-only twins are registered as the suite's conftest does."""

import pytest
import torch

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
