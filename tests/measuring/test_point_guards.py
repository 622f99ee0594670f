"""A decode point on ``tiny``: an allocation failure is a skip with the reason on every torch the project allows
(``torch.OutOfMemoryError`` exists from torch 2.5 only; pyproject allows 2.1), any other failure is not swallowed,
and ``count_step(warmup)`` takes the warm-up steps it is asked for before the counted one."""

from __future__ import annotations

import pytest
import torch

from kvcache.measuring import caches, compat, decode
from kvcache.measuring.cachespec import CacheSpec

CONTEXT = 32


def failing(exc: BaseException) -> CacheSpec:
    """A class whose cache cannot be built: building it raises ``exc``."""
    def build(request):
        raise exc

    return CacheSpec("failing", build, description="raises when built")


def open_failing(tiny, exc: BaseException) -> decode.DecodePoint:
    model, spec, device = tiny
    return decode.open_point(model, spec, failing(exc), device, CONTEXT, warmup=0, steps=1)


OLD_TORCH_OOM = [  # what a torch before 2.5 raises: a plain RuntimeError (CUDA's own class aside)
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 1759218604441600 bytes. Error code 12 (Cannot allocate memory)"),
    MemoryError(),
]


@pytest.mark.parametrize("exc", OLD_TORCH_OOM, ids=["cuda-words", "cpu-words", "memory-error"])
def test_out_of_memory_is_a_skip_without_torch_out_of_memory_error(tiny, monkeypatch, exc):
    """As on torch 2.1-2.4, which have no ``torch.OutOfMemoryError``: the failure is still a skip naming it."""
    monkeypatch.delattr(torch, "OutOfMemoryError", raising=False)
    with pytest.raises(decode.PointSkip, match=f"out of memory on cpu at {CONTEXT} tokens"):
        open_failing(tiny, exc)


def test_unsupported_is_a_skip_without_torch_out_of_memory_error(tiny, monkeypatch):
    monkeypatch.delattr(torch, "OutOfMemoryError", raising=False)
    with pytest.raises(decode.PointSkip, match="^this release lacks it$"):
        open_failing(tiny, compat.Unsupported("this release lacks it"))


@pytest.mark.skipif(not hasattr(torch, "OutOfMemoryError"), reason="torch.OutOfMemoryError: torch 2.5+")
def test_torch_out_of_memory_error_is_a_skip(tiny):
    with pytest.raises(decode.PointSkip, match="out of memory on cpu"):
        open_failing(tiny, torch.OutOfMemoryError("allocation of 3 TB failed"))


def test_another_runtime_error_is_not_swallowed(tiny, monkeypatch):
    monkeypatch.delattr(torch, "OutOfMemoryError", raising=False)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        open_failing(tiny, RuntimeError("shape mismatch in the class's own update"))


def open_dynamic(tiny, *, warmup: int, steps: int) -> decode.DecodePoint:
    model, spec, device = tiny
    return decode.open_point(model, spec, caches.get("dynamic"), device, CONTEXT, warmup=warmup, steps=steps)


def test_count_step_takes_the_warm_up_it_is_asked_for(tiny):
    """Opened without warm-up, ``count_step(2)`` takes two steps and then counts the third; opened with two, it takes
    none more (the session's way: warm-up at open, the same number given to count_step)."""
    cold = open_dynamic(tiny, warmup=0, steps=3)
    cold.count_step(2)
    assert cold.position == CONTEXT + 3
    warm = open_dynamic(tiny, warmup=2, steps=1)
    counted = warm.count_step(2)
    assert warm.position == CONTEXT + 3
    plain = open_dynamic(tiny, warmup=2, steps=1)
    assert plain.count_step().total == counted.total  # the default: no warm-up of its own


def test_count_step_beyond_the_points_slots_says_so(tiny):
    point = open_dynamic(tiny, warmup=0, steps=1)  # slots: the context, one step and the margin
    with pytest.raises(ValueError, match=r"count_step\(50\): 50 more warm-up steps"):
        point.count_step(50)
    assert point.position == CONTEXT
