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
    stages.reached(stages.MEASURED)  # reading the profile is untimed
    intervals = None if cuda else result_intervals(prof)
    if intervals is None:  # device times (on CUDA) are only in the events torch builds
        intervals = event_intervals(prof.events(), cuda)
    return charge_to_steps(intervals)


# One CPU event of the profile: (thread, start, end, name, seconds charged to it). Start and end order the
# events of one thread (any unit); seconds is the event's own time (CPU) or its kernels' time (CUDA).
Interval = tuple[int, float, float, str, float]


def event_intervals(events: Any, cuda: bool) -> list[Interval]:
    """The intervals of the CPU events of ``prof.events()`` (torch's own parse of the profile: it gives each
    op its kernels' device time, at a cost of several seconds for a profile of 8 steps of a 30-layer model)."""
    from torch.autograd import DeviceType

    return [(e.thread, e.time_range.start, e.time_range.end, e.name,
             (e.device_time_total if cuda else e.cpu_time_total) * US)
            for e in events if not e.is_async and e.device_type == DeviceType.CPU]


def result_intervals(prof: Any) -> list[Interval] | None:
    """The intervals of :func:`event_intervals` on CPU, read straight from the profiler's result (torch's name
    filter, no hidden or async event, CPU only; start and end in ns, seconds their difference), without the
    seconds ``prof.events()`` takes to build its events. They charge the same: ``prof.events()`` also drops an
    op that is the only child of an op of the same name, an op inside an op, which is charged to none. None
    when this torch's result cannot be read so (then ``prof.events()``)."""
    try:
        from torch.autograd import DeviceType
        from torch.autograd.profiler_util import _filter_name

        result = prof.profiler.kineto_results
        intervals = []
        for e in result.events():
            name = e.name()
            if _filter_name(name) or (hasattr(e, "is_hidden_event") and e.is_hidden_event()):
                continue
            if e.device_type() != DeviceType.CPU or e.is_async() or e.start_thread_id() != e.end_thread_id():
                continue
            start, end = e.start_ns(), e.end_ns()
            intervals.append((e.start_thread_id(), start, end, name, (end - start) * 1e-9))
        return intervals
    except (AttributeError, ImportError, TypeError):
        return None


def charge_to_steps(intervals: list[Interval]) -> dict[str, Any]:
    """``{"step_s": [seconds per step], "ops_s": {op: [seconds per step]}}`` from the profile's CPU events: each
    :data:`STEP_RANGE` is a step (in start order); each ATen op with no ATen op around it is charged to the
    nearest step around it, under the counter's name (an op absent from a step counts 0 there). Around: the
    event's interval holds the other's, on the same thread, as torch's ``EventList`` nests them (an event
    that ends after the one open on top of the stack, or starts at or after its end, is not inside it)."""
    by_thread: dict[int, list[Interval]] = {}
    for interval in intervals:
        by_thread.setdefault(interval[0], []).append(interval)
    steps: list[tuple[float, int, float]] = []  # (start, id, seconds) of each step range
    charged: list[tuple[int, str, float]] = []  # (step id, op, seconds) of each top-level op
    for thread_intervals in by_thread.values():
        thread_intervals.sort(key=lambda iv: (iv[1], -iv[2]))
        open_: list[tuple[float, bool, int | None]] = []  # (end, in an ATen op, step id) of each open event
        for _, start, end, name, seconds in thread_intervals:
            while open_ and (start >= open_[-1][0] or end > open_[-1][0]):
                open_.pop()
            in_aten, step = open_[-1][1:] if open_ else (False, None)
            is_aten = name.startswith("aten::")
            if is_aten and not in_aten and step is not None:
                op = name[len("aten::"):]
                charged.append((step, DISPLAY.get(op, op), seconds))
            if name == STEP_RANGE:
                step = len(steps)
                steps.append((start, step, seconds))
            open_.append((end, in_aten or is_aten, step))
    order = {step: i for i, (_, step, _) in enumerate(sorted(steps))}
    ops: dict[str, list[float]] = {}
    for step, op, seconds in charged:
        ops.setdefault(op, [0.0] * len(steps))[order[step]] += seconds
    return {"step_s": [seconds for _, _, seconds in sorted(steps)], "ops_s": ops}


def profiler_available() -> str | None:
    """Why this torch cannot profile (None when it can)."""
    try:
        with profile(activities=[ProfilerActivity.CPU]):
            torch.zeros(1).add_(1)
    except Exception as exc:  # noqa: BLE001 - any failure means no ledger here
        return f"torch.profiler does not run here ({type(exc).__name__}: {exc})"
    return None
