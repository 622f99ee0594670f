"""The transcription of torch's SDPA backend rules (``kvcache.analysing.sdpa_rules``), case by case: each row is a
call, a GPU class (``t4@2.12``: under torch 2.12's rules; the release is named in every row, so that the cases do not
depend on the installed torch), the backend torch selects and the start of its reason for every backend ahead of it
(the words of torch's debug warnings, ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``). Pure Python."""

from __future__ import annotations

import pytest

from kvcache.analysing import sdpa_rules as rules
from kvcache.analysing.sdpa_rules import SdpaCall, TensorFacts


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
    # call, gpu@release, selected, {rejected backend: start of torch's reason}; torch 2.13 (the installed release)
    (DYNAMIC, "t4@2.13", "math", {"flash": "Flash attention only supports gpu architectures in the range [sm80, sm121]",
                                  "efficient": "For dense input"}),  # torch checks the heads before the dtype
    (DYNAMIC, "t4@2.14", "math", {"flash": "Flash attention only supports",
                                  "efficient": "Expected query, key and value to all be of dtype: {float16, float32}"}),
    (call(dtype="float16"), "t4@2.13", "math", {
        "flash": "Flash attention only supports",
        "efficient": "For dense input, both fused kernels require query, key and value to have the same num_heads"}),
    (EXPANDED, "t4@2.13", "math", {"flash": "Flash attention only supports", "efficient": "Expected query, key"}),
    (call(kv_heads=9, gqa=False, dtype="float16"), "t4@2.13", "efficient", {"flash": "Flash attention only supports"}),
    (DYNAMIC, "a100@2.13", "flash", {}),
    (DYNAMIC, "a10g@2.13", "flash", {}),
    (DYNAMIC, "l4@2.13", "flash", {}),
    (DYNAMIC, "sm80@2.13", "flash", {}),
    (DYNAMIC, "h100@2.13", "cudnn", {}),  # cuDNN first on sm90/sm100 with the default wheel's cuDNN (> 9.15.0)
    (DYNAMIC, "b200@2.13", "cudnn", {}),
    (STATIC, "a100@2.13", "efficient", {"flash": "Flash Attention does not support non-null attn_mask."}),
    (STATIC, "h100@2.13", "cudnn", {}),
    (STATIC, "t4@2.13", "math", {"flash": "Flash Attention does not support non-null attn_mask.",
                                 "efficient": "Expected query, key"}),
    (BIG_HEADS, "a100@2.13", "math", {"flash": "Flash attention requires q,k,v to have the same last dimension and "
                                               "to be less than or equal to 256",
                                      "efficient": "For dense input, both fused kernels require"}),
    (BIG_HEADS, "h100@2.13", "math", {"cudnn": "head_dim should be no more than 128",
                                      "flash": "Flash attention requires q,k,v", "efficient": "For dense input"}),
    (call(head_dim=512, kv_heads=9, gqa=False), "a100@2.13", "efficient", {"flash": "Flash attention requires"}),
    (call(head_dim=60), "a100@2.13", "flash", {}),  # flash pads the head dim to 64; efficient would need 8 | 60
    (call(head_dim=60, mask=True), "a100@2.13", "math", {
        "flash": "Flash Attention does not support non-null attn_mask.",
        "efficient": "Mem efficient attention requires last dimension of inputs to be divisible by 8"}),
    (call(offset=3, mask=True), "a100@2.13", "math", {
        "flash": "Flash Attention does not support",
        "efficient": "Mem efficient attention on sm80 or newer requires q, k, and v storage offsets"}),
    (call(offset=3, mask=True, dtype="float16", kv_heads=9, gqa=False), "t4@2.13", "efficient", {
        "flash": "Flash Attention does not support"}),
    (call(causal=True), "a100@2.13", "math", {"flash": "Flash attention does not support the is_causal flag when "
                                                       "seqlen_q != seqlen_k", "efficient": "For dense input"}),
    (call(heads=9, kv_heads=3, gqa=False), "a100@2.13", "math", {
        "flash": "For dense input, both fused kernels require query, key and value to have the same num_heads",
        "efficient": "For dense input"}),
    (call(heads=9, kv_heads=4), "a100@2.13", "math", {"flash": "The number of heads in key/value must divide",
                                                      "efficient": "For dense input"}),
    (call(dtype="float32", kv_heads=9, gqa=False), "a100@2.13", "efficient", {
        "flash": "Expected query, key and value to all be of dtype: {float16, bfloat16}"}),
    (call(tokens=1, mask=True, kv_heads=9, gqa=False), "h100@2.13", "efficient", {
        "cudnn": "cudnn SDPA does not support key/value sequence length 1.",
        "flash": "Flash Attention does not support"}),
]

# the same calls under other releases' rules: the differences are data (sdpa_rules.RULES) on one transcription
RELEASE_CASES = [
    # transformers 4.54 on a T4 in float16 (#48633): grouped-query heads reach efficient only from 2.14 (PR #191085)
    *[(call(dtype="float16"), f"t4@{r}", "math", {"flash": "Flash attention only supports",
                                                  "efficient": "For dense input, both fused kernels require"})
      for r in ("2.5", "2.8", "2.9", "2.10", "2.12", "2.13")],
    (call(dtype="float16"), "t4@2.14", "efficient", {"flash": "Flash attention only supports"}),
    # transformers 4.53: K/V expanded beforehand, efficient in every release
    *[(call(kv_heads=9, gqa=False, dtype="float16"), f"t4@{r}", "efficient", {"flash": "Flash attention only"})
      for r in ("2.5", "2.12", "2.13", "2.14")],
    # head_dim 512 with GQA (PR #46960): math on every class until 2.14, efficient from it
    (BIG_HEADS, "a100@2.12", "math", {"flash": "Flash attention requires q,k,v", "efficient": "For dense input"}),
    (BIG_HEADS, "a100@2.14", "efficient", {"flash": "Flash attention requires q,k,v"}),
    (BIG_HEADS, "h100@2.14", "efficient", {"cudnn": "head_dim should be no more than 128",
                                           "flash": "Flash attention requires q,k,v"}),
    (BIG_HEADS, "h100@2.5", "math", {"flash": "Flash attention requires q,k,v", "efficient": "For dense input"}),
    (call(heads=9, kv_heads=4), "a100@2.14", "math", {"flash": "The number of heads in key/value must divide",
                                                      "efficient": "The number of heads in key/value must divide"}),
    # cuDNN first on sm90/sm100: not before 2.9; from 2.9 (minor 0); not in 2.10 (its wheel's cuDNN is too old)
    (DYNAMIC, "h100@2.5", "flash", {}),
    (DYNAMIC, "h100@2.9", "cudnn", {}),
    (DYNAMIC, "b200@2.9", "cudnn", {}),
    (DYNAMIC, "h100@2.10", "flash", {}),
    (DYNAMIC, "h100@2.11", "cudnn", {}),
    (STATIC, "h100@2.8", "efficient", {"flash": "Flash Attention does not support non-null attn_mask."}),
    (STATIC, "h100@2.12", "cudnn", {}),
    # a single K/V head without enable_gqa: fused only from 2.14 (implicit MQA, PR #191085)
    (call(kv_heads=1, gqa=False), "a100@2.13", "math", {"flash": "For dense input", "efficient": "For dense input"}),
    (call(kv_heads=1, gqa=False), "a100@2.14", "flash", {}),
]


@pytest.mark.parametrize("sdpa_call, gpu, selected, rejected", CASES + RELEASE_CASES)
def test_selection_and_reasons(sdpa_call, gpu, selected, rejected):
    got = rules.select(sdpa_call, gpu)
    assert got.backend == selected
    assert list(got.rejected) == list(rejected)
    for backend, start in rejected.items():
        assert got.rejected[backend].startswith(start), got.rejected[backend]


def test_a_bare_class_takes_the_installed_release_rules(monkeypatch):
    monkeypatch.setattr(rules, "installed_release", lambda: "2.14")
    assert rules.select(call(dtype="float16"), "t4").backend == "efficient"
    monkeypatch.setattr(rules, "installed_release", lambda: "2.12")
    assert rules.select(call(dtype="float16"), "t4").backend == "math"


def test_every_release_names_its_source_and_evidence():
    assert rules.TRANSCRIBED == ("2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14")
    for r in rules.RULES.values():
        assert "001f694a" in r.source and "#191085" in r.evidence and r.releases
        assert r.cudnn_first in ("never", "sm90-sm100", "cudnn-9.15.1")
    assert {k for k, r in rules.RULES.items() if r.efficient_gqa} == {"2.14"}


def test_priority_order_follows_the_wheel():
    r13 = rules.RULES["2.13"]
    assert rules.priority_order((8, 0), rules.WHEEL, r13) == ("flash", "efficient", "math", "cudnn")
    assert rules.priority_order((9, 0), rules.WHEEL, r13)[0] == "cudnn"
    assert rules.priority_order((9, 0), rules.Wheel(cudnn=91002), r13)[0] == "flash"  # cuDNN 9.10: not preferred
    assert rules.priority_order((10, 0), rules.Wheel(cuda=(12, 8)), r13)[0] == "cudnn"
    assert rules.priority_order((10, 3), rules.Wheel(cuda=(12, 8)), r13)[0] == "cudnn"
    assert rules.priority_order((12, 0), rules.WHEEL, r13)[0] == "flash"
    assert rules.priority_order((9, 0), rules.Wheel(cudnn_preferred_env=False), r13)[0] == "flash"
    r9 = rules.RULES["2.9"]
    assert rules.priority_order((10, 3), r9.wheel, r9)[0] == "flash"  # 2.9: minor 0 only
    assert rules.priority_order((9, 0), rules.Wheel(cudnn=90800), r9)[0] == "flash"  # built with cuDNN < 9.9
    assert rules.priority_order((9, 0), rules.WHEEL, rules.RULES["2.7"])[0] == "flash"


def test_cudnn_head_dim_limit_by_version():
    big = call(head_dim=256)
    assert rules.reason("cudnn", big, (9, 0)) == "head_dim should be no more than 128"
    assert rules.reason("cudnn", big, (9, 0), rules.Wheel(cudnn=92300)) is None
    assert rules.reason("cudnn", big, (8, 0), rules.Wheel(cudnn=92300)) == "head_dim should be no more than 128"


def test_round_trip_of_a_call():
    assert SdpaCall.from_dict(STATIC.to_dict()) == STATIC


def test_unknown_gpu_and_release_are_one_line_errors():
    with pytest.raises(rules.RulesError, match=r"unknown GPU class 'v100'; known: t4, a10g"):
        rules.gpu_names("t4,v100")
    with pytest.raises(rules.RulesError, match="names no GPU class"):
        rules.gpu_names(" , ")
    assert rules.gpu_names("T4, a100,t4") == ["t4", "a100"]
    assert rules.gpu_names("t4,t4@2.12,T4@2.12") == ["t4", "t4@2.12"]
    for bad in ("t4@2.4", "t4@2.15", "t4@", "t4@latest"):
        with pytest.raises(rules.RulesError, match=r"no SDPA rules transcribed for torch '[^']*' \(t4@[^)]*\); "
                                                   r"transcribed: 2.5, 2.6, .*, 2.14$"):
            rules.gpu_names(bad)
    with pytest.raises(rules.RulesError, match=r"unknown GPU class 'v100'"):
        rules.gpu_names("v100@2.12")
    assert rules.check_release("2.13.0+cpu") == "2.13"
    assert rules.check_release("2.5.1") == "2.5"
    with pytest.raises(rules.RulesError, match=r"transcribed for torch 2.5, .*, 2.14 only; the installed torch is "
                                               r"2.4.1"):
        rules.check_release("2.4.1")


def test_the_rules_import_no_torch():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(rules.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(name.split(".")[0] in ("torch", "transformers") for name in names)
