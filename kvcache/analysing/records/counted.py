"""The records of the counted parts of a run's ``kv`` section (layout: docs/records.md; JSON Schema:
``kv.schema.json``): counted traffic (bytes read + written per logical KV byte: passes), the counts of a compiled
step, counted memory and the attention probe. Stdlib only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcache.analysing.records.drafted import DraftTraffic
from kvcache.analysing.records.jsonrecord import Reader, Record, absent_field, extra_field, object_of
from kvcache.analysing.records.step_parts import AmortisedTraffic, PhaseTraffic, PrefillTraffic


@dataclass(frozen=True)
class Counted:
    """The counted figure a class is judged and recorded by (:meth:`Traffic.counted`): ``passes``, ``by_op``
    ({op or kernel: passes}) and, when passes is None, why (``why_missing``: no fused count of a compiled step, or a
    step that does not grow with context)."""

    passes: float | None
    by_op: dict[str, float]
    why_missing: str | None = None


@dataclass
class Traffic(Record):
    """``kv.traffic.<cache>``: counted passes (bytes read + written by one step's ops per logical KV byte), per
    op, between ``contexts``; ``step_bytes`` {context: {read, written}} in bytes, ``calls`` {op: calls}.

    Counted overhead of one step: ``ops_per_step`` (ATen ops from the model's forward call to its return) and
    ``data_ops_per_step`` (those that moved data); ``host_syncs_per_step`` (ops of the whole step that make the host
    wait for the device on CUDA: ``.item()``, ``nonzero``, a device-to-host copy...) and ``host_syncs`` {op: calls};
    ``fixed_bytes`` (bytes that do not grow with context, the
    counted intercept), ``weight_passes`` = fixed bytes / ``weight_bytes``; ``layers`` of the model. ``kv_bytes``
    {context: logical KV bytes held} (the denominator), ``stored_bytes``/``stored_passes`` (bytes actually stored,
    passes per stored byte), ``beyond`` (steps past every sliding window: :class:`TrafficBeyond`), ``kinds`` (per
    layer kind: :class:`KindTraffic`), ``compiled`` (--kv-compile: the compiled step's unfused and fused counts),
    ``allocated_bytes``/``allocated_passes``/``batch`` (--kv-batch: the left-padded batch, :class:`ServedBatch`),
    ``backends`` ({backend: :class:`BackendCount`}: the step under each SDPA backend a CUDA GPU runs), ``gpus``
    (--kv-gpus: {GPU class: :class:`GpuPrediction`}), ``fill`` (``prefill`` where the class declares a real
    prefill and the run's ``--kv-fill`` is ``synthetic``); ``not_growing``: why ``passes`` is None though the step
    was counted (its bytes do not grow with context); ``amortised`` (a class with a period: the steps of a window
    covering it, :class:`AmortisedTraffic`). A key decoded other than greedily (``<cache>#<strategy>``,
    --kv-decoding) adds ``strategy``, ``rows`` (sequences the cache holds per --kv-batch sequence: beams),
    ``tokens_per_step`` and ``passes_per_token`` (passes / tokens each sequence gained in the step), ``phases``
    ({forward, reorder, crop, draft: :class:`PhaseTraffic`}), for chunked prefill ``prefill``
    (:class:`PrefillTraffic`) and for assisted decoding and prompt lookup ``draft`` (:class:`DraftTraffic`): see
    kv.schema.json."""

    passes: float | None
    by_op: dict[str, float] = field(default_factory=dict)
    contexts: list[int] | None = None
    bytes_per_token: int | None = None
    step_bytes: dict[str, dict[str, int]] | None = None
    calls: dict[str, int] | None = None
    ops_per_step: int | None = None
    data_ops_per_step: int | None = None
    fixed_bytes: int | None = None
    weight_bytes: int | None = None
    weight_passes: float | None = None
    layers: int | None = None
    kv_bytes: dict[str, float] | None = None
    stored_bytes: dict[str, int] | None = None
    stored_passes: float | None = None
    beyond: TrafficBeyond | None = None
    kinds: dict[str, KindTraffic] | None = None
    compiled: CompiledTraffic | None = None
    allocated_bytes: dict[str, float] | None = None
    allocated_passes: float | None = None
    batch: ServedBatch | None = None
    backends: dict[str, BackendCount] | None = None
    gpus: dict[str, GpuPrediction] | None = None
    fill: str | None = None  # the fill of its points where it is not the run's --kv-fill (a class needing a prefill)
    strategy: str | None = None
    rows: int | None = None
    tokens_per_step: float | None = None
    passes_per_token: float | None = None
    phases: dict[str, PhaseTraffic] | None = None
    prefill: PrefillTraffic | None = None
    host_syncs_per_step: int | None = None
    host_syncs: dict[str, int] | None = None
    not_growing: str | None = None
    amortised: AmortisedTraffic | None = None
    draft: DraftTraffic | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"beyond": TrafficBeyond.from_json, "kinds": object_of(KindTraffic.from_json),
                "compiled": CompiledTraffic.from_json, "batch": ServedBatch.from_json,
                "backends": object_of(BackendCount.from_json), "gpus": object_of(GpuPrediction.from_json),
                "phases": object_of(PhaseTraffic.from_json), "prefill": PrefillTraffic.from_json,
                "amortised": AmortisedTraffic.from_json, "draft": DraftTraffic.from_json}

    def gpu_counted(self) -> dict[str, Counted]:
        """``gpus`` (--kv-gpus) as the counted figure of each GPU class: the passes counted under the SDPA backend
        torch would select there, per op; ``why_missing`` when the class was not predicted."""
        return {gpu: Counted(entry.passes, dict(entry.by_op), entry.error) for gpu, entry in (self.gpus or {}).items()}

    def counted(self) -> Counted:
        """The counted figure the class is judged (and recorded) by: under ``--kv-compile`` the fused count of the
        compiled step (``compiled.fused``: what runs, per kernel), otherwise the eager count."""
        if self.compiled is None:
            return Counted(self.passes, dict(self.by_op), self.not_growing)
        fused = self.compiled.fused
        error = self.compiled.error if fused is None else self.compiled.error or fused.error
        why = f"no fused count of the compiled step: {error}" if error else None
        if fused is None:
            return Counted(None, {}, why)
        return Counted(fused.passes, dict(fused.by_kernel), why)


@dataclass
class TrafficBeyond(Record):
    """``kv.traffic.<cache>.beyond`` (and ``kinds.<kind>.beyond``): steps counted past every sliding window, at
    ``contexts`` (tokens): ``step_bytes`` {context: bytes read + written by the step (by that kind's layers)},
    ``kv_bytes`` {context: logical KV bytes held}; per kind, ``growth_bytes``: how many more bytes the step moved at
    the larger context than at the smaller (0: the kind stopped growing)."""

    contexts: list[int] | None = None
    step_bytes: dict[str, int] | None = None
    kv_bytes: dict[str, float] | None = None
    growth_bytes: int | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class KindTraffic(Record):
    """``kv.traffic.<cache>.kinds.<kind>`` (full, sliding, linear): counted traffic of one kind of layer: ``passes``
    = Δ bytes read + written while its ``layers`` ran / Δ logical KV bytes they hold, per op in ``by_op``; None with
    ``grows`` False when they hold no more (a linear-attention state), ``growth_bytes`` the bytes their step changed
    by; ``window`` (tokens) and ``stops_growing_at`` (tokens: the window, 0 for linear state); ``step_bytes`` and
    ``kv_bytes`` {context: bytes}; ``beyond``: their steps past every sliding window."""

    layers: int | None = None
    window: int | list[int] | None = None
    passes: float | None = None
    by_op: dict[str, float] = field(default_factory=dict)
    grows: bool | None = None
    growth_bytes: int | None = None
    stops_growing_at: int | None = None
    step_bytes: dict[str, int] | None = None
    kv_bytes: dict[str, float] | None = None
    beyond: TrafficBeyond | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"beyond": TrafficBeyond.from_json}


@dataclass
class ServedBatch(Record):
    """``kv.traffic.<cache>.batch`` (--kv-batch N, a padded class): the batch the counted step served: ``size``
    sequences, ``ragged`` (lengths differ, left-padded to the longest)."""

    size: int | None = None
    ragged: bool | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class BackendCount(Record):
    """``kv.traffic.<cache>.backends.<backend>`` (cudnn, flash, efficient, math): the step counted with every SDPA
    call run as torch runs it on CUDA under that backend: ``passes`` (bytes read + written per KV byte), per op in
    ``by_op``; passes None with ``error`` (torch's words) when its rules reject the backend for the step's calls on
    every GPU class."""

    passes: float | None = None
    by_op: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class GpuPrediction(Record):
    """``kv.traffic.<cache>.gpus.<GPU class>`` (--kv-gpus): the SDPA ``backend`` torch's rules select for the step's
    calls there (None: not predicted, with ``error``; ``mixed``: calls differ, ``by_call`` {backend: calls}),
    ``rejected`` {backend ahead of it: torch's reason}, and the counted ``passes`` under it (bytes read + written per
    KV byte), per op in ``by_op``."""

    backend: str | None = None
    rejected: dict[str, str] = field(default_factory=dict)
    passes: float | None = None
    by_op: dict[str, float] = field(default_factory=dict)
    by_call: dict[str, int] | None = None
    error: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class FusedCount(Record):
    """``kv.traffic.<cache>.compiled.fused``: bytes the compiled step's kernels read and write (their loads and
    stores) per KV byte: ``passes``; ``by_kernel`` {kernel: passes}; ``origins`` {kernel: the ATen ops fused into it};
    ``step_bytes`` {context: bytes}; ``inductor_passes``: inductor's own count of the same kernels, for reference."""

    passes: float | None
    by_kernel: dict[str, float] = field(default_factory=dict)
    origins: dict[str, list[str]] | None = None
    step_bytes: dict[str, int] | None = None
    error: str | None = None
    inductor_passes: float | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class CompiledTraffic(Record):
    """``kv.traffic.<cache>.compiled`` (--kv-compile): the compiled step counted ``unfused`` (the post-grad graph's
    ATen ops by the suite's rules, a :class:`Traffic`) and ``fused`` (what its kernels load and store), kernels and
    graphs per step, ``compile_s`` (seconds compiling); or ``error`` when the class does not compile."""

    mode: str
    runs_as: str | None = None
    fullgraph: bool | None = None
    unfused: Traffic | None = None
    fused: FusedCount | None = None
    kernels_per_step: int | None = None
    graphs_per_step: int | None = None
    compile_s: float | None = None
    error: str | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"unfused": Traffic.from_json, "fused": FusedCount.from_json}


@dataclass
class Memory(Record):
    """``kv.memory.<cache>``: counted memory of the counted step (``kvcache.measuring.counting.memory``), each figure
    the slope of the step's bytes against the KV bytes held between the counted ``contexts``, in bytes per KV byte:
    ``allocated_passes`` (bytes the step allocates), ``peak_passes`` (its high-water mark above what was live before
    it), ``held_passes`` (bytes live after it; ``held_new_passes``: of them, in storages the step made: a cache that
    moved to a new allocation), per op in ``allocated_by_op``/``peak_by_op``; ``peak_factor`` (bytes
    live at its peak per KV byte) against the class's ``declared_factor`` plus ``attention_factor`` (the attention's
    own K/V copies, where it expands them) (``factor_problem`` when it needs more);
    ``steps`` per context, ``source``, ``allocator`` (CUDA: the same from torch.cuda's statistics,
    :class:`MemorySlopes`), ``per_allocated`` (--kv-batch, a padded class: per allocated KV byte,
    :class:`MemorySlopes`), ``beyond`` (sliding windows: bytes held past every window, :class:`MemoryBeyond`),
    ``kinds`` (per layer kind: :class:`KindMemory`): see kv.schema.json."""

    allocated_passes: float | None = None
    peak_passes: float | None = None
    held_passes: float | None = None
    peak_factor: float | None = None
    allocated_by_op: dict[str, float] = field(default_factory=dict)
    held_new_passes: float | None = None
    peak_by_op: dict[str, float] = field(default_factory=dict)
    contexts: list[int] | None = None
    kv_bytes: dict[str, float] | None = None
    steps: dict[str, MemoryStep] | None = None
    source: str | None = None
    declared_factor: float | None = None
    attention_factor: float | None = None
    factor_problem: str | None = None
    allocator: MemorySlopes | None = None
    per_allocated: MemorySlopes | None = None
    beyond: MemoryBeyond | None = None
    kinds: dict[str, KindMemory] | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"steps": object_of(MemoryStep.from_json), "allocator": MemorySlopes.from_json,
                "per_allocated": MemorySlopes.from_json, "beyond": MemoryBeyond.from_json,
                "kinds": object_of(KindMemory.from_json)}


@dataclass
class MemorySlopes(Record):
    """``kv.memory.<cache>.allocator`` (CUDA: from torch.cuda's allocator statistics) and ``per_allocated``
    (--kv-batch, a padded class: per allocated KV byte): the counted step's memory figures, each a slope in bytes per
    KV byte between the counted contexts: ``allocated_passes`` (bytes the step allocates), ``peak_passes`` (its
    high-water mark above what was live before it), ``held_passes`` (bytes live after it) and ``peak_factor`` (bytes
    live at its peak per KV byte: cache sizes; per allocated KV byte in ``per_allocated``, what a padded batch's
    declared memory_factor is checked against)."""

    allocated_passes: float | None = None
    peak_passes: float | None = None
    held_passes: float | None = None
    peak_factor: float | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class MemoryBeyond(Record):
    """``kv.memory.<cache>.beyond`` (models with sliding windows): the counted steps past every window, at
    ``contexts`` (tokens): bytes live after each (``held`` {context: bytes}), how many more bytes were held at the
    larger context than at the smaller (``held_growth_bytes``: 0 when sliding layers stopped growing) and the
    logical KV bytes held (``kv_bytes`` {context: bytes})."""

    contexts: list[int] | None = None
    held: dict[str, int] | None = None
    held_growth_bytes: int | None = None
    kv_bytes: dict[str, float] | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class KindMemory(Record):
    """``kv.memory.<cache>.kinds.<kind>`` (models whose layers are not all full attention): the memory of one kind's
    ``layers``: ``allocated_passes`` (bytes allocated while they ran) and ``held_passes`` (bytes held after the step
    in the storages first seen there), each per logical KV byte that kind holds (None where it does not grow), with
    the bytes themselves beside (``allocated_growth_bytes``, ``held_growth_bytes``: largest context minus smallest)."""

    layers: int | None = None
    allocated_passes: float | None = None
    held_passes: float | None = None
    allocated_growth_bytes: int | None = None
    held_growth_bytes: int | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class MemoryStep(Record):
    """``kv.memory.<cache>.steps.<context>``: bytes of one counted step: live when it started (``before``),
    ``allocated`` by it, its high-water mark above before (``peak``), live after it (``held``; ``held_new``: of it,
    in storages the step made); per op (``by_op``, ``peak_by_op``); ``allocator``: torch.cuda's statistics of the
    same step (CUDA)."""

    before: int | None = None
    allocated: int | None = None
    peak: int | None = None
    held: int | None = None
    by_op: dict[str, int] = field(default_factory=dict)
    peak_by_op: dict[str, int] = field(default_factory=dict)
    allocator: dict[str, int] | None = None
    held_new: int | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


@dataclass
class Probe(Record):
    """``kv.probe.<cache>``: what attention received in one step: shapes of its first call (None: no mask),
    how grouped-query attention ran, K/V expansions counted (K and V of each layer), calls per mode."""

    attention: str
    query: list[int] | None = None
    key: list[int] | None = None
    value: list[int] | None = None
    mask: list[int] | None = None
    enable_gqa: bool | None = None
    expansions: int | None = None
    calls: int | None = None
    modes: dict[str, int] | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()


