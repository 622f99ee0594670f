"""Which ``scaled_dot_product_attention`` backend torch would select on a CUDA GPU class, and why every backend ahead
of it was rejected: a pure-Python transcription of torch's own rules (``sdp_utils.cpp``; each rule names its
function there), per torch release (:data:`RULES`), so that a CPU run can say what a GPU runs. A call is plain
facts (:mod:`kvcache.analysing.sdpa.calls`); the per-release facts, each with its source and evidence, and each
release's default CUDA wheel are data in :mod:`kvcache.analysing.sdpa.release_facts`. :func:`select` answers like
torch's
``select_sdp_backend``; the source commit and the limits: docs/gpu-backends.md."""

from __future__ import annotations

import functools
from typing import Callable

from kvcache.analysing.sdpa.calls import SdpaCall, Selection, TensorFacts  # noqa: F401 - used from here too
from kvcache.analysing.sdpa.release_facts import (  # noqa: F401 - the releases, classes and names, used from here too
    GPUS,
    RULES,
    TRANSCRIBED,
    WHEEL,
    ReleaseRules,
    RulesError,
    Wheel,
    check_release,
    gpu_names,
    installed_release,
)

BACKENDS = ("cudnn", "flash", "efficient", "math")
#: torch's names of the backends in its warnings and enums
TORCH_NAMES = {"cudnn": "cudnn_attention", "flash": "flash_attention", "efficient": "efficient_attention",
               "math": "math"}
HALF = ("float16", "bfloat16")


def resolve(gpu: str) -> tuple[tuple[int, int], ReleaseRules]:
    """``t4`` -> (its compute capability, the installed release's :class:`ReleaseRules`); ``t4@2.12`` -> 2.12's."""
    name, _, release = gpu.partition("@")
    return GPUS[name], RULES[release or installed_release()]


# --- filters: each returns None (passes) or the reason, in the words of torch's TORCH_WARN --------------------------

Filter = Callable[[SdpaCall, tuple[int, int], Wheel], "str | None"]


def _sm_in(cap: tuple[int, int], low: tuple[int, int], high: tuple[int, int]) -> bool:
    """``check_sm_version<lower, upper>`` (sdp_utils.cpp): inclusive."""
    return low <= cap <= high


def check_tensor_shapes(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """``check_tensor_shapes`` (sdp_utils_cpp.h): q, k, v 4-dimensional."""
    dims = (len(c.query.shape), len(c.key.shape), len(c.value.shape))
    if dims == (4, 4, 4):
        return None
    return (f"All fused kernels requires query, key and value to be 4 dimensional, but got Query dim: {dims[0]}, "
            f"Key dim: {dims[1]}, Value dim: {dims[2]} instead.")


def check_for_attn_mask(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """``check_for_attn_mask`` (sdp_utils_cpp.h): flash takes no explicit mask."""
    return "Flash Attention does not support non-null attn_mask." if c.mask is not None else None


def check_head_dim_size_flash(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """``check_head_dim_size_flash<false>`` (sdp_utils.cpp, CUDA): q, k, v head dims equal and at most 256."""
    q, k, v = c.query.shape[-1], c.key.shape[-1], c.value.shape[-1]
    if q == k == v and q <= 256:
        return None
    return ("Flash attention requires q,k,v to have the same last dimension and to be less than or equal to 256. "
            f"Got Query.size(-1): {q}, Key.size(-1): {k}, Value.size(-1): {v} instead.")


def check_hardware_support(backend: str, newest: tuple[int, int]) -> Filter:
    """``check_flash_attention_hardware_support`` (sm80), ``check_mem_efficient_hardware_support`` (sm50),
    ``check_cudnn_hardware_support`` (sm80) (sdp_utils.cpp): ``check_sm_version<lowest, newest>``, inclusive; the
    newest is sm121 at 001f694a, sm90 at 21c3369e (2.5/2.6: :attr:`ReleaseRules.newest_sm`)."""
    words, low = {"flash": ("Flash attention", (8, 0)), "efficient": ("Mem Efficient Attention", (5, 0)),
                  "cudnn": ("cuDNN MHA", (8, 0))}[backend]

    def check(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
        if _sm_in(cap, low, newest):
            return None
        return (f"{words} only supports gpu architectures in the range [sm{low[0]}{low[1]}, sm{newest[0]}{newest[1]}]. "
                f"Attempting to run on a sm {cap[0]}.{cap[1]} gpu.")
    check.__name__ = f"check_{backend}_hardware_support<sm{newest[0]}{newest[1]}>"
    return check


def check_requires_grad_and_head_dim_gt192(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """``check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120`` (sdp_utils.cpp): training only."""
    if not c.requires_grad or not (_sm_in(cap, (8, 6), (8, 9)) or _sm_in(cap, (12, 0), (12, 1))):
        return None
    d = c.query.shape[-1]
    if d <= 192 or (c.dropout == 0.0 and d > 224):
        return None
    return ("Flash attention currently doesn't support training with head_dim ∈ (192, 224] or (head_dim ∈ (224, 256] "
            "and dropout > 0.0) on gpu architectures in the range[sm86, sm89].")


def check_flash_causal_non_square_seqlens(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """``check_flash_causal_non_square_seqlens`` (sdp_utils.cpp): is_causal needs seqlen_q == seqlen_k."""
    if c.is_causal and c.query.shape[-2] != c.key.shape[-2]:
        return (f"Flash attention does not support the is_causal flag when seqlen_q != seqlen_k. Got seqlen_q: "
                f"{c.query.shape[-2]} seqlen_k: {c.key.shape[-2]}.")
    return None


def _dtype_reason(c: SdpaCall, allowed: tuple[str, ...]) -> str | None:
    """``check_tensor_dtype`` (sdp_utils_cpp.h)."""
    if c.query.dtype == c.key.dtype == c.value.dtype and c.query.dtype in allowed:
        return None
    shown = ", ".join(allowed)
    return (f"Expected query, key and value to all be of dtype: {{{shown}}}. Got Query dtype: {c.query.dtype}, "
            f"Key dtype: {c.key.dtype}, and Value dtype: {c.value.dtype} instead.")


def check_dtypes_low_precision(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """``check_dtypes_low_precision`` (sdp_utils.cpp): fp16/bf16 from sm80, fp16 below; also flash's dtypes
    (``check_dtypes_flash_attention``: fp8 only with FA3, off by default)."""
    return _dtype_reason(c, HALF if cap[0] >= 8 else ("float16",))


def check_batch_size_and_num_heads_dense(supports_gqa: bool, supports_mqa: bool = False,
                                         requires_same_num_heads: bool = True) -> Filter:
    """``check_batch_size_and_num_heads_dense<supports_gqa, requires_same_num_heads, supports_mqa>``
    (sdp_utils_cpp.h), with ``check_grouped_query_attention<requires_same_num_heads>`` under ``enable_gqa``: cuDNN
    passes ``requires_same_num_heads = false`` (K and V head counts may differ, each dividing the query's; the
    template parameter is in the installed 2.13.0's header), flash and efficient the default ``true``;
    ``supports_mqa`` (PR #191085): a single K/V head passes without ``enable_gqa``."""

    def check(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
        q, k, v = c.query.shape, c.key.shape, c.value.shape
        if not (q[0] == k[0] == v[0]):
            return (f"For dense inputs, both fused kernels require query, key and value to have the same batch_size. "
                    f"Query.sizes(): {list(q)}, Key.sizes(): {list(k)}, Value.sizes(): {list(v)} instead.")
        if c.enable_gqa and supports_gqa:
            if requires_same_num_heads and k[-3] != v[-3]:
                return ("Both fused kernels require key and value to have the same num_heads and batch_size but got: "
                        f"Key sizes: {list(k)}, Value sizes: {list(v)}, Query sizes: {list(q)} instead.")
            if q[-3] % k[-3] or (not requires_same_num_heads and q[-3] % v[-3]):
                return ("The number of heads in key/value must divide number of heads in query.Got input Key sizes(): "
                        f"{k[-3]}, Value sizes(): {v[-3]}, Query sizes(): {q[-3]} instead.")
            return None
        if supports_mqa and k[-3] == v[-3] == 1 and q[-3] > 0:
            return None
        if not (q[-3] == k[-3] == v[-3]):
            return ("For dense input, both fused kernels require query, key and value to have the same num_heads. "
                    f"Query.sizes(): {list(q)}, Key sizes(): {list(k)}, Value sizes(): {list(v)} instead. To "
                    "broadcast dense inputs, try using unsqueeze and expand_to before passing them into the kernel.")
        return None
    check.__name__ = (f"check_batch_size_and_num_heads_dense<{str(supports_gqa).lower()}, "
                      f"{str(requires_same_num_heads).lower()}{', supports_mqa' if supports_mqa else ''}>")
    return check


def check_nonzero_sequence_lengths_dense(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """``check_nonzero_sequence_lengths_dense`` (sdp_utils_cpp.h)."""
    if c.query.shape[-2] == 0 or c.key.shape[-2] == 0:
        return "All fused kernels do not support zero seq_len_q or seq_len_kv."
    return None


def check_last_dim_stride_equals_1_dense(ignore_singleton_dim: bool) -> Filter:
    """``check_last_dim_stride_equals_1_dense<ignore_singleton_dim>`` (sdp_utils_cpp.h): q, k, v (and on CUDA the
    mask) with stride 1 along the last dimension."""

    def check(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
        ok = c.query.stride[-1] == 1 and c.key.stride[-1] == 1 and c.value.stride[-1] == 1
        if ignore_singleton_dim:
            ok = ok or c.query.shape[-1] == 1
        mask_ok = c.mask is None or c.mask.stride[-1] == 1
        if ok and mask_ok:
            return None
        return ("All fused kernels require the last dimension of the input to have stride 1. Got Query.stride(-1): "
                f"{c.query.stride[-1]}, Key.stride(-1): {c.key.stride[-1]}, Value.stride(-1): {c.value.stride[-1]}")
    check.__name__ = f"check_last_dim_stride_equals_1_dense<{str(ignore_singleton_dim).lower()}>"
    return check


def minimum_gemm_alignment(c: SdpaCall, cap: tuple[int, int]) -> int:
    """``minimum_gemm_alignment`` (sdp_utils.cpp): elements; 8 for half types on tensor cores (sm70+), 4 from sm80."""
    is_half = c.query.dtype in HALF
    use_tc = cap[0] >= 8 or (cap[0] >= 7 and is_half)
    alignment = 4 if cap[0] >= 8 else 1
    if use_tc:
        alignment = max(alignment, 128 // (16 if is_half else 32))
    return alignment


def check_head_dim_size_mem_efficient(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """``check_head_dim_size_mem_efficient`` (sdp_utils.cpp, CUDA): q and k head dims equal, q and v head dims
    divisible by :func:`minimum_gemm_alignment` (no upper bound on CUDA)."""
    q, k, v = c.query.shape[-1], c.key.shape[-1], c.value.shape[-1]
    alignment = minimum_gemm_alignment(c, cap)
    if q == k and q % alignment == 0 and q > 0 and v % alignment == 0 and v > 0:
        return None
    return (f"Mem efficient attention requires last dimension of inputs to be divisible by {alignment}. Got "
            f"Query.size(-1): {q}, Key.size(-1): {k}, Value.size(-1): {v} instead.")


def check_data_ptr_alignment_mem_efficient(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """``check_data_ptr_alignment_mem_efficient`` (sdp_utils.cpp, from PR #184258: 2.13 on,
    :attr:`ReleaseRules.offset_alignment`): from sm80, storage offset × element size of q, k and v aligned to
    minimum_gemm_alignment × element size bytes (base pointers are 256-byte aligned)."""
    if cap[0] < 8:
        return None
    alignment = minimum_gemm_alignment(c, cap) * c.query.itemsize
    offsets = [t.offset * t.itemsize % alignment for t in (c.query, c.key, c.value)
               if t.offset * t.itemsize % alignment and all(t.shape)]
    if not offsets:
        return None
    q, k, v = (t.offset * t.itemsize % alignment for t in (c.query, c.key, c.value))
    return ("Mem efficient attention on sm80 or newer requires q, k, and v storage offsets * element_size to be "
            f"aligned to {alignment} bytes. Got query.storage_offset() * element_size % alignment_bytes: {q}, "
            f"key.storage_offset() * element_size % alignment_bytes: {k}, "
            f"value.storage_offset() * element_size % alignment_bytes: {v}.")


def check_mem_efficient_dtypes(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """The last test of ``can_use_mem_efficient_attention`` (sdp_utils.cpp): fp16/fp32/bf16 from sm80, fp16/fp32
    below."""
    return _dtype_reason(c, ("float16", "float32", "bfloat16") if cap[0] >= 8 else ("float16", "float32"))


def check_attn_mask_shape(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """``check_attn_mask_shape`` (sdp_utils_cpp.h): a 2-d or 4-d mask broadcastable to (B, H, L, S)."""
    m = c.mask
    if m is None:
        return None
    b, h, lq, lk = c.query.shape[0], c.query.shape[1], c.query.shape[2], c.key.shape[2]
    shape_text = ("Please use the following attn mask shapes: 2d - ({Q_seq_len, 1}  x {KV_seq_len, 1}); "
                  "4d - ({Batch, 1} x {Num_heads, 1} x {Q_seq_len, 1}  x {KV_seq_len, 1})")
    if m.shape[-2] not in (lq, 1) or m.shape[-1] not in (lk, 1):
        return shape_text
    if len(m.shape) == 2 or (len(m.shape) == 4 and m.shape[0] in (1, b) and m.shape[1] in (1, h)):
        return None
    return shape_text


def check_cudnn_dropout(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
    """``check_cudnn_dropout`` (sdp_utils.cpp): a multiple of 1/16."""
    if c.dropout * 16.0 == int(c.dropout * 16.0):
        return None
    return ("cuDNN dropout probability resolution is limited to 1/16.Use a dropout probability that is a multiple of "
            "1/16 to select the cuDNN backend")


def cudnn_head_dim_limit(rule: str, cap: tuple[int, int], w: Wheel, d_qk: int, d_v: int) -> int:
    """The head-dim limit of ``check_cudnn_tensor_shapes`` under :attr:`ReleaseRules.cudnn_head_dims`: ``128``
    (21c3369e); ``hopper-9.10`` (2.9: 256 on sm 9.0 from cuDNN 9.10, 'Hopper: head_dim<=256 support with cuDNN >=
    9.10.0'); ``hopper-9.10+sm10x-192`` (2.10-2.12: that, and 192 for a 192/128 head on sm 10.x from cuDNN 9.11);
    ``frontend-d256`` (001f694a: 256 on sm 9.0/10.x, sm 10.7 only past cuDNN 9.25, with cuDNN newer than 9.22 and
    frontend 1.24; 192 for 192/128 there from cuDNN 9.11)."""
    if rule.startswith("hopper-9.10"):
        if w.cudnn >= 91000 and cap == (9, 0):
            return 256
        sm10x_192 = rule.endswith("sm10x-192") and w.cudnn >= 91100 and cap[0] == 10
        return 192 if sm10x_192 and (d_qk, d_v) == (192, 128) else 128
    if rule != "frontend-d256":
        return 128
    sm90_or_10x = cap == (9, 0) or cap[0] == 10
    if sm90_or_10x and not (cap == (10, 7) and w.cudnn <= 92500) and w.cudnn > 92200 and w.cudnn_frontend_d256:
        return 256
    return 192 if sm90_or_10x and w.cudnn >= 91100 and (d_qk, d_v) == (192, 128) else 128


def check_cudnn_tensor_shapes(head_dims: str) -> Filter:
    """``check_cudnn_tensor_shapes`` (sdp_utils.cpp): batch and heads ≤ 65535, head dims ≤ the release's limit
    (:func:`cudnn_head_dim_limit`) and multiples of 8, key/value length not 1."""

    def check(c: SdpaCall, cap: tuple[int, int], w: Wheel) -> str | None:
        b, h = c.query.shape[0], c.query.shape[1]
        if b > 65535 or h > 65535:
            return (f"cuDNN SDPA does not support batch size or num_heads greater than 65535. Got batch size: {b}, "
                    f"num_heads: {h}")
        s_q, s_k, d_qk, d_v = c.query.shape[2], c.key.shape[2], c.query.shape[3], c.value.shape[3]
        if w.cudnn < 8903:
            return "SDPA fprop requires cudnn 8.9.3 or higher"
        limit = cudnn_head_dim_limit(head_dims, cap, w, d_qk, d_v)
        if d_qk > limit or d_v > limit:
            return f"head_dim should be no more than {limit}"
        if d_qk % 8 or d_v % 8:
            return "head_dim should be a multiple of 8"
        if w.cudnn < 90000 and s_q < 64:
            return "s_q less than 64 is not supported before cudnn 9.0.0"
        if s_k == 1:
            return "cudnn SDPA does not support key/value sequence length 1."
        if c.dropout != 0.0 and s_q == 1:
            return "cudnn SDPA does not support query sequence length 1 with dropout."
        return None
    check.__name__ = f"check_cudnn_tensor_shapes<{head_dims}>"
    return check


@functools.cache
def filters_of(rules: ReleaseRules) -> dict[str, tuple[Filter, ...]]:
    """``can_use_flash_attention``, ``can_use_mem_efficient_attention``, ``can_use_cudnn_attention``
    (sdp_utils.cpp) under ``rules``: their filters in torch's order (the runtime switches, nested-tensor and device
    checks pass on a dense CUDA call with the default switches, and are left out)."""
    mqa = rules.efficient_gqa  # the release whose efficient backend takes GQA takes a single K/V head in all three
    newest = rules.newest_sm
    flash = (
        check_tensor_shapes, check_for_attn_mask, check_head_dim_size_flash, check_hardware_support("flash", newest),
        check_requires_grad_and_head_dim_gt192, check_flash_causal_non_square_seqlens, check_dtypes_low_precision,
        check_batch_size_and_num_heads_dense(True, mqa), check_nonzero_sequence_lengths_dense,
        check_last_dim_stride_equals_1_dense(True))
    efficient = (
        check_hardware_support("efficient", newest), check_tensor_shapes, check_head_dim_size_mem_efficient,
        *((check_data_ptr_alignment_mem_efficient,) if rules.offset_alignment else ()),
        check_nonzero_sequence_lengths_dense, check_last_dim_stride_equals_1_dense(False),
        check_batch_size_and_num_heads_dense(rules.efficient_gqa, mqa), check_mem_efficient_dtypes)
    cudnn = (
        check_tensor_shapes, check_dtypes_low_precision, check_attn_mask_shape, check_hardware_support("cudnn", newest),
        check_cudnn_dropout, check_nonzero_sequence_lengths_dense, check_last_dim_stride_equals_1_dense(True),
        check_batch_size_and_num_heads_dense(True, mqa, requires_same_num_heads=False),
        check_cudnn_tensor_shapes(rules.cudnn_head_dims))
    return {"flash": flash, "efficient": efficient, "cudnn": cudnn}


def prefers_cudnn(cap: tuple[int, int], w: Wheel = WHEEL, rules: ReleaseRules | None = None) -> bool:
    """``check_prefer_cudnn_attention`` (sdp_utils.cpp) of ``rules``' release (the installed one by default):
    ``cudnn-9.15.1``: cuDNN newer than 9.15.0 on sm9x/sm10x (with CUDA < 13 only minor 0 or 3), unless
    ``TORCH_CUDNN_SDPA_DEPRIORITIZED``; ``sm90-sm100``: compute capability 9.0 or 10.0 (cuDNN 9.9 or newer at build);
    ``never``."""
    rules = rules or RULES[installed_release()]
    if rules.cudnn_first == "never" or not w.cudnn_preferred_env:
        return False
    if rules.cudnn_first == "sm90-sm100":
        return w.cudnn >= 90900 and cap in ((9, 0), (10, 0))
    right_major = cap[0] in (9, 10)
    if w.cuda < (13, 0):
        right_major = right_major and cap[1] in (0, 3)
    return w.cudnn > 91500 and right_major


def priority_order(cap: tuple[int, int], w: Wheel = WHEEL, rules: ReleaseRules | None = None) -> tuple[str, ...]:
    """``priority_order`` (sdp_utils.cpp) over the global context's default order (flash, efficient, math, cuDNN;
    ATen/Context.h): cuDNN, flash, efficient, math where :func:`prefers_cudnn`."""
    if prefers_cudnn(cap, w, rules):
        return ("cudnn", "flash", "efficient", "math")
    return ("flash", "efficient", "math", "cudnn")


def reason(backend: str, call: SdpaCall, cap: tuple[int, int], w: Wheel = WHEEL,
           filters: dict[str, tuple[Filter, ...]] | None = None) -> str | None:
    """Why ``backend`` cannot take ``call`` on compute capability ``cap`` (the first failing filter's words, under
    ``filters``, by default the installed release's), or None when it can. Math always can."""
    if backend == "math":
        return None
    for check in (filters or filters_of(RULES[installed_release()]))[backend]:
        why = check(call, cap, w)
        if why:
            return why
    return None


def select(call: SdpaCall, gpu: str, w: Wheel | None = None,
           filters: dict[str, tuple[Filter, ...]] | None = None) -> Selection:
    """``select_sdp_backend`` (sdp_utils.cpp) for ``call`` on GPU class ``gpu`` (``t4``: under the installed torch
    release's rules; ``t4@2.12``: under 2.12's, with its default wheel): the first backend of
    :func:`priority_order` that can take it, and the reason of every one ahead of it."""
    cap, rules = resolve(gpu)
    return select_on(call, cap, w or rules.wheel, filters, rules)


def select_on(call: SdpaCall, cap: tuple[int, int], w: Wheel = WHEEL,
              filters: dict[str, tuple[Filter, ...]] | None = None, rules: ReleaseRules | None = None) -> Selection:
    """:func:`select` on compute capability ``cap`` (a device's own, ``torch.cuda.get_device_capability()``),
    under ``rules`` (the installed release's by default)."""
    rules = rules or RULES[installed_release()]
    filters = filters or filters_of(rules)
    rejected: dict[str, str] = {}
    for backend in priority_order(cap, w, rules):
        why = reason(backend, call, cap, w, filters)
        if why is None:
            return Selection(backend, rejected)
        rejected[backend] = why
    return Selection("math", rejected)  # not reached: math takes every call


def rejected_everywhere(backend: str, calls: list[SdpaCall]) -> str | None:
    """Why torch's rules reject ``backend`` for some of ``calls`` on every GPU class under every transcribed release
    (the reason on the most capable class under the installed release's rules), or None when some class and release
    takes every call. Math is never rejected."""
    if backend == "math":
        return None
    for rules in dict.fromkeys(RULES.values()):
        filters = filters_of(rules)
        for cap in GPUS.values():
            if all(reason(backend, call, cap, rules.wheel, filters) is None for call in calls):
                return None
    newest = max(GPUS, key=GPUS.get)
    why = next((r for r in (reason(backend, call, GPUS[newest]) for call in calls) if r), None)
    return f"torch's rules reject {backend} for this step on every GPU class ({newest}: {why})"
