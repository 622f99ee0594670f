"""The transcription of torch 2.13's SDPA backend rules (``kvcache.measuring.sdpa_rules``), case by case: each row
is a call, a GPU class, the backend torch selects and the start of its reason for every backend ahead of it (the
words of torch's debug warnings, ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``). Pure Python."""

from __future__ import annotations

import pytest

from kvcache.measuring import sdpa_rules as rules
from kvcache.measuring.sdpa_rules import SdpaCall, TensorFacts


def tensor(shape, dtype="bfloat16", offset=0, stride=None):
    itemsize = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    if stride is None:
        stride, step = [], 1
        for size in reversed(shape):
            stride.insert(0, step)
            step *= size
    return TensorFacts(tuple(shape), tuple(stride), offset, dtype, itemsize)


def call(heads=9, kv_heads=3, head_dim=64, tokens=512, dtype="bfloat16", mask=False, gqa=True, causal=False,
         offset=0, query_tokens=1):
    q = tensor((1, heads, query_tokens, head_dim), dtype)
    k = tensor((1, kv_heads, tokens, head_dim), dtype, offset)
    m = tensor((1, 1, query_tokens, tokens), dtype) if mask else None
    return SdpaCall(q, k, k, m, 0.0, causal, gqa)


DYNAMIC = call()  # transformers 5.24 DynamicCache decode: enable_gqa, no mask
STATIC = call(heads=3, query_tokens=3, gqa=False, mask=True)  # 5.23+: query heads packed onto the KV heads, a mask
EXPANDED = call(kv_heads=9, gqa=False)  # up to 4.53: K/V repeated to the query heads
BIG_HEADS = call(head_dim=512)  # head_dim > 256 with GQA

CASES = [
    # call, gpu, selected, {rejected backend: start of torch's reason}
    (DYNAMIC, "t4", "math", {"flash": "Flash attention only supports gpu architectures in the range [sm80, sm121]",
                             "efficient": "Expected query, key and value to all be of dtype: {float16, float32}"}),
    (call(dtype="float16"), "t4", "efficient", {"flash": "Flash attention only supports"}),
    (EXPANDED, "t4", "math", {"flash": "Flash attention only supports", "efficient": "Expected query, key"}),
    (call(kv_heads=9, gqa=False, dtype="float16"), "t4", "efficient", {"flash": "Flash attention only supports"}),
    (DYNAMIC, "a100", "flash", {}),
    (DYNAMIC, "a10g", "flash", {}),
    (DYNAMIC, "l4", "flash", {}),
    (DYNAMIC, "sm80", "flash", {}),
    (DYNAMIC, "h100", "cudnn", {}),  # cuDNN first on sm90/sm100 with the default wheel's cuDNN (> 9.15.0)
    (DYNAMIC, "b200", "cudnn", {}),
    (STATIC, "a100", "efficient", {"flash": "Flash Attention does not support non-null attn_mask."}),
    (STATIC, "h100", "cudnn", {}),
    (STATIC, "t4", "math", {"flash": "Flash Attention does not support non-null attn_mask.",
                            "efficient": "Expected query, key"}),
    (BIG_HEADS, "a100", "efficient", {"flash": "Flash attention requires q,k,v to have the same last dimension and "
                                               "to be less than or equal to 256"}),
    (BIG_HEADS, "h100", "efficient", {"cudnn": "head_dim should be no more than 128",
                                      "flash": "Flash attention requires q,k,v"}),
    (call(head_dim=60), "a100", "flash", {}),  # flash pads the head dim to 64; efficient would need 8 | 60
    (call(head_dim=60, mask=True), "a100", "math", {
        "flash": "Flash Attention does not support non-null attn_mask.",
        "efficient": "Mem efficient attention requires last dimension of inputs to be divisible by 8"}),
    (call(offset=3, mask=True), "a100", "math", {
        "flash": "Flash Attention does not support",
        "efficient": "Mem efficient attention on sm80 or newer requires q, k, and v storage offsets"}),
    (call(offset=3, mask=True, dtype="float16"), "t4", "efficient", {"flash": "Flash Attention does not support"}),
    (call(causal=True), "a100", "efficient", {"flash": "Flash attention does not support the is_causal flag when "
                                                       "seqlen_q != seqlen_k"}),
    (call(heads=9, kv_heads=3, gqa=False), "a100", "math", {
        "flash": "For dense input, both fused kernels require query, key and value to have the same num_heads",
        "efficient": "For dense input"}),
    (call(heads=9, kv_heads=4), "a100", "math", {"flash": "The number of heads in key/value must divide",
                                                 "efficient": "The number of heads in key/value must divide"}),
    (call(dtype="float32"), "a100", "efficient", {"flash": "Expected query, key and value to all be of dtype: "
                                                           "{float16, bfloat16}"}),
    (call(tokens=1, mask=True), "h100", "efficient", {"cudnn": "cudnn SDPA does not support key/value sequence "
                                                               "length 1.",
                                                      "flash": "Flash Attention does not support"}),
]


@pytest.mark.parametrize("sdpa_call, gpu, selected, rejected", CASES)
def test_selection_and_reasons(sdpa_call, gpu, selected, rejected):
    got = rules.select(sdpa_call, gpu)
    assert got.backend == selected
    assert list(got.rejected) == list(rejected)
    for backend, start in rejected.items():
        assert got.rejected[backend].startswith(start), got.rejected[backend]


def test_priority_order_follows_the_wheel():
    assert rules.priority_order((8, 0)) == ("flash", "efficient", "math", "cudnn")
    assert rules.priority_order((9, 0))[0] == "cudnn"
    assert rules.priority_order((9, 0), rules.Wheel(cudnn=91002))[0] == "flash"  # cuDNN 9.10: not preferred
    assert rules.priority_order((10, 0), rules.Wheel(cuda=(12, 8)))[0] == "cudnn"
    assert rules.priority_order((10, 3), rules.Wheel(cuda=(12, 8)))[0] == "cudnn"
    assert rules.priority_order((12, 0))[0] == "flash"
    assert rules.priority_order((9, 0), rules.Wheel(cudnn_preferred_env=False))[0] == "flash"


def test_cudnn_head_dim_limit_by_version():
    big = call(head_dim=256)
    assert rules.reason("cudnn", big, (9, 0)) == "head_dim should be no more than 128"
    assert rules.reason("cudnn", big, (9, 0), rules.Wheel(cudnn=92300)) is None
    assert rules.reason("cudnn", big, (8, 0), rules.Wheel(cudnn=92300)) == "head_dim should be no more than 128"


def test_efficient_without_grouped_query_support_falls_back_to_math():
    """The rule of the releases whose efficient backend rejects grouped-query heads
    (``check_batch_size_and_num_heads_dense<false>`` in its dense constraints): on a T4 in float16 a call with
    ``enable_gqa`` goes to math, the K/V expanded beforehand to efficient (transformers #48633)."""
    older = dict(rules.FILTERS)
    older["efficient"] = tuple(rules.check_batch_size_and_num_heads_dense(False)
                               if f.__name__.startswith("check_batch_size") else f for f in rules.EFFICIENT)
    gqa, expanded = call(dtype="float16"), call(kv_heads=9, gqa=False, dtype="float16")
    assert rules.select(gqa, "t4", filters=older).backend == "math"
    assert rules.select(gqa, "t4", filters=older).rejected["efficient"].startswith("For dense input")
    assert rules.select(expanded, "t4", filters=older).backend == "efficient"


def test_round_trip_of_a_call():
    assert SdpaCall.from_dict(STATIC.to_dict()) == STATIC


def test_unknown_gpu_and_release_are_one_line_errors():
    with pytest.raises(rules.RulesError, match=r"unknown GPU class 'v100'; known: t4, a10g"):
        rules.gpu_names("t4,v100")
    with pytest.raises(rules.RulesError, match="names no GPU class"):
        rules.gpu_names(" , ")
    assert rules.gpu_names("T4, a100,t4") == ["t4", "a100"]
    assert rules.check_release("2.13.0+cpu") == "2.13"
    with pytest.raises(rules.RulesError, match=r"transcribed for torch 2.13 only; the installed torch is 2.5.1"):
        rules.check_release("2.5.1")


def test_the_rules_import_no_torch():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(rules.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(name.split(".")[0] in ("torch", "transformers") for name in names)
