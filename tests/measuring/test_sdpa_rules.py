"""The transcription of torch's SDPA backend rules (``kvcache.analysing.sdpa.selection``), case by case: each row is a
call, a GPU class (``t4@2.12``: under torch 2.12's rules; the release is named in every row, so that the cases do not
depend on the installed torch), the backend torch selects and the start of its reason for every backend ahead of it
(the words of torch's debug warnings, ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``). Pure Python."""

from __future__ import annotations

import pytest

from kvcache.analysing.sdpa import selection as rules
from kvcache.analysing.sdpa.selection import SdpaCall, TensorFacts


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


def call_kv(heads: int, key_heads: int, value_heads: int) -> SdpaCall:
    """A decode call under ``enable_gqa`` whose K and V have different head counts."""
    return SdpaCall(tensor((1, heads, 1, 64)), tensor((1, key_heads, 512, 64)), tensor((1, value_heads, 512, 64)),
                    None, 0.0, False, True)


DYNAMIC = call()  # transformers 5.24 DynamicCache decode: enable_gqa, no mask
STATIC = call(heads=3, query_tokens=3, gqa=False, mask=True)  # 5.23+: query heads packed onto the KV heads, a mask
EXPANDED = call(kv_heads=9, gqa=False)  # up to 4.53: K/V repeated to the query heads
BIG_HEADS = call(head_dim=512)  # head_dim > 256 with GQA
KV_APART = call_kv(9, 3, 1)  # 3 key heads, 1 value head

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
    # head dims 129-256 on an H100: cuDNN takes them up to 256 on sm 9.0 from cuDNN 9.10 in 2.9 to 2.12 (their
    # check_cudnn_tensor_shapes), 128 at most in 2.13/2.14 short of cuDNN 9.22 (the 2.13 wheel's is 9.20)
    *[(call(head_dim=d), f"h100@{r}", "cudnn", {}) for d in (136, 256) for r in ("2.9", "2.11", "2.12")],
    (call(head_dim=256), "h100@2.10", "flash", {}),  # cuDNN not first (its wheel's cuDNN is not newer than 9.15.0)
    (call(head_dim=256), "h100@2.13", "flash", {"cudnn": "head_dim should be no more than 128"}),
    (call(head_dim=256), "h100@2.14", "flash", {"cudnn": "head_dim should be no more than 128"}),
    (call(head_dim=264), "h100@2.9", "math", {"cudnn": "head_dim should be no more than 256",
                                               "flash": "Flash attention requires q,k,v", "efficient": "For dense"}),
    # a B200 under 2.5/2.6: flash and efficient stop at sm90 there (cuDNN too, last in the order): math
    *[(DYNAMIC, f"b200@{r}", "math", {
        "flash": "Flash attention only supports gpu architectures in the range [sm80, sm90]. Attempting to run on a "
                 "sm 10.0 gpu.",
        "efficient": "Mem Efficient Attention only supports gpu architectures in the range [sm50, sm90]."})
      for r in ("2.5", "2.6")],
    (STATIC, "b200@2.5", "math", {"flash": "Flash Attention does not support non-null attn_mask.",
                                  "efficient": "Mem Efficient Attention only supports gpu architectures in the range "
                                               "[sm50, sm90]"}),
    (DYNAMIC, "b200@2.7", "flash", {}),
    (DYNAMIC, "h100@2.6", "flash", {}),
    # the storage-offset alignment check (PR #184258, merged 2026-05-18): from 2.13, not before
    *[(call(offset=3, mask=True, kv_heads=9, gqa=False), f"a100@{r}", "efficient", {
        "flash": "Flash Attention does not support"}) for r in ("2.5", "2.9", "2.12")],
    (call(offset=3, mask=True, kv_heads=9, gqa=False), "a100@2.13", "math", {
        "flash": "Flash Attention does not support",
        "efficient": "Mem efficient attention on sm80 or newer requires q, k, and v storage offsets"}),
    (call(offset=3, mask=True, kv_heads=9, gqa=False), "a100@2.14", "math", {
        "flash": "Flash Attention does not support", "efficient": "Mem efficient attention on sm80 or newer"}),
    # cuDNN takes K and V with different head counts (check_batch_size_and_num_heads_dense<true, false>), each
    # dividing the query's; flash requires them equal
    (KV_APART, "h100@2.13", "cudnn", {}),
    (KV_APART, "h100@2.9", "cudnn", {}),
    (KV_APART, "a100@2.13", "math", {"flash": "Both fused kernels require key and value to have the same num_heads",
                                     "efficient": "For dense input"}),
    (call_kv(9, 3, 2), "h100@2.13", "math", {"cudnn": "The number of heads in key/value must divide",
                                             "flash": "Both fused kernels require key and value",
                                             "efficient": "For dense input"}),
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
        assert r.cudnn_head_dims in ("128", "hopper-9.10", "hopper-9.10+sm10x-192", "frontend-d256")
        assert r.offset_alignment or "#184258" in r.evidence
    assert {k for k, r in rules.RULES.items() if r.efficient_gqa} == {"2.14"}
    assert {k for k, r in rules.RULES.items() if r.offset_alignment} == {"2.13", "2.14"}
    assert {k for k, r in rules.RULES.items() if r.newest_sm == (9, 0)} == {"2.5", "2.6"}
    assert {k for k, r in rules.RULES.items() if r.cudnn_head_dims.startswith("hopper")} == {"2.9", "2.10", "2.11",
                                                                                            "2.12"}
    # why #191085 is not in 2.13.0: published 2026-07-08, the PR opened 2026-07-25, and 2.13.0's own header
    assert all(t in rules.RULES["2.13"].evidence for t in ("2026-07-08", "2026-07-25", "sdp_utils_cpp.h"))


def test_the_wheels_cudnn():
    """The 2.13 default wheel bundles cuDNN 9.20.0.48 (9.15.1 was assumed before); 2.11/2.12 keep 9.15.1 assumed."""
    assert rules.WHEEL.cudnn == rules.RULES["2.13"].wheel.cudnn == 92000
    assert rules.RULES["2.12"].wheel.cudnn == rules.RULES["2.11"].wheel.cudnn == 91501
    assert rules.prefers_cudnn((9, 0), rules.WHEEL, rules.RULES["2.13"])  # 9.20 > 9.15.0: cuDNN first on an H100


def test_the_installed_2_13_header_has_no_supports_mqa():
    """Torch 2.13.0's own sdp_utils_cpp.h (shipped in the wheel, CPU builds too): the dense heads check takes
    <supports_gqa, requires_same_num_heads> and no supports_mqa, the parameter PR #191085 passes: #191085 is not
    in 2.13.0. cuDNN's requires_same_num_heads is there too."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        pytest.skip("torch is not installed")
    header = Path(spec.origin).parent / "include/ATen/native/transformers/sdp_utils_cpp.h"
    version = (Path(spec.origin).parent / "version.py").read_text()
    if "__version__ = '2.13." not in version or not header.is_file():
        pytest.skip("not torch 2.13 with its headers")
    text = header.read_text()
    assert "template <bool supports_gqa, bool requires_same_num_heads=true>\ninline bool " \
           "check_batch_size_and_num_heads_dense" in text
    assert "supports_mqa" not in text


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
    limit = rules.cudnn_head_dim_limit
    assert limit("hopper-9.10", (9, 0), rules.Wheel(cudnn=91002), 256, 256) == 256
    assert limit("hopper-9.10", (9, 0), rules.Wheel(cudnn=90800), 256, 256) == 128  # before cuDNN 9.10
    assert limit("hopper-9.10", (10, 0), rules.Wheel(cudnn=91501), 256, 256) == 128  # Hopper only
    assert limit("hopper-9.10", (10, 0), rules.Wheel(cudnn=91501), 192, 128) == 128
    assert limit("hopper-9.10+sm10x-192", (10, 0), rules.Wheel(cudnn=91501), 192, 128) == 192
    assert limit("128", (9, 0), rules.Wheel(cudnn=92300), 256, 256) == 128
    assert limit("frontend-d256", (10, 7), rules.Wheel(cudnn=92400), 256, 256) == 128  # sm 10.7 past cuDNN 9.25


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

    from kvcache.analysing.sdpa import calls as sdpa_calls
    from kvcache.analysing.sdpa import release_facts as sdpa_releases

    for module in (rules, sdpa_releases, sdpa_calls):
        tree = ast.parse(Path(module.__file__).read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(name.split(".")[0] in ("torch", "transformers") for name in names), module.__name__
        assert len(Path(module.__file__).read_text().splitlines()) <= 410, module.__name__  # about 400 at most
