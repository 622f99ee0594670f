"""The per-op timed ledger: where a decode step's time goes, op by op, under the counter's names.

Profiled steps run in rounds of their own (never inside the timed rounds, whose figures stay
profiler-free): a ``torch.profiler`` session over ``steps`` single-token steps, each inside a
``record_function`` range. Each ATen op the step calls from Python (an op with no ATen op above it in
the profiler's call tree: what :mod:`kvcache.measuring.traffic`'s counter is charged for) is charged its
time including the kernels it calls (``scaled_dot_product_attention``'s fused CPU kernel, ``clone``'s
``copy_``), under the counter's display name. On CPU that is the op's CPU time; on CUDA the device time
of the kernels it launches. The step's own time (wall on CPU; CPU time up to and including the closing
device sync on CUDA) minus the attributed ops is the step's unattributed time (Python, the dispatcher,
hooks), which the analysis (:mod:`kvcache.analysing.ledger`) derives.

Seconds per step, per op: fitted against KV bytes by the analysis like the whole step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from kvcache.measuring import stages
from kvcache.measuring.traffic import DISPLAY

STEP_RANGE = "kvcache-step"  # the profiler range (record_function) around each profiled step
US = 1e-6  # seconds per microsecond (the profiler's unit)


def _top_level(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return True


def _step_of(event: Any) -> Any:
    parent = event.cpu_parent
    while parent is not None and parent.name != STEP_RANGE:
        parent = parent.cpu_parent
    return parent


def profile_steps(step: Any, sync: Any, steps: int, *, cuda: bool = False) -> dict[str, Any]:
    """Profile ``steps`` calls of ``step`` (each followed by ``sync``): ``{"step_s": [seconds per step],
    "ops_s": {op: [seconds per step]}}``, an op absent from a step counting 0 there."""
    def drive() -> None:
        for _ in range(steps):
            with record_function(STEP_RANGE):
                step()
                sync()
    return _profiled(drive, sync, cuda)


def profile_marked(run: Any, sync: Any, steps: int, *, cuda: bool = False) -> dict[str, Any]:
    """Like :func:`profile_steps` for steps that something else drives (``model.generate``): ``run(on_mark)``
    takes ``steps`` steps and calls ``on_mark(i)`` at each step boundary (0 before the first, ``i`` after step
    ``i``, the device already waited for); each step is the range between two marks."""
    ranges: list[Any] = []

    def on_mark(i: int) -> None:
        if ranges:
            ranges.pop().__exit__(None, None, None)
        if i < steps:
            ranges.append(record_function(STEP_RANGE))
            ranges[-1].__enter__()

    return _profiled(lambda: run(on_mark), sync, cuda)


def _profiled(drive: Any, sync: Any, cuda: bool) -> dict[str, Any]:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    with profile(activities=activities) as prof:
        drive()
    stages.reached(stages.MEASURED)  # reading the profile (most of a ledger point's time) is untimed
    events = prof.events()
    ranges = sorted((e for e in events if e.name == STEP_RANGE), key=lambda e: e.time_range.start)
    index = {id(e): i for i, e in enumerate(ranges)}
    step_s = [e.cpu_time_total * US for e in ranges]
    ops: dict[str, list[float]] = {}
    for event in events:
        if not event.name.startswith("aten::") or not _top_level(event):
            continue
        owner = _step_of(event)
        if owner is None or id(owner) not in index:
            continue
        name = event.name[len("aten::"):]
        name = DISPLAY.get(name, name)
        seconds = (event.device_time_total if cuda else event.cpu_time_total) * US
        ops.setdefault(name, [0.0] * len(ranges))[index[id(owner)]] += seconds
    return {"step_s": step_s, "ops_s": ops}


def profiler_available() -> str | None:
    """Why this torch cannot profile (None when it can)."""
    try:
        with profile(activities=[ProfilerActivity.CPU]):
            torch.zeros(1).add_(1)
    except Exception as exc:  # noqa: BLE001 - any failure means no ledger here
        return f"torch.profiler does not run here ({type(exc).__name__}: {exc})"
    return None
