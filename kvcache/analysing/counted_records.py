"""The records of the counted parts of a run's ``kv`` section (layout: docs/records.md; JSON Schema:
``kv.schema.json``): counted traffic (bytes read + written per logical KV byte: passes), the counts of a compiled
step, counted memory and the attention probe. Stdlib only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcache.analysing.jsonrecord import Reader, Record, absent_field, extra_field, object_of


@dataclass(frozen=True)
class Counted:
    """The counted figure a class is judged and recorded by (:meth:`Traffic.counted`): ``passes``, ``by_op``
    ({op or kernel: passes}) and, when passes is None, why (``why_missing``)."""

    passes: float | None
    by_op: dict[str, float]
    why_missing: str | None = None


@dataclass
class Traffic(Record):
    """``kv.traffic.<cache>``: counted passes (bytes read + written by one step's ops per logical KV byte), per
    op, between ``contexts``; ``step_bytes`` {context: {read, written}} in bytes, ``calls`` {op: calls}.

    Counted overhead of one step: ``ops_per_step`` (ATen ops from the model's forward call to its return) and
    ``data_ops_per_step`` (those that moved data); ``fixed_bytes`` (bytes that do not grow with context, the
    counted intercept), ``weight_passes`` = fixed bytes / ``weight_bytes``; ``layers`` of the model. ``kv_bytes``
    {context: logical KV bytes held} (the denominator), ``stored_bytes``/``stored_passes`` (bytes actually stored,
    passes per stored byte), ``beyond`` (steps past every sliding window), ``kinds`` (per layer kind), ``compiled``
    (--kv-compile: the compiled step's unfused and fused counts), ``allocated_bytes``/``allocated_passes``/``batch``
    (--kv-batch: the left-padded batch), ``backends`` ({backend: {passes, by_op}}: the step under each SDPA backend a
    CUDA GPU runs), ``gpus`` (--kv-gpus: {GPU class: {backend, rejected, passes, by_op}}): see kv.schema.json."""

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
    beyond: dict[str, Any] | None = None
    kinds: dict[str, dict[str, Any]] | None = None
    compiled: CompiledTraffic | None = None
    allocated_bytes: dict[str, float] | None = None
    allocated_passes: float | None = None
    batch: dict[str, Any] | None = None
    backends: dict[str, dict[str, Any]] | None = None
    gpus: dict[str, dict[str, Any]] | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"compiled": CompiledTraffic.from_json}

    def gpu_counted(self) -> dict[str, Counted]:
        """``gpus`` (--kv-gpus) as the counted figure of each GPU class: the passes counted under the SDPA backend
        torch would select there, per op; ``why_missing`` when the class was not predicted."""
        return {gpu: Counted(entry.get("passes"), dict(entry.get("by_op") or {}), entry.get("error"))
                for gpu, entry in (self.gpus or {}).items()}

    def counted(self) -> Counted:
        """The counted figure the class is judged (and recorded) by: under ``--kv-compile`` the fused count of the
        compiled step (``compiled.fused``: what runs, per kernel), otherwise the eager count."""
        if self.compiled is None:
            return Counted(self.passes, dict(self.by_op))
        fused = self.compiled.fused
        if fused is None:
            return Counted(None, {}, self.compiled.error)
        return Counted(fused.passes, dict(fused.by_kernel), self.compiled.error or fused.error)


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
    """``kv.memory.<cache>``: counted memory of the counted step (``kvcache.measuring.memory``), each figure the
    slope of the step's bytes against the KV bytes held between the counted ``contexts``, in bytes per KV byte:
    ``allocated_passes`` (bytes the step allocates), ``peak_passes`` (its high-water mark above what was live before
    it), ``held_passes`` (bytes live after it), per op in ``allocated_by_op``/``peak_by_op``; ``peak_factor`` (bytes
    live at its peak per KV byte) against the class's ``declared_factor`` plus ``attention_factor`` (the attention's
    own K/V copies, where it expands them) (``factor_problem`` when it needs more);
    ``steps`` per context, ``source``, ``allocator`` (CUDA statistics), ``per_allocated`` (--kv-batch, per allocated
    KV byte), ``beyond`` (sliding windows: bytes held past every window), ``kinds`` (per layer kind: allocated and
    held passes): see kv.schema.json."""

    allocated_passes: float | None = None
    peak_passes: float | None = None
    held_passes: float | None = None
    peak_factor: float | None = None
    allocated_by_op: dict[str, float] = field(default_factory=dict)
    peak_by_op: dict[str, float] = field(default_factory=dict)
    contexts: list[int] | None = None
    kv_bytes: dict[str, float] | None = None
    steps: dict[str, MemoryStep] | None = None
    source: str | None = None
    declared_factor: float | None = None
    attention_factor: float | None = None
    factor_problem: str | None = None
    allocator: dict[str, Any] | None = None
    per_allocated: dict[str, Any] | None = None
    beyond: dict[str, Any] | None = None
    kinds: dict[str, dict[str, Any]] | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = absent_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"steps": object_of(MemoryStep.from_json)}


@dataclass
class MemoryStep(Record):
    """``kv.memory.<cache>.steps.<context>``: bytes of one counted step: live when it started (``before``),
    ``allocated`` by it, its high-water mark above before (``peak``), live after it (``held``); per op (``by_op``,
    ``peak_by_op``); ``allocator``: torch.cuda's statistics of the same step (CUDA)."""

    before: int | None = None
    allocated: int | None = None
    peak: int | None = None
    held: int | None = None
    by_op: dict[str, int] = field(default_factory=dict)
    peak_by_op: dict[str, int] = field(default_factory=dict)
    allocator: dict[str, int] | None = None
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


