"""The per-op timed ledger: where a decode step's time goes, op by op, under the counter's names.

Timed-per-op steps run in rounds of their own (never inside the timed rounds, whose figures stay free of any
instrument): ``steps`` single-token steps, each op of which (an ATen op with no ATen op above it: what
:mod:`kvcache.measuring.traffic`'s counter is charged for) is charged its time including the kernels it calls
(``scaled_dot_product_attention``'s fused CPU kernel, ``clone``'s ``copy_``), under the counter's display name.
The step's own time minus the attributed ops is the step's unattributed time (Python, the dispatcher, hooks),
which the analysis (:mod:`kvcache.analysing.ledger`) derives.

- On CPU, :class:`OpClock` times the ops: a dispatch mode (the counter's own interception) that reads the
  monotonic clock around each op and keeps nothing but a sum per (op, step). torch.profiler is not used on CPU:
  its event buffers, allocated from the heap between the step's own large allocations, kept glibc from reusing
  the cache a DynamicCache ``cat`` had just freed, so every profiled step took its new cache from fresh pages
  (about 80,000 page faults a step at 16k tokens on the default model, against a few thousand unprofiled), and
  the profiled ``cat`` cost many times its bytes (docs/results.md, "The ledger that did not add up").
- On CUDA, ``torch.profiler``: each op is charged the device time of the kernels it launches; the step's time is
  CPU time up to and including the closing device sync.

Seconds per step, per op: fitted against KV bytes by the analysis like the whole step.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

from kvcache.measuring import stages
from kvcache.measuring.traffic import DISPLAY, op_name

STEP_RANGE = "kvcache-step"  # the profiler range (record_function) around each profiled step (CUDA)
US = 1e-6  # seconds per microsecond (the profiler's unit)


def profile_steps(step: Any, sync: Any, steps: int, *, cuda: bool = False) -> dict[str, Any]:
    """Time ``steps`` calls of ``step`` (each followed by ``sync``) op by op: ``{"step_s": [seconds per step],
    "ops_s": {op: [seconds per step]}}``, an op absent from a step counting 0 there."""
    def run(on_mark: Callable[[int], None]) -> None:
        for i in range(steps):
            on_mark(i)
            step()
            sync()
        on_mark(steps)
    return profile_marked(run, sync, steps, cuda=cuda)


def profile_marked(run: Any, sync: Any, steps: int, *, cuda: bool = False) -> dict[str, Any]:
    """Like :func:`profile_steps` for steps that something else drives (``model.generate``): ``run(on_mark)``
    takes ``steps`` steps and calls ``on_mark(i)`` at each step boundary (0 before the first, ``i`` after step
    ``i``, the device already waited for); each step is the range between two marks."""
    if not cuda:
        clock = OpClock(steps, cost_per_op=clock_cost_per_op())
        sync()
        with clock:
            run(clock.mark)
        stages.reached(stages.MEASURED)
        return clock.seconds()
    ranges: list[Any] = []

    def on_mark(i: int) -> None:
        if ranges:
            ranges.pop().__exit__(None, None, None)
        if i < steps:
            ranges.append(record_function(STEP_RANGE))
            ranges[-1].__enter__()

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run(on_mark)
    stages.reached(stages.MEASURED)  # reading the profile is untimed
    return charge_to_steps(event_intervals(prof.events()))


class OpClock(TorchDispatchMode):
    """Seconds of each op dispatched while the clock runs (the monotonic clock around the call: on CPU an op
    returns when its work is done), summed per (op under the counter's name, step). ``mark(i)`` opens step ``i``
    and closes the one before; ops outside any step are not charged. A step's seconds are its wall time less the
    clock's own cost: its bookkeeping, measured op by op, and the call into the clock and back, which cannot be
    measured from inside it: ``cost_per_op`` seconds for each op dispatched in the step, measured in the same
    process just before (:func:`clock_cost_per_op`); never less than its ops' own seconds (a cost estimated above
    the one this step paid cannot make its ops outlast it). What the step would cost without the clock is what it
    is compared with (the timed step, at every context)."""

    def __init__(self, steps: int, cost_per_op: float = 0.0) -> None:
        super().__init__()
        self.steps = steps
        self.cost_per_op = cost_per_op
        self.step_s = [0.0] * steps
        self.own_s = [0.0] * steps  # the clock's bookkeeping inside each step
        self.calls = [0] * steps  # ops dispatched inside each step
        self.ops_s: dict[str, list[float]] = {}
        self.current: int | None = None
        self.opened = 0.0

    def mark(self, i: int) -> None:
        now = time.perf_counter()
        if self.current is not None:
            step = self.current
            attributed = sum(seconds[step] for seconds in self.ops_s.values())  # the ops, timed one by one
            self.step_s[step] = max(now - self.opened - self.own_s[step] - self.cost_per_op * self.calls[step],
                                    attributed)
        self.current = i if i < self.steps else None
        self.opened = time.perf_counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        entered = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        done = time.perf_counter()
        step = self.current
        if step is not None:
            seconds = self.ops_s.get(name := op_name(func))
            if seconds is None:
                seconds = self.ops_s[name] = [0.0] * self.steps
            seconds[step] += done - entered
            self.calls[step] += 1
            self.own_s[step] += time.perf_counter() - done
        return out

    def seconds(self) -> dict[str, Any]:
        return {"step_s": list(self.step_s), "ops_s": {op: list(s) for op, s in self.ops_s.items()}}


CALIBRATION_OPS, CALIBRATION_REPEATS = 300, 5


def calibration_ops() -> list[Callable[[], Any]]:
    """One call each of the kinds of op a decoder step is made of, on tensors so small that the op's own work is
    next to nothing: an elementwise op of two tensors and of a tensor and a scalar, a view, a ``linear`` with a bias
    and a ``cat``. The clock's cost grows with an op's arguments (each is handed to Python and back): 8 us for
    ``add``, 20 for ``linear`` on the developers' AMD EPYC; a step is a mix of such ops."""
    x, w, b, m = torch.zeros(1), torch.zeros(1, 1), torch.zeros(1), torch.zeros(1, 1)
    aten = torch.ops.aten
    return [lambda: aten.add.Tensor(x, x), lambda: aten.mul.Tensor(x, 2.0), lambda: aten.view.default(m, [1]),
            lambda: aten.linear.default(m, w, b), lambda: aten.cat.default([x, x], 0)]


def clock_cost_per_op(ops: int = CALIBRATION_OPS, repeats: int = CALIBRATION_REPEATS) -> float:
    """Seconds the clock adds to each op that its own bookkeeping does not account for (the dispatcher's call into
    :meth:`OpClock.__torch_dispatch__` and back, and the op's arguments handed to Python), measured here and now:
    ``ops`` calls of each op of :func:`calibration_ops` timed plain and under a clock, the difference per call over
    the mix; the median of ``repeats`` such pairs (plain and clocked alternate, so that a slower moment of the machine
    touches both). Not below 0."""
    mix = calibration_ops()
    costs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for op in mix:
            for _ in range(ops):
                op()
        plain = time.perf_counter() - start
        clock = OpClock(1)
        with clock:
            clock.mark(0)
            for op in mix:
                for _ in range(ops):
                    op()
            clock.mark(1)
        costs.append((clock.step_s[0] - plain) / (ops * len(mix)))
    costs.sort()
    return max(0.0, costs[len(costs) // 2])


# One CPU event of the profile: (thread, start, end, name, seconds charged to it). Start and end order the
# events of one thread (any unit); seconds is the time of the kernels it launched (CUDA).
Interval = tuple[int, float, float, str, float]


def event_intervals(events: Any) -> list[Interval]:
    """The intervals of the CPU events of ``prof.events()`` (torch's own parse of the profile), each op charged
    the device time of the kernels it launched."""
    from torch.autograd import DeviceType

    return [(e.thread, e.time_range.start, e.time_range.end, e.name, e.device_time_total * US)
            for e in events if not e.is_async and e.device_type == DeviceType.CPU]


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


def unavailable(cuda: bool) -> str | None:
    """Why the ledger cannot time ops here (None when it can): on CUDA it needs torch.profiler."""
    if not cuda:
        return None
    try:
        with profile(activities=[ProfilerActivity.CPU]):
            torch.zeros(1).add_(1)
    except Exception as exc:  # noqa: BLE001 - any failure means no ledger here
        return f"torch.profiler does not run here ({type(exc).__name__}: {exc})"
    return None
