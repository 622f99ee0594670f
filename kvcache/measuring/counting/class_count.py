"""Counted traffic of a cache class on a session's model: one decode step counted at each counted context (the
bytes its tensor ops read and write: :mod:`kvcache.measuring.counting.traffic`), the attention probe of the largest
(:mod:`kvcache.measuring.counting.probe`) and the memory of each counted step
(:mod:`kvcache.measuring.counting.memory`). For a model
with sliding-window or linear-attention layers, passes per layer kind too, and two steps past every window. What it
gives are the ``kv.traffic``, ``kv.probe`` and ``kv.memory`` records of the class
(:class:`~kvcache.analysing.records.measured.ClassCount`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcache.analysing.options import MIN_OP_PASSES
from kvcache.analysing.records.counted import (
    AmortisedTraffic,
    BackendCount,
    GpuPrediction,
    Memory,
    MemoryBeyond,
    MemorySlopes,
    MemoryStep,
    Probe,
    ServedBatch,
    Traffic,
    TrafficBeyond,
)
from kvcache.analysing.records.measured import ClassCount
from kvcache.analysing.sdpa import selection as sdpa_rules
from kvcache.measuring import attention, caches, compat, decoding
from kvcache.measuring.attention import DEFAULT as SDPA
from kvcache.measuring.cachespec import period_steps
from kvcache.measuring.counting import backends, memory, traffic
from kvcache.measuring.counting.probe import probe_point
from kvcache.measuring.decoding import figures
from kvcache.measuring.generate import leading_steps

COUNT_WARMUP = 2  # decode steps before a counted one: enough for lazy initialisation; bytes do not change after


@dataclass
class CountedSteps:
    """One counted step of a class at each context: its traffic, the tokens its attention read, the bytes the
    cache stores there, the step's memory (where measured) and the attention probe (of the step at ``probe_at``)."""

    counts: dict[int, traffic.TrafficCount] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    stored: dict[int, int] = field(default_factory=dict)
    memory: dict[int, MemoryStep] = field(default_factory=dict)
    scopes: dict[int, memory.ScopeBytes] = field(default_factory=dict)
    probe: Probe | None = None


@dataclass
class EmulatedRun:
    """Steps counted with SDPA emulated (:mod:`kvcache.measuring.counting.backends`): counts per context (a class with a
    period: its window's steps as one count), the logical KV bytes held over them (``held``: summed over a window),
    the calls seen and the backend each ran under."""

    counts: dict[int, traffic.TrafficCount] = field(default_factory=dict)
    held: dict[int, float] = field(default_factory=dict)
    calls: list[Any] = field(default_factory=list)
    chosen: list[str] = field(default_factory=list)


class Counting:
    """Counts classes on the points a session opens. ``session`` (a :class:`kvcache.measuring.session.KVSession`)
    gives the settings, the model (``model()``, ``spec()``), the batch and the logical KV bytes it holds
    (``held``), and opens filled, warmed-up points (``open``: a class that cannot run raises its skip)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.tokens_per_step = 1.0  # of the last counted step (its strategy's: kvcache.measuring.decoding)

    def count(self, cache: str) -> ClassCount:
        """Counted passes of ``cache`` (steps counted at the counted contexts), its attention probe and counted
        memory; for a model whose layers are not all full attention, passes per layer kind (:meth:`_add_kinds`)."""
        s = self.session
        model, spec = s.model()
        contexts = tuple(s.settings.counted_contexts)
        strategy = decoding.strategy_for(cache)
        scopes: dict[Any, str] = figures.scopes_with(strategy, s, {model: traffic.FORWARD})
        if spec.mixed:  # below every window (ModelSpec.counted_contexts), ops charged per decoder layer too
            contexts = spec.counted_contexts(contexts)
            scopes.update(traffic.layer_scopes(model))
        steps = self._steps(cache, contexts, probe_at=max(contexts), scopes=scopes)
        held = {c: s.held(c, steps.tokens[c]) for c in contexts}
        result = traffic.counted_passes(steps.counts, spec.bytes_per_token, kv_bytes=held, layers=spec.layers,
                                        weight_bytes=spec.weight_bytes)
        self._add_held_and_stored(cache, steps, result)
        if not strategy.strategy.greedy:  # --kv-decoding: per token, by phase, and what the strategy adds
            figures.add_strategy(strategy, steps.counts, held, self.tokens_per_step, result)
            strategy.add_figures(self, cache, result)
        period = period_steps(caches.get(cache), model.config)
        one_step = ("--kv-driver generate counts one step inside generate()" if s.generating else None) or (
            None if strategy.strategy.greedy else f"decoding {strategy.name} is counted one step at a time")
        if period and one_step:  # no window to amortise over
            result.update(amortised=AmortisedTraffic.of(period=period, period_source="declared", error=(
                f"not amortised: {one_step}; greedy decoding on the loop driver counts a window of steps")))
            period = None
        if period:
            self._add_amortised(cache, contexts, period, result)
        self._flag_not_growing(steps.counts, result)
        measured = self._memory(cache, steps)
        if spec.mixed:
            self._add_kinds(cache, steps, scopes, result, measured)
        self._add_backends(cache, contexts, steps.probe, result, period or 1)
        return ClassCount.of(cache=cache, traffic=result, probe=steps.probe, memory=measured)

    def _add_amortised(self, cache: str, contexts: tuple[int, ...], period: int, result: Traffic) -> None:
        """``amortised`` (:class:`AmortisedTraffic`): ``period`` consecutive steps counted at each context, one point
        open at a time, so that each window holds the periodic work once; the class's ``passes`` and ``by_op`` become
        the amortised ones (what the gate judges), and its passes per stored byte with them. The steady step is the
        window's cheapest at each context (whatever the phase of the class's one counted step): ``step_passes``; the
        rest is the periodic part, by op."""
        s = self.session
        spec = s.spec()
        warm = min(s.settings.warmup, COUNT_WARMUP)
        window: dict[int, traffic.TrafficCount] = {}
        steady: dict[int, traffic.TrafficCount] = {}
        held: dict[int, float] = {}
        steady_held: dict[int, float] = {}
        for context in contexts:
            dp = s.open(cache, context, warmup=warm, steps=period)
            try:
                window[context], held[context] = traffic.TrafficCount(), 0.0
                for _ in range(period):
                    step = dp.count_step(warm)
                    window[context].merge(step)
                    held[context] += s.held(context, dp.position)
                    if context not in steady or step.total < steady[context].total:
                        steady[context], steady_held[context] = step, s.held(context, dp.position)
            finally:
                dp.release()
        amortised = traffic.counted_passes(window, spec.bytes_per_token, kv_bytes=held)
        one = traffic.counted_passes(steady, spec.bytes_per_token, kv_bytes=steady_held)
        periodic = {op: round(amortised.by_op.get(op, 0.0) - one.by_op.get(op, 0.0), 4)
                    for op in dict.fromkeys([*amortised.by_op, *one.by_op])}
        if result.stored_passes is not None and result.kv_bytes and result.stored_bytes:  # per stored byte alike
            lo, hi = str(min(contexts)), str(max(contexts))
            ratio = (result.kv_bytes[hi] - result.kv_bytes[lo]) / (result.stored_bytes[hi] - result.stored_bytes[lo])
            result.update(stored_passes=amortised.passes * ratio)
        result.update(passes=amortised.passes, by_op=amortised.by_op, amortised=AmortisedTraffic.of(
            period=period, window=period, period_source="declared", passes=amortised.passes, by_op=amortised.by_op,
            step_passes=one.passes, periodic_passes=amortised.passes - one.passes,
            periodic_by_op={op: v for op, v in sorted(periodic.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
                            if abs(v) >= MIN_OP_PASSES},
            step_bytes={str(c): window[c].total for c in contexts}))

    @staticmethod
    def _flag_not_growing(counts: dict[int, traffic.TrafficCount], result: Traffic) -> None:
        """A step whose bytes do not grow with context has no passes figure: ``passes`` None and ``not_growing`` says
        why (the bytes at the smallest and largest context), never a number the gate or a baseline would take."""
        passes = result.passes
        if passes is not None and passes > 0:
            return
        lo, hi = min(counts), max(counts)
        slope = "no" if passes is None else format(passes, "+.3f")
        result.update(passes=None, not_growing=(
            f"its counted step moved {counts[lo].total:,} bytes at {lo} tokens and {counts[hi].total:,} at {hi} "
            f"({slope} passes): it does not grow with context, so it has no counted passes (a cache of fixed "
            "size, a compression to a fixed budget, or work done every few steps: register_cache(..., period=N))"))

    def not_emulated(self, cache: str, probe: Probe | None) -> str | None:
        """Why the SDPA backends of ``cache``'s step are not counted (and no GPU class predicted), or None: its
        attention is not SDPA, its step calls none, or the step is not the suite's own eager loop."""
        s = self.session
        attention = caches.get(cache).attention
        if attention != SDPA:
            return (f"not predicted: its attention is {attention}, not sdpa (torch's SDPA backend rules say nothing "
                    "of it)")
        if probe is not None and not probe.calls:
            return "not predicted: its step calls no scaled_dot_product_attention"
        if s.generating:
            return ("not predicted: --kv-driver generate counts the step inside generate(); backends are counted on "
                    "the loop")
        return None

    def _add_backends(self, cache: str, contexts: tuple[int, ...], probe: Probe | None,
                      result: Traffic, period: int = 1) -> None:
        """``backends`` {backend: :class:`BackendCount`}: the step counted at each counted context with every SDPA
        call run as torch runs it on CUDA under that backend (:mod:`kvcache.measuring.counting.backends`); a backend
        torch's rules reject for the step's calls on every GPU class under every transcribed torch release has
        ``passes`` None
        and ``error`` (their words). ``gpus`` (``--kv-gpus``) {class: :class:`GpuPrediction`}: the backend torch would
        select for the step's calls on that class (:mod:`kvcache.analysing.sdpa.selection`), and the passes counted
        under
        it. A class with a ``period`` is counted over a window of that many steps per backend (amortised, like its
        passes)."""
        s = self.session
        gpus = tuple(getattr(s.settings, "gpus", ()) or ())
        why = self.not_emulated(cache, probe)
        if why:
            if gpus:
                result.update(gpus={gpu: GpuPrediction.of(backend=None, rejected={}, passes=None, by_op={}, error=why)
                                    for gpu in gpus})
            return
        warm = min(s.settings.warmup, COUNT_WARMUP)
        _, spec = s.model()
        choosers = {backend: backends.always(backend) for backend in sdpa_rules.BACKENDS}
        choosers.update({f"gpu:{gpu}": backends.by_rules(gpu) for gpu in gpus})
        runs = {name: EmulatedRun() for name in choosers}
        for context in contexts:  # one point open at a time: no count sees another point's state on the model
            dp = s.open(cache, context, warmup=warm, steps=len(choosers) * period + 1)
            try:
                for name, chooser in choosers.items():
                    for _ in range(period):
                        self._emulated_step(runs[name], context, dp, warm, chooser)
            finally:
                dp.release()
        calls = [call for backend in sdpa_rules.BACKENDS for call in runs[backend].calls]
        counted = {backend: self._backend_entry(backend, runs[backend], calls, spec)
                   for backend in sdpa_rules.BACKENDS}
        result.update(backends=counted)
        if gpus:
            result.update(gpus={gpu: self._gpu_entry(gpu, runs[f"gpu:{gpu}"], runs["math"].calls, counted, spec)
                                for gpu in gpus})

    def _emulated_step(self, run: EmulatedRun, context: int, dp: Any, warm: int, chooser: backends.Chooser) -> None:
        """One step of the point ``dp`` (opened at ``context``) counted with SDPA emulated by ``chooser``, added to
        ``run``'s count at ``context`` with the logical KV bytes held after it."""
        emulation = backends.Emulation(chooser)
        with emulation.active():
            step = dp.count_step(warm)
        run.counts.setdefault(context, traffic.TrafficCount()).merge(step)
        run.held[context] = run.held.get(context, 0.0) + self.session.held(context, dp.position)
        run.calls.extend(emulation.calls)
        run.chosen.extend(emulation.chosen)

    def _passes(self, run: EmulatedRun, spec: Any) -> Traffic:
        return traffic.counted_passes(run.counts, spec.bytes_per_token, kv_bytes=run.held)

    def _backend_entry(self, backend: str, run: EmulatedRun, calls: list[sdpa_rules.SdpaCall],
                       spec: Any) -> BackendCount:
        why = sdpa_rules.rejected_everywhere(backend, calls) if calls else None
        if why:
            return BackendCount.of(passes=None, by_op={}, error=why)
        counted = self._passes(run, spec)
        return BackendCount.of(passes=counted.passes, by_op=counted.by_op)

    def _gpu_entry(self, gpu: str, mixed: EmulatedRun, calls: list[sdpa_rules.SdpaCall],
                   counted: dict[str, BackendCount], spec: Any) -> GpuPrediction:
        """One GPU class: the backend its rules select for the step's calls (every call of every counted step),
        ``rejected`` {backend ahead of it: torch's reason} of the first call, and the passes counted under it (the
        backend's own count when every call selects it, else ``mixed``: the step counted with each call under its
        own)."""
        selections = [sdpa_rules.select(call, gpu) for call in calls]
        chosen = {sel.backend for sel in selections}
        first = selections[0] if selections else sdpa_rules.Selection("math")
        if len(chosen) == 1:
            own = counted[first.backend]
            return GpuPrediction.of(backend=first.backend, rejected=dict(first.rejected), passes=own.passes,
                                    by_op=own.by_op)
        count = self._passes(mixed, spec)
        return GpuPrediction.of(backend="mixed", rejected=dict(first.rejected), passes=count.passes,
                                by_op=count.by_op,
                                by_call={b: mixed.chosen.count(b) for b in sdpa_rules.BACKENDS if b in mixed.chosen})

    def _steps(self, cache: str, contexts: tuple[int, ...], *, probe_at: int | None = None,
               scopes: dict[Any, str] | None = None) -> CountedSteps:
        """One counted step of ``cache`` at each context (ops charged to the modules of ``scopes`` too), after
        ``min(--kv-warmup, COUNT_WARMUP)`` uncounted ones; with the memory of the counted step."""
        s = self.session
        _, spec = s.model()
        warm = min(s.settings.warmup, COUNT_WARMUP)
        out = CountedSteps()
        for context in contexts:
            tracker = memory.MemoryTracker(s.device.type)  # the memory of the counted step (its region only)
            with tracker:
                if s.generating:  # warmed up inside the counted generate call
                    dp = s.open(cache, context, warmup=0, steps=leading_steps(warm) + 1)
                else:
                    dp = s.open(cache, context, warmup=warm, steps=1)
                out.counts[context] = dp.count_step(warm, scopes)
            if tracker.step is not None:
                out.memory[context], out.scopes[context] = tracker.step, tracker.scopes
            out.tokens[context] = dp.position  # after the step: the tokens its attention read
            out.stored[context] = compat.stored_bytes(dp.cache)
            if dp.strategy is not None:
                self.tokens_per_step = dp.strategy.tokens_per_step(dp)
            if context == probe_at:
                out.probe = probe_point(dp, warm, spec.heads, spec.kv_heads).record()
            dp.release()
        return out

    def _add_held_and_stored(self, cache: str, steps: CountedSteps, result: Traffic) -> None:
        """Set ``kv_bytes`` {context: logical KV bytes the batch holds}; with a left-padded batch also
        ``allocated_bytes``, ``allocated_passes`` (per byte of the padded rectangle: equal to passes without
        padding) and ``batch``; ``stored_bytes`` {context: bytes stored} and ``stored_passes`` (Δ step bytes /
        Δ bytes stored; None when storage did not grow)."""
        s = self.session
        spec, counts, tokens, stored = s.spec(), steps.counts, steps.tokens, steps.stored
        contexts = sorted(counts)
        lo, hi = contexts[0], contexts[-1]
        result.update(kv_bytes={str(c): s.held(c, tokens[c]) for c in contexts})
        if s.batch.size > 1 and caches.get(cache).pads:
            allocated = {c: s.batch.allocated_bytes(spec, c, tokens[c] - c) for c in contexts}
            result.update(allocated_bytes={str(c): allocated[c] for c in contexts},
                          allocated_passes=(counts[hi].total - counts[lo].total) / (allocated[hi] - allocated[lo]),
                          batch=ServedBatch.of(size=s.batch.size, ragged=s.batch.ragged))
        if stored:
            delta = stored[hi] - stored[lo]
            result.update(stored_bytes={str(c): stored[c] for c in contexts},
                          stored_passes=(counts[hi].total - counts[lo].total) / delta if delta > 0 else None)

    def _memory(self, cache: str, steps: CountedSteps) -> Memory | None:
        """``kv.memory.<cache>`` from the memory of the counted steps (:func:`memory.memory_passes`): slopes per
        live KV byte, and with a left-padded batch per allocated KV byte too (``per_allocated``); None when fewer
        than two steps were measured."""
        measured = steps.memory
        if len(measured) < 2:
            return None
        s = self.session
        spec, cache_spec = s.spec(), caches.get(cache)
        held = {c: s.held(c, steps.tokens[c]) for c in measured}
        layer_bytes = [layer.bytes_per_token for layer in spec.layer_kv] or [1] * spec.layers
        copies = attention.copies_factor(steps.probe, spec.heads, spec.kv_heads, layer_bytes)
        padded = s.batch.size > 1 and cache_spec.pads
        allocated = {c: s.batch.allocated_bytes(spec, c, steps.tokens[c] - c) for c in measured} if padded else None
        # the declared factor is per allocated KV byte: a ragged batch's peak is checked against the padded rectangle
        out = memory.memory_passes(measured, held, declared_factor=cache_spec.memory_factor, attention_factor=copies,
                                   factor_bytes=allocated)
        if allocated is not None:
            per = memory.memory_passes(measured, allocated)
            out.update(per_allocated=MemorySlopes.of(allocated_passes=per.allocated_passes,
                                                     peak_passes=per.peak_passes, held_passes=per.held_passes,
                                                     peak_factor=per.peak_factor))
        return out

    def _add_kinds(self, cache: str, steps: CountedSteps, scopes: dict[Any, str], result: Traffic,
                   measured: Memory | None) -> None:
        """Passes per layer kind (``kinds``), against the logical KV bytes each kind holds (sliding layers stop at
        their window, linear state does not grow); then two steps past every window (``beyond``), where sliding
        layers must have stopped growing, in traffic and (``measured``) in held memory."""
        s = self.session
        spec = s.spec()
        contexts = tuple(steps.counts)  # the counted contexts, in order
        kind_layers = spec.kind_layers()
        kinds_held = {kind: {c: s.held(c, steps.tokens[c], kind) for c in contexts} for kind in kind_layers}
        windows = {kind: value["window"] for kind, value in spec.kinds_dict().items()}
        far = spec.beyond_windows(contexts)
        beyond = beyond_held = None
        if far:
            past = self._steps(cache, far, scopes=scopes)
            beyond = past.counts
            beyond_held = {kind: {c: s.held(c, past.tokens[c], kind) for c in far} for kind in kind_layers}
            far_kv = {str(c): s.held(c, past.tokens[c]) for c in far}
            result.update(beyond=TrafficBeyond.of(contexts=list(far), kv_bytes=far_kv,
                                                  step_bytes={str(c): beyond[c].total for c in far}))
            if measured and len(past.memory) == len(far):  # past every window: a sliding layer must hold no more
                held_far = {c: past.memory[c].held for c in far}
                measured.update(beyond=MemoryBeyond.of(contexts=list(far), held={str(c): held_far[c] for c in far},
                                                       held_growth_bytes=held_far[far[-1]] - held_far[far[0]],
                                                       kv_bytes=far_kv))
        if measured and len(steps.memory) == len(contexts):
            measured.update(kinds=memory.kind_memory(steps.scopes, kind_layers, kinds_held))
        result.update(kinds=traffic.kind_passes(steps.counts, kind_layers, kinds_held, windows=windows, beyond=beyond,
                                                beyond_held=beyond_held))
