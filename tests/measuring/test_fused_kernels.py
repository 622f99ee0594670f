"""kvcache.measuring.compiled.kernel_bytes: fused bytes per kernel, checked against the code inductor generates.

A two-layer toy of a static-cache decode step (one int64 position counter shared by both layers, each layer
storing one token into its K and V buffers at that position, then attending over them; the counter incremented in
place at the end) compiles, as StaticCache does, to a generated kernel that only adds 1 to the counter
(``cpp_fused_add_copy_…``). Inductor's own ``count_bytes`` charges that kernel the whole K and V buffers it is
ordered after (``WeakDep``): the phantom pass. The suite's count must charge each kernel only the buffers its
generated call passes it, and only what its code touches. One compile, a few seconds."""

from __future__ import annotations

import ast
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch._inductor")

from kvcache.measuring.compiled import forward as compiled  # noqa: E402

HEADS, LENGTH, DIM = 2, 64, 16
F32, I64 = 4, 8
TOKEN = HEADS * DIM * F32  # bytes of one token of K (or V) of one layer: 128
BUFFER = HEADS * LENGTH * DIM * F32  # bytes of one layer's K (or V) buffer: 8 KiB

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def toy_step(k0, v0, k1, v1, pos, x, w):
    """Two layers sharing one position counter, as StaticCache's layers share their write position."""
    h = x
    for k, v in ((k0, v0), (k1, v1)):
        kv = (h @ w).view(1, HEADS, 1, DIM)
        k.index_copy_(2, pos, kv)
        v.index_copy_(2, pos, kv * 2)
        h = torch.nn.functional.scaled_dot_product_attention(kv, k, v).reshape(1, HEADS * DIM)
    pos.add_(1)
    return h @ w


@pytest.fixture(scope="module")
def toy():
    """The toy compiled by the counting backend: (its one GraphRecord, the generated wrapper code)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    caches = [torch.zeros(1, HEADS, LENGTH, DIM) for _ in range(4)]
    args = (*caches, torch.tensor([5]), torch.randn(1, HEADS * DIM), torch.randn(HEADS * DIM, HEADS * DIM))
    backend = compiled.CountingBackend("default", capture=True)
    _, code = run_and_get_code(torch.compile(toy_step, backend=backend, fullgraph=True), *args)
    assert len(backend.graphs) == 1 and backend.graphs[0].error is None
    yield backend.graphs[0], "\n".join(code)
    torch._dynamo.reset()


def calls(code: str, prefix: str) -> list[set[str]]:
    """The buffer names passed to each call of the generated kernels named ``prefix…`` in the wrapper."""
    return [{a.strip() for a in args.split(",")}
            for args in re.findall(rf"\n\s+{prefix}\w*\(([^()]*)\)\n", code)]


def test_the_counter_kernel_is_charged_the_counter_only(toy):
    graph, code = toy
    counter = [k for k in graph.kernels if k.origins == ("add", "copy_")]
    assert len(counter) == 1, [(k.name, k.origins) for k in graph.kernels]
    kernel = counter[0]
    # The generated kernel: its call passes only the counter, its signature holds only int64 pointers, and its body
    # has no loop (one element loaded, one stored).
    (passed,) = calls(code, "cpp_fused_add_copy_")
    assert len(passed) == 1
    signature = re.search(r"cpp_fused_add_copy_\w* = async_compile.cpp_pybinding\((\[[^]]*\])", code).group(1)
    assert set(ast.literal_eval(signature)) <= {"const int64_t*", "int64_t*"}, signature
    body = code[code.index("cpp_fused_add_copy_"):]
    body = body[:body.index("''')")]
    assert "for(" not in body
    # The suite's count: that buffer, one int64 read and one written. (Inductor's count_bytes charged it the K and
    # V buffers of both layers, 4 x 8 KiB more, through its ordering-only dependencies on them.)
    assert kernel.buffers == {next(iter(passed)): 2 * I64}
    assert kernel.name == "kernel add+copy_"
    assert kernel.inductor_bytes >= 4 * BUFFER  # the phantom this count leaves out, as inductor still has it


def test_each_kernel_is_charged_what_its_call_passes(toy):
    graph, code = toy
    stores = [k for k in graph.kernels if "index_copy" in k.origins]
    passed = calls(code, "cpp_fused_index_copy")
    assert len(stores) == len(passed) == 2
    for kernel, args in zip(stores, passed):
        assert set(kernel.buffers) == args  # the counter, the new token, K and V: keyed as the call names them
        # One token stored into K and one into V (an indirect store at the counter, not the 8 KiB buffers), the new
        # token read once, the counter read once.
        assert sorted(kernel.buffers.values()) == [I64, TOKEN, TOKEN, TOKEN]
    attention = [k for k in graph.kernels if k.name == "extern scaled_dot_product_attention"]
    assert [sorted(k.buffers.values()) for k in attention] == [[TOKEN, TOKEN, BUFFER, BUFFER]] * 2
    assert graph.fused_bytes == sum(k.bytes for k in graph.kernels) < graph.inductor_bytes
