"""Counted overhead of one decode step (deterministic): ATen ops from the model's forward call to its return,
fixed bytes (the counted intercept) and weight passes, on synthetic counts and on whole steps."""

from __future__ import annotations

import pytest
import torch

from kvcache.analysing.settings import Settings
from kvcache.measuring.counting import traffic
from kvcache.measuring.devices import Device
from kvcache.measuring.session import KVSession
from kvcache.testing import classes


def test_fixed_bytes_are_the_counted_intercept_and_weight_passes_their_share_of_the_weights():
    per_token, weights = 1000, 4_000_000

    def step(tokens: int) -> traffic.TrafficCount:
        c = traffic.TrafficCount()
        c.add("cat", tokens * per_token, tokens * per_token)  # 2 passes
        c.add("mm", weights, 10_000)                          # each weight read once, a small output
        return c

    result = traffic.counted_passes({256: step(256), 512: step(512)}, per_token, layers=2, weight_bytes=weights)
    assert result.passes == pytest.approx(2.0)
    assert result.fixed_bytes == weights + 10_000
    assert result.weight_passes == pytest.approx(1.0025)
    assert result.layers == 2
    assert result.ops_per_step is None  # nothing was counted inside a forward scope


def test_scopes_charge_the_ops_of_the_running_module_only():
    inner = torch.nn.Linear(4, 4)

    def fn():
        x = torch.ones(1, 4)  # outside the module's forward
        return inner(x).sum()

    _, count = traffic.count(fn, scopes={inner: traffic.FORWARD})
    forward = count.scope(traffic.FORWARD)
    assert 0 < forward.calls < count.calls
    assert "ones" not in forward.ops and "sum" not in forward.ops and "ones" in count.ops
    assert count.scope("never-ran").calls == 0


def test_a_lookup_reads_the_rows_it_selects_not_the_table():
    table = torch.randn(1000, 8)
    _, count = traffic.count(torch.nn.functional.embedding, torch.tensor([3]), table)
    entry = count.ops["embedding"]
    row = 8 * 4
    assert (entry.read, entry.written) == (row + 8, row)  # the row and one int64 index; the row written


def test_a_gather_by_advanced_indexing_reads_the_rows_it_selects():
    """``pool[:, rows]`` (aten.index, a paged cache's gather of its live rows up to 5.5) reads the selected rows and
    its index, not the pool, and writes the gathered copy; index_select (5.6+) is charged the same."""
    pool = torch.randn(3, 1000, 8)
    rows = torch.tensor([5, 9, 11, 400])
    gathered = 3 * 4 * 8 * 4
    _, count = traffic.count(lambda: pool[:, rows])
    assert (count.ops["index"].read, count.ops["index"].written) == (gathered + 4 * 8, gathered)
    _, count = traffic.count(torch.index_select, pool, 1, rows)
    assert (count.ops["index_select"].read, count.ops["index_select"].written) == (gathered + 4 * 8, gathered)


@pytest.fixture(scope="module")
def counted(one_torch_thread):
    """Counted traffic of ``tiny`` per class (counted at 256 and 512 tokens), computed once."""
    session = KVSession(Settings(model="tiny", device="cpu", warmup=1), Device.from_choice("cpu"))
    found: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in found:
            found[name] = session.count(name)
        return found[name]

    get.session = session
    return get


def test_a_step_reads_each_weight_about_once(counted):
    dynamic = counted("dynamic")
    assert dynamic.weight_bytes == counted.session.spec().weight_bytes
    assert 1.0 <= dynamic.weight_passes < 1.05  # the rest: activations, float32 logits, norms
    assert dynamic.data_ops_per_step < dynamic.ops_per_step < sum(dynamic.calls.values())


def test_three_tiny_ops_per_layer_add_ops_not_passes(counted):
    clean, extra = counted("twin-clean"), counted("twin-extra-ops")
    layers = clean.layers
    assert extra.ops_per_step - clean.ops_per_step == classes.ExtraOpsCache.EXTRA_OPS * layers
    assert extra.passes == pytest.approx(clean.passes, abs=1e-9)
    assert extra.weight_passes == pytest.approx(clean.weight_passes, abs=1e-4)


@pytest.mark.parametrize("model", ["tiny", "smollm2-135m"])
def test_reading_the_embeddings_once_more_raises_weight_passes_by_their_share(one_torch_thread, model):
    session = KVSession(Settings(model=model, device="cpu", warmup=1, caches=("dynamic",)),
                        Device.from_choice("cpu"))
    before = session.count("dynamic")
    built, spec = session.model()
    share = built.get_input_embeddings().weight.numel() * spec.dtype_bytes / spec.weight_bytes
    handle = classes.read_embeddings_each_step(built)
    try:
        after = session.count("dynamic")
    finally:
        handle.remove()
    assert after.weight_passes - before.weight_passes == pytest.approx(share, rel=1e-3)
    assert after.passes == pytest.approx(before.passes)
    if model == "smollm2-135m":
        assert share == pytest.approx(0.21, abs=0.005)
