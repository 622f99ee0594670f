"""The generate driver (``--kv-driver generate``): the decode steps of a real ``model.generate()`` call. A
:class:`GeneratePoint` is a :class:`~kvcache.measuring.decode.DecodePoint` whose steps are taken by
``model.generate`` (greedy, a fixed number of new tokens, no early stop, no automatic compilation), marked by hooks:
a forward pre-hook before the first step, a stopping criterion after each. What a step then holds: docs/drivers.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch

from kvcache.measuring import compat
from kvcache.measuring.counting.traffic import TrafficCount, TrafficCounter
from kvcache.measuring.decode import DecodePoint

PAD_TOKEN = 0  # generate wants a pad token; with no end-of-sequence token it never pads


def leading_steps(warmup: int) -> int:
    """generate steps run before the first kept (timed or counted) step: ``warmup``, and at least 1. The first
    step's start mark is taken in the model's forward pre-hook, after generate prepared its inputs, so that step
    lacks part of what every later step does."""
    return max(warmup, 1)


class StepMarks:
    """A stopping criterion that never stops: it waits for the device, notes the time and calls ``on_mark(index)``
    at the end of every generate step. Written as a plain callable with the attributes generate's
    StoppingCriteriaList needs, so it works on every release. ``marks_ns`` (perf counter) time the steps,
    ``starts_ns`` (monotonic clock) say when each began."""

    def __init__(self, sync: Callable[[], None], on_mark: Callable[[int], None] | None = None) -> None:
        self.sync = sync
        self.on_mark = on_mark
        self.marks_ns: list[int] = []
        self.starts_ns: list[int] = []
        self.ends: int = 0
        self.hook: Any = None  # the forward pre-hook that calls :meth:`start`, removed once it has

    def _mark(self, index: int) -> None:
        self.sync()
        self.marks_ns.append(time.perf_counter_ns())
        self.starts_ns.append(time.monotonic_ns())
        if self.on_mark is not None:
            self.on_mark(index)

    def start(self) -> None:
        """The first mark (the first forward's pre-hook, which then removes itself: later steps run no hook)."""
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
            self._mark(0)

    def __call__(self, input_ids: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
        self.ends += 1
        self._mark(self.ends)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def seconds(self) -> list[float]:
        """Seconds of each step, in order."""
        return [(b - a) / 1e9 for a, b in zip(self.marks_ns, self.marks_ns[1:])]


def generation_config(model: Any, new_tokens: int, options: dict[str, Any] | None = None) -> Any:
    """Greedy, exactly ``new_tokens`` new tokens, no end-of-sequence token, no automatic compilation; ``options``
    (a decoding strategy's: ``num_beams``, ``prefill_chunk_size`` ...) over these. (generate fills a field left None
    here from the model's own generation config: see :func:`_without_eos`.)"""
    from transformers import GenerationConfig

    fields = {"max_new_tokens": new_tokens, "do_sample": False, "num_beams": 1, "use_cache": True,
              "eos_token_id": None, "pad_token_id": PAD_TOKEN, **(options or {})}
    config = GenerationConfig(**fields)
    if hasattr(config, "disable_compile"):  # 4.50+: generate compiles static-cache decode on accelerators itself
        config.disable_compile = True
    return config


@contextmanager
def _without_eos(model: Any) -> Iterator[None]:
    """The model's own generation config without its end-of-sequence token for the duration: from 4.50 generate
    fills the fields a passed config leaves None from it, which would bring back the eos check and its padding
    every step, and an early stop when a sequence picks that token."""
    own = getattr(model, "generation_config", None)
    eos = getattr(own, "eos_token_id", None)
    if own is not None:
        own.eos_token_id = None
    try:
        yield
    finally:
        if own is not None:
            own.eos_token_id = eos


class GeneratePoint(DecodePoint):
    """A decode point whose steps are those of ``model.generate`` (see the module docstring)."""

    input_ids: torch.Tensor | None = None
    generated: list[torch.Tensor]

    def build(self) -> GeneratePoint:
        super().build()
        where = self.device.torch_device
        with torch.inference_mode():
            prefix = torch.full((self.batch.size, self.context), PAD_TOKEN + 1, device=where)
            self.input_ids = torch.cat([prefix, self.next_ids], dim=1)
        self.generated = []
        return self

    def generate(self, new_tokens: int, on_mark: Callable[[int], None] | None = None) -> StepMarks:
        """Run ``model.generate`` for ``new_tokens`` decode steps; its marks (``seconds()`` of each step).
        ``on_mark(i)`` is called at mark ``i`` (0: before the first step, ``i``: after step ``i``)."""
        marks = StepMarks(self.device.sync, on_mark)
        marks.hook = self.model.register_forward_pre_hook(lambda *_: marks.start())
        width = self.input_ids.shape[1]
        mask = self.mask[:, :width] if self.mask is not None else torch.ones_like(self.input_ids)
        try:
            with torch.inference_mode(), _without_eos(self.model):
                out = self.model.generate(input_ids=self.input_ids, attention_mask=mask,
                                          generation_config=generation_config(self.model, new_tokens,
                                                                              self.generation_options()),
                                          stopping_criteria=_criteria([marks]),
                                          **{compat.cache_keyword(self.model): self.cache})
        finally:
            if marks.hook is not None:
                marks.hook.remove()
        steps = marks.seconds()
        if marks.ends != new_tokens or len(steps) != new_tokens:
            raise RuntimeError(f"generate took {marks.ends} steps for {new_tokens} new tokens")
        self.generated.append(out[:, self.input_ids.shape[1]:])
        self.input_ids = out
        self.next_ids = out[:, -1:]
        self.position += new_tokens
        return marks

    def generation_options(self) -> dict[str, Any]:
        """The decoding strategy's fields of the GenerationConfig (none for greedy)."""
        return self.strategy.generation_options() if self.strategy is not None else {}

    def step(self) -> torch.Tensor:
        """One generate call of one step (for code that steps a point one token at a time: the probe, the
        ledger). It includes generate's set-up; the timed and counted steps come from :meth:`generate`."""
        self.generate(1)
        return self.next_ids

    def warm_up(self, steps: int) -> None:
        if steps:
            self.generate(steps)
        self.device.sync()

    def release(self) -> None:
        super().release()
        self.input_ids = None
        self.generated = []

    def timed_generate(self, warmup: int, steps: int) -> None:
        """One generate call of :func:`leading_steps` ``(warmup) + steps`` steps; the last ``steps`` are kept as
        timed steps (``step_seconds``, ``step_start_ns`` on the monotonic clock)."""
        lead = leading_steps(warmup)
        marks = self.generate(lead + steps)
        self.step_seconds.extend(marks.seconds()[lead:])
        self.step_start_ns.extend(marks.starts_ns[lead:lead + steps])

    def count_step(self, warmup: int = 0, scopes: dict[Any, str] | None = None) -> TrafficCount:
        """The counted traffic of one generate step, after :func:`leading_steps` ``(warmup)`` steps of the same
        call."""
        warmup = leading_steps(warmup)
        counter = TrafficCounter(scopes)
        inside: list[bool] = []

        def on_mark(i: int) -> None:
            if i == warmup:
                counter.__enter__()
                inside.append(True)
            elif i == warmup + 1 and inside:
                inside.pop()
                counter.__exit__(None, None, None)

        try:
            self.generate(warmup + 1, on_mark=on_mark)
        finally:
            if inside:  # an exception between the marks: leave the mode
                counter.__exit__(None, None, None)
        return counter.count


def _criteria(items: list[Any]) -> Any:
    from transformers import StoppingCriteriaList

    return StoppingCriteriaList(items)
