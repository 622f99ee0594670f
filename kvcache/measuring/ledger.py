"""The per-op timed ledger: where a decode step's time goes, op by op, under the counter's names. Profiled steps,
each after a plain one on the same point, in rounds of their own; each op (an ATen op with no ATen op above it) is
charged its seconds per step including the kernels it calls: on CPU by :class:`OpClock` (the monotonic clock around
each op, less the clock's own cost), on CUDA by ``torch.profiler`` (device time). Seconds per step, per op; the
analysis is :mod:`kvcache.analysing.ledger`'s, the method and its history docs/gate.md's ("Per-op timed ledger").
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

from kvcache.measuring import stages
from kvcache.measuring.counting.traffic import DISPLAY, check_not_counting, op_name

STEP_RANGE = "kvcache-step"  # the profiler range (record_function) around each profiled step (CUDA)
US = 1e-6  # seconds per microsecond (the profiler's unit)


BLOCK = 1  # profiled steps in a row, between blocks of as many plain steps: each profiled step right after a plain one


def blocks(steps: int, block: int = BLOCK) -> list[tuple[bool, int]]:
    """The order of a ledger point's ``2 × steps`` steps: ``(profiled, count)`` blocks, plain first, alternating."""
    out: list[tuple[bool, int]] = []
    for start in range(0, steps, block):
        count = min(block, steps - start)
        out += [(False, count), (True, count)]
    return out


def profiled_offsets(steps: int) -> list[int]:
    """Which of a ledger point's steps (0 = the first after the warm-up) are the profiled ones (:func:`blocks`)."""
    out: list[int] = []
    taken = 0
    for profiled, count in blocks(steps):
        if profiled:
            out += range(taken, taken + count)
        taken += count
    return out


def profile_steps(step: Any, sync: Any, steps: int, *, cuda: bool = False) -> dict[str, Any]:
    """Time ``steps`` calls of ``step`` (each followed by ``sync``) op by op, and ``steps`` plain ones between them
    (:func:`blocks`): ``{"step_s": [seconds per profiled step], "ops_s": {op: [seconds per profiled step]},
    "plain_s": [seconds per plain step]}``, an op absent from a step counting 0 there."""
    plain: list[float] = []
    clock = None if cuda else OpClock(steps)
    profiles: list[Any] = []  # CUDA: each block's profile, read once the timed part is over
    done = 0
    sync()
    for profiled, count in blocks(steps):
        if not profiled:
            for _ in range(count):
                start = time.perf_counter()
                step()
                sync()
                plain.append(time.perf_counter() - start)
        elif clock is not None:
            with clock:
                _block(step, sync, done, count)(clock.mark)
                clock.close()
            done += count
        else:
            profiles.append(_cuda_profile(_block(step, sync, 0, count), count))
    if clock is not None:  # the clock's cost on the ops these steps dispatched: timed, so before the mark
        clock.cost_per_op = clock_cost_per_op(clock.counts)
    stages.reached(stages.MEASURED)
    out = clock.seconds() if clock is not None else joined(
        [charge_to_steps(event_intervals(prof.events())) for prof in profiles])
    return {**out, "plain_s": plain}


def _block(step: Any, sync: Any, first: int, count: int) -> Callable[[Callable[[int], None]], None]:
    """``run(on_mark)`` of ``count`` steps numbered from ``first``: ``on_mark(i)`` before step ``i``."""
    def run(on_mark: Callable[[int], None]) -> None:
        for i in range(first, first + count):
            on_mark(i)
            step()
            sync()
    return run


def _cuda_profile(run: Any, steps: int) -> Any:
    """torch.profiler around ``run(on_mark)``, each of its ``steps`` steps in a :data:`STEP_RANGE` (from its mark to
    the next, or to the end of ``run``): the profile, not yet read."""
    ranges: list[Any] = []

    def on_mark(i: int) -> None:
        if ranges:
            ranges.pop().__exit__(None, None, None)
        if i < steps:
            ranges.append(record_function(STEP_RANGE))
            ranges[-1].__enter__()

    check_not_counting("the ledger's torch.profiler")  # never inside the counter (pytorch #195746)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run(on_mark)
        on_mark(steps)  # the last step's range closed, where ``run`` did not
    return prof


def joined(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``{"step_s", "ops_s"}`` of consecutive blocks as one, in order (an op absent from a block at 0 there)."""
    ops = list(dict.fromkeys(op for part in parts for op in part["ops_s"]))
    return {"step_s": [s for part in parts for s in part["step_s"]],
            "ops_s": {op: [s for part in parts for s in part["ops_s"].get(op, [0.0] * len(part["step_s"]))]
                      for op in ops}}


def profile_marked(run: Any, sync: Any, steps: int, *, cuda: bool = False) -> dict[str, Any]:
    """Like :func:`profile_steps` for steps that something else drives (``model.generate``): ``run(on_mark)``
    takes ``steps`` steps and calls ``on_mark(i)`` at each step boundary (0 before the first, ``i`` after step
    ``i``, the device already waited for); each step is the range between two marks. No plain steps."""
    sync()
    if not cuda:
        clock = OpClock(steps)
        with clock:
            run(clock.mark)
        clock.cost_per_op = clock_cost_per_op(clock.counts)
        stages.reached(stages.MEASURED)
        return clock.seconds()
    prof = _cuda_profile(run, steps)
    stages.reached(stages.MEASURED)  # reading the profile is untimed
    return charge_to_steps(event_intervals(prof.events()))


class OpClock(TorchDispatchMode):
    """Seconds of each op dispatched while the clock runs (the monotonic clock around the call: on CPU an op
    returns when its work is done), summed per (op under the counter's name, step), and how many times each op was
    dispatched (``counts``, over all steps). ``mark(i)`` opens step ``i`` and closes the one before; ops outside any
    step are not charged. A step's seconds (``step_s``) are its wall time less the clock's own cost: its
    bookkeeping, measured op by op, and the call into the clock and back, which cannot be measured from inside it:
    ``cost_per_op`` seconds for each op dispatched in the step (:func:`clock_cost_per_op`, on the ops these steps
    dispatched, set before or after the steps); never less than its ops' own seconds (a cost estimated above the
    one this step paid cannot make its ops outlast it). What the step would cost without the clock is what it is
    compared with: the plain steps between the profiled ones (:func:`profile_steps`)."""

    def __init__(self, steps: int, cost_per_op: float = 0.0) -> None:
        super().__init__()
        self.steps = steps
        self.cost_per_op = cost_per_op
        self.wall_s = [0.0] * steps  # each step's wall time less the clock's bookkeeping in it
        self.own_s = [0.0] * steps  # the clock's bookkeeping inside each step
        self.calls = [0] * steps  # ops dispatched inside each step
        self.counts: dict[str, int] = {}  # dispatches of each op, all steps
        self.ops_s: dict[str, list[float]] = {}
        self.current: int | None = None
        self.opened = 0.0

    @property
    def step_s(self) -> list[float]:
        return [max(wall - self.cost_per_op * calls, sum(seconds[step] for seconds in self.ops_s.values()))
                for step, (wall, calls) in enumerate(zip(self.wall_s, self.calls))]

    def mark(self, i: int) -> None:
        self.close()
        self.current = i if i < self.steps else None
        self.opened = time.perf_counter()

    def close(self) -> None:
        """Close the open step, if any (a later :meth:`mark` opens the next)."""
        now = time.perf_counter()
        if self.current is not None:
            self.wall_s[self.current] = now - self.opened - self.own_s[self.current]
        self.current = None

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
            self.counts[name] = self.counts.get(name, 0) + 1
            self.own_s[step] += time.perf_counter() - done
        return out

    def seconds(self) -> dict[str, Any]:
        return {"step_s": self.step_s, "ops_s": {op: list(s) for op, s in self.ops_s.items()}}


CALIBRATION_CALLS, CALIBRATION_REPEATS = 20, 5
CACHE_INDEX = Path("/sys/devices/system/cpu/cpu0/cache")  # Linux: one index<N>/ per cache of the first CPU
L2_FALLBACK = 1 << 20  # bytes: the level-2 cache assumed where the system does not say


def l2_bytes(index: Path = CACHE_INDEX) -> int:
    """The first CPU's level-2 cache, in bytes (Linux sysfs: ``index<N>/level`` and ``size``, e.g. ``1024K``);
    :data:`L2_FALLBACK` where it cannot be read."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for entry in sorted(index.glob("index*")):
        try:
            level, size = ((entry / name).read_text().strip() for name in ("level", "size"))
        except OSError:
            continue
        if level == "2" and size[:-1].isdigit() and size[-1] in units:
            return int(size[:-1]) * units[size[-1]]
    return L2_FALLBACK


def calibration_ops() -> dict[str, Callable[[], Any]]:
    """One call of each op a decoder step is made of, under the counter's name, with arguments of the kinds the
    step passes (tensors, scalars, lists, dims, keywords) on tensors so small that the op's own work is next to
    nothing. The clock's cost differs with an op's arguments, each handed to Python and back: from 4.4 us for
    ``linear`` to 8.5 for ``add_`` with a scalar on the developers' AMD EPYC (caches cold, :func:`clock_cost_per_op`;
    ``scripts/clock_cost.py --stand-ins``)."""
    aten = torch.ops.aten
    x, m, w, b = torch.zeros(1), torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1)
    half, row = torch.zeros(1, dtype=torch.bfloat16), torch.zeros(1, 1, 4)
    q, kv, new = torch.zeros(1, 3, 1, 4), torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 1, 4)
    index, ids, table = torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), torch.zeros(4, 4)
    return {
        "add": lambda: aten.add.Tensor(x, x), "mul": lambda: aten.mul.Tensor(x, x),
        "linear": lambda: aten.linear.default(m, w, b), "to": lambda: aten.to.dtype(half, torch.float32),
        "slice": lambda: aten.slice.Tensor(kv, 2, 0, 9223372036854775807, 1),
        "transpose": lambda: aten.transpose.int(q, 1, 2), "view": lambda: aten.view.default(m, [1]),
        "reshape": lambda: aten.reshape.default(q, [1, 1, 12]), "unsqueeze": lambda: aten.unsqueeze.default(x, 0),
        "cat": lambda: aten.cat.default([kv, new], 2), "pow": lambda: aten.pow.Tensor_Scalar(row, 2),
        "mean": lambda: aten.mean.dim(row, [-1], True), "rsqrt": lambda: aten.rsqrt.default(x),
        "neg": lambda: aten.neg.default(x), "index_copy_": lambda: aten.index_copy_.default(kv, 2, index, new),
        "arange": lambda: aten.arange.default(4, dtype=torch.long, device="cpu"),
        "add_": lambda: aten.add_.Tensor(x, 1),
        "scaled_dot_product_attention": lambda: aten.scaled_dot_product_attention.default(
            q, kv, kv, None, 0.0, False, scale=0.5, enable_gqa=True),
        "silu": lambda: aten.silu.default(x), "embedding": lambda: aten.embedding.default(table, ids),
    }


def clock_cost_per_op(counts: dict[str, int] | None = None, calls: int = CALIBRATION_CALLS,
                      repeats: int = CALIBRATION_REPEATS, sweep_bytes: int | None = None) -> float:
    """Seconds the clock adds to each op that its own bookkeeping does not account for (the dispatcher's call into
    :meth:`OpClock.__torch_dispatch__` and back, and the op's arguments handed to Python), measured here and now:
    ``calls`` calls of each op of :func:`calibration_ops` timed plain and under a clock, the difference per call;
    their mean weighted by ``counts`` (how often each op was dispatched in the steps to be corrected, an op with no
    stand-in left out; all of them alike when None); the median of ``repeats`` such pairs (plain and clocked
    alternate, so that a slower moment of the machine touches both). Not below 0.

    Before each call, ``sweep_bytes`` (default: the level-2 cache, :func:`l2_bytes`) are copied outside the timing,
    so that the call finds the caches as a decode step leaves them: every few ops of a step stream weights or K/V
    through the cache, and the clock's own data (the interpreter's, the mode's) is gone from it by the next op
    (measured: docs/results.md, "The clock's cost, op by op, with cold caches")."""
    ops = calibration_ops()
    weights = {name: 1 for name in ops} if counts is None else {n: c for n, c in counts.items() if n in ops and c}
    if not weights:
        weights = {name: 1 for name in ops}
    size = l2_bytes() if sweep_bytes is None else sweep_bytes
    source, target = bytearray(size), bytearray(size)

    def timed() -> dict[str, float]:
        out = {}
        for name in weights:  # under inference mode, as a decode step: composite ops reach the clock whole
            op, total = ops[name], 0.0
            for _ in range(calls):
                target[:] = source
                start = time.perf_counter()
                op()
                total += time.perf_counter() - start
            out[name] = total
        return out

    costs = []
    for _ in range(repeats):
        with torch.inference_mode():
            plain = timed()
            clock = OpClock(1)
            with clock:
                clock.mark(0)
                clocked = timed()
                clock.close()
        own_per_call = clock.own_s[0] / max(1, clock.calls[0])
        per_op = {name: (clocked[name] - plain[name]) / calls - own_per_call * clock.counts.get(name, 0) / calls
                  for name in weights}
        costs.append(sum(per_op[n] * weights[n] for n in weights) / sum(weights.values()))
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
    check_not_counting("the ledger's torch.profiler check")  # never inside the counter (pytorch #195746)
    try:
        with profile(activities=[ProfilerActivity.CPU]):
            torch.zeros(1).add_(1)
    except Exception as exc:  # noqa: BLE001 - any failure means no ledger here
        return f"torch.profiler does not run here ({type(exc).__name__}: {exc})"
    return None
