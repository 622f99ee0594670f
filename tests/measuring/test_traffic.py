"""kvcache.measuring.counting.traffic: the dispatch-level byte counter on operations whose traffic is known by
construction, then counted passes of whole decode steps on the ``tiny`` preset (a planted copy, determinism, the
built-in classes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.analysing.judge import judges  # noqa: E402
from kvcache.analysing.records import Counted  # noqa: E402
from kvcache.analysing.settings import Settings  # noqa: E402
from kvcache.measuring.counting import traffic  # noqa: E402
from kvcache.measuring.devices import Device  # noqa: E402
from kvcache.measuring.session import KVSession  # noqa: E402

F32 = 4  # bytes per float32 element
I64 = 8  # bytes per int64 index


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def counted(fn, *args):
    """The TrafficCount of ``fn(*args)`` (inputs are made outside the counted region)."""
    return traffic.count(fn, *args)[1]


def op(count: traffic.TrafficCount, name: str) -> tuple[int, int, int]:
    entry = count.ops[name]
    return entry.calls, entry.read, entry.written


def moving_ops(count: traffic.TrafficCount) -> dict[str, tuple[int, int]]:
    """Ops that moved any bytes: name -> (read, written)."""
    return {name: (o.read, o.written) for name, o in count.ops.items() if o.total}


# --- single operations, traffic known by construction ---------------------------------------------

def test_cat_append_reads_old_and_new_writes_both():
    old, new = torch.randn(1, 3, 100, 64), torch.randn(1, 3, 1, 64)
    count = counted(lambda: torch.cat([old, new], dim=-2))
    old_b, new_b = 3 * 100 * 64 * F32, 3 * 1 * 64 * F32
    assert op(count, "cat") == (1, old_b + new_b, old_b + new_b)
    assert moving_ops(count) == {"cat": (old_b + new_b, old_b + new_b)}
    # the step moves the old cache twice (read + write): the "2 passes" of a cat-based append
    assert count.total == 2 * (old_b + new_b)


def test_slice_write_charges_the_slice_and_source_not_the_buffer():
    buf, x, n = torch.zeros(1, 3, 128, 64), torch.randn(1, 3, 1, 64), 40
    count = counted(lambda: buf[:, :, n:n + 1].copy_(x))
    slice_b = 3 * 64 * F32
    assert op(count, "copy_") == (1, slice_b, slice_b)  # reads the source, writes the slice, not the buffer
    assert count.total == 2 * slice_b
    assert count.total < buf.numel() * F32 / 50
    assert torch.equal(buf[:, :, n:n + 1], x)


def test_index_copy_charges_only_the_source_rows():
    buf, src = torch.zeros(1, 3, 4096, 64), torch.randn(1, 3, 2, 64)
    index = torch.tensor([7, 8])
    count = counted(lambda: buf.index_copy_(2, index, src))
    rows_b = 3 * 2 * 64 * F32
    assert op(count, "index_copy_") == (1, rows_b + 2 * I64, rows_b)
    assert count.total == 2 * rows_b + 2 * I64


def test_a_gather_of_k_of_n_rows_charges_the_k_rows_and_its_indices():
    """``gather``/``take_along_dim`` read one element per index (k rows of n), not the whole input (issue 48)."""
    n, k, width = 4096, 3, 64
    table, rows = torch.randn(1, 3, n, width), torch.tensor([5, 900, 4000])
    index = rows[None, None, :, None].expand(1, 3, k, width)  # broadcast: its 3 indices read once
    count = counted(lambda: torch.gather(table, 2, index))
    rows_b = 3 * k * width * F32
    assert op(count, "gather") == (1, rows_b + k * I64, rows_b)
    dense = rows[None, None, :, None].repeat(1, 3, 1, width)  # a materialised index: every element read
    count = counted(lambda: torch.take_along_dim(table, dense, dim=2))
    assert count.ops["gather"].read == rows_b + dense.numel() * I64 and count.ops["gather"].written == rows_b
    assert count.total < table.numel() * F32 / 50


@pytest.mark.parametrize("lookup", ["index_select", "index", "embedding", "take"])
def test_every_lookup_charges_the_elements_it_selects(lookup):
    table, idx = torch.randn(4096, 64), torch.tensor([3, 7, 9, 11])
    fn = {"index_select": lambda: table.index_select(0, idx), "index": lambda: table[idx],
          "embedding": lambda: torch.nn.functional.embedding(idx, table), "take": lambda: torch.take(table, idx)}
    count = counted(fn[lookup])
    selected = (4 if lookup == "take" else 4 * 64) * F32
    assert op(count, lookup) == (1, selected + 4 * I64, selected)


def test_an_embedding_bag_reads_one_row_per_index():
    table, idx, offsets = torch.randn(4096, 64), torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([0, 3])
    count = counted(lambda: torch.nn.functional.embedding_bag(idx, table, offsets, mode="sum"))
    (name, entry), = count.ops.items()
    assert name.startswith("_embedding_bag")
    assert entry.read == 6 * 64 * F32 + 8 * I64  # six rows, six indices and two offsets
    assert entry.read < table.numel() * F32 / 50


def test_scatter_and_index_add_charge_the_elements_they_store():
    """``scatter_`` stores one element per index; ``scatter_add_``/``index_add_`` also read what they update."""
    buf, src, idx = torch.zeros(4096, 64), torch.randn(4, 64), torch.tensor([3, 7, 9, 11])
    index = idx[:, None].expand(4, 64)
    stored = 4 * 64 * F32
    assert op(counted(lambda: buf.scatter_(0, index, src)), "scatter_") == (1, stored + 4 * I64, stored)
    assert op(counted(lambda: buf.scatter_add_(0, index, src)), "scatter_add_") == (1, 2 * stored + 4 * I64, stored)
    assert op(counted(lambda: buf.index_add_(0, idx, src)), "index_add_") == (1, 2 * stored + 4 * I64, stored)


@pytest.mark.parametrize("inference", [False, True])
def test_host_syncs_are_the_ops_a_gpu_host_would_wait_for(inference):
    """``.item()``, ``bool(t)``, ``nonzero``, a boolean-mask index, ``unique``: one host sync each; ``.cpu()`` of a CPU
    tensor dispatches nothing (never counted on CPU); an ordinary op or a mask fill is none."""
    x, mask = torch.randn(64), torch.randn(64) > 0
    syncing = {"item": lambda: x.sum().item(), "bool": lambda: bool(x[0] > 0), "nonzero": lambda: mask.nonzero(),
               "index": lambda: x[mask], "index_put_": lambda: x.clone().index_put_((mask,), torch.tensor(0.0)),
               "unique": lambda: torch.unique(x), "masked_select": lambda: x.masked_select(mask)}
    quiet = {"cpu": lambda: x.cpu(), "add": lambda: x + 1, "masked_fill": lambda: x.masked_fill(mask, 0.0),
             "index_select": lambda: x.index_select(0, torch.tensor([1, 2]))}
    with torch.inference_mode(inference):
        for what, fn in syncing.items():
            assert counted(fn).host_syncs == 1, (what, dict(counted(fn).syncs))
        for what, fn in quiet.items():
            assert counted(fn).host_syncs == 0, (what, dict(counted(fn).syncs))


def test_index_put_with_sliced_leading_dims():
    """``buf[:, :, idx] = src`` stores every element of ``src`` (both ``:`` dims count whole)."""
    buf, src = torch.zeros(1, 3, 4096, 64), torch.randn(1, 3, 2, 64)
    index = torch.tensor([5, 6])

    def put():
        buf[:, :, index] = src

    count = counted(put)
    rows_b = 3 * 2 * 64 * F32
    assert op(count, "index_put_") == (1, rows_b + 2 * I64, rows_b)
    assert moving_ops(count) == {"index_put_": (rows_b + 2 * I64, rows_b)}
    assert torch.equal(buf[:, :, 5:7], src)


def test_index_put_with_broadcast_indices_and_trailing_dims():
    buf = torch.zeros(4, 8, 16)
    rows, cols = torch.tensor([[0], [2]]), torch.tensor([1, 3, 5])  # broadcast to 2 x 3 positions
    values = torch.randn(2, 3, 16)
    count = counted(lambda: buf.index_put_((rows, cols), values))
    written = 2 * 3 * 16 * F32
    assert op(count, "index_put_") == (1, written + (2 + 3) * I64, written)


def test_index_put_with_a_boolean_mask_writes_the_selected_elements():
    buf = torch.zeros(4, 8, 16)
    mask = torch.zeros(4, 8, dtype=torch.bool)
    mask[0, :3] = True
    values = torch.randn(3, 16)

    def put():
        buf[mask] = values

    count = counted(put)
    _, read, written = op(count, "index_put_")
    assert written == 3 * 16 * F32  # the 3 selected rows, not mask.numel() x 16, not the whole buffer
    assert read == values.numel() * F32 + mask.numel()


def test_expand_then_contiguous_reads_the_broadcast_input_once():
    small = torch.randn(1, 3, 1, 64)
    count = counted(lambda: small.expand(1, 3, 100, 64).contiguous())
    assert op(count, "expand") == (1, 0, 0)
    assert moving_ops(count) == {"clone": (3 * 64 * F32, 3 * 100 * 64 * F32)}


def test_views_move_nothing():
    t = torch.randn(2, 3, 4, 5)

    def views():
        return (t.view(6, 20), t.transpose(1, 2), t[:, 1:], t[..., :1].expand(2, 3, 4, 7), t.reshape(2, 60),
                t.unsqueeze(0), t.permute(3, 2, 1, 0), t.detach(), t.select(1, 0), t.narrow(2, 1, 2))

    count = counted(views)
    assert count.total == 0
    assert {"view", "transpose", "slice", "expand", "permute"} <= set(count.ops)


def test_ordinary_op_reads_each_input_and_writes_the_output():
    a, b = torch.randn(1000), torch.randn(1000)
    count = counted(lambda: a + b)
    assert op(count, "add") == (1, 2 * 1000 * F32, 1000 * F32)


def test_in_place_op_writes_the_tensor_it_mutates():
    a, b = torch.randn(1000), torch.randn(1000)
    count = counted(lambda: a.add_(b))
    assert op(count, "add_") == (1, 2 * 1000 * F32, 1000 * F32)


def test_same_input_twice_is_read_once():
    x = torch.randn(1000)
    count = counted(lambda: torch.mul(x, x))
    assert op(count, "mul") == (1, 1000 * F32, 1000 * F32)


def test_factories_zeros_writes_empty_writes_nothing():
    zeros = counted(lambda: torch.zeros(1000))
    assert zeros.read == 0 and zeros.written == 1000 * F32
    empty = counted(lambda: torch.empty(1000))
    assert empty.total == 0
    assert "empty" in empty.ops  # seen, charged nothing


def test_counts_accumulate_per_op_name():
    a = torch.randn(10)
    count = counted(lambda: [a + a for _ in range(3)])
    assert op(count, "add") == (3, 3 * 10 * F32, 3 * 10 * F32)
    assert count.read == 120 and count.written == 120 and count.total == 240


def test_counted_passes_is_the_slope_between_contexts():
    """Synthetic counts: per-step constant bytes drop out, per-op slopes are reported."""
    per_token = 1000

    def step(tokens: int) -> traffic.TrafficCount:
        c = traffic.TrafficCount()
        c.add("cat", tokens * per_token, tokens * per_token)     # 2 passes
        c.add("mm", 5_000_000, 10_000)                           # weights: constant, not a pass
        c.add("scaled_dot_product_attention", tokens * per_token, 100)  # 1 pass
        return c

    result = traffic.counted_passes({256: step(256), 512: step(512)}, per_token)
    assert result.passes == pytest.approx(3.0)
    assert result.by_op == {"cat": 2.0, "scaled_dot_product_attention": 1.0}
    assert result.contexts == [256, 512]
    with pytest.raises(ValueError):
        traffic.counted_passes({256: step(256)}, per_token)


# --- whole decode steps on the tiny preset ----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_session():
    """A measuring session on ``tiny`` (2 layers, SmolLM2 heads), counted at 256 and 512 tokens."""
    settings = Settings(model="tiny", device="cpu", dtype="bfloat16", warmup=1, counted_contexts=(256, 512))
    return KVSession(settings, Device.from_choice("cpu"))


@pytest.fixture(scope="module")
def passes(tiny_session):
    """Counted traffic per cache class, computed once per module."""
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = tiny_session.count(name)
        return cache[name]

    return get


def test_planted_copy_shows_up_as_two_passes_and_fails_the_counted_gate(passes):
    clean, planted = passes("twin-clean"), passes("twin-planted")
    assert planted.passes - clean.passes == pytest.approx(2.0, abs=0.01)
    assert planted.by_op["clone"] == pytest.approx(2.0, abs=0.01)
    assert "clone" not in clean.by_op
    allowed = clean.passes + 0.05
    verdict = judges.judge_counted(Counted(planted.passes, planted.by_op), allowed=allowed,
                                   base_by_op=clean.by_op, key="cpu")
    assert verdict.status == "regression", verdict.reason
    assert "above the allowed" in verdict.reason and verdict.grew == {"clone": pytest.approx(2.0, abs=0.01)}
    assert judges.judge_counted(Counted(clean.passes, clean.by_op), allowed=allowed, base_by_op=clean.by_op,
                                key="cpu").status == "pass"


def test_counting_is_deterministic(tiny_session, passes):
    first = passes("dynamic")
    again = tiny_session.count("dynamic")
    assert again.passes == first.passes
    assert again.by_op == first.by_op
    assert again.step_bytes == first.step_bytes


def test_dynamic_cache_is_three_passes_cat_two_attention_one(passes):
    result = passes("dynamic")
    assert result.passes == pytest.approx(3.0, abs=0.05)
    assert result.by_op["cat"] == pytest.approx(2.0, abs=0.02)
    assert result.by_op["scaled_dot_product_attention"] == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("name", ["inplace", "static-sliced"])
def test_fixed_caches_move_the_cache_about_once(passes, name):
    result = passes(name)
    assert 0.95 <= result.passes <= 1.05, result
    assert "cat" not in result.by_op and "clone" not in result.by_op
    assert result.by_op["scaled_dot_product_attention"] == pytest.approx(1.0, abs=0.02)


def test_ops_with_equal_passes_are_listed_by_name_whatever_their_order():
    """softmax and to move the same bytes under eager (bf16 scores to float32 and back): the breakdown lists tied
    ops by name, so a summary line (and a page quoting it) reads the same in every run, whatever order the ops were
    seen in (the union of two sets of names: hash order)."""
    def count(names: list[str]) -> traffic.TrafficCount:
        out = traffic.TrafficCount()
        for name in names:
            out.ops[name] = traffic.OpTraffic(calls=1, read=36, written=18)
        return out

    for names in (["to", "softmax", "add"], ["softmax", "add", "to"], ["add", "to", "softmax"]):
        lo, hi = count([]), count(names)
        hi.ops["add"] = traffic.OpTraffic(calls=1, read=60, written=40)
        assert list(traffic.op_passes(lo, hi, 100.0)) == ["add", "softmax", "to"]


# --- the counter and torch.profiler never nest (pytorch #195746: under a dispatch mode the profiler records every op
# twice) ------------------------------------------------------------------------------------------------------------


def _ops() -> None:
    torch.ones(8).add_(1)


def test_the_ledger_does_not_profile_inside_the_counter():
    """The ledger's profiler (the CUDA path, run here on CPU) refuses to start while the counter counts."""
    from kvcache.measuring import ledger

    with traffic.TrafficCounter():
        with pytest.raises(traffic.NestingError, match=r"^the ledger's torch.profiler started while the traffic "
                                                       r"counter .* is active: .*pytorch #195746"):
            ledger.profile_steps(_ops, lambda: None, 1, cuda=True)
        with pytest.raises(traffic.NestingError, match="pytorch #195746"):
            ledger.unavailable(cuda=True)
    assert traffic.active_counters() == []
    assert set(ledger.profile_steps(_ops, lambda: None, 1, cuda=True)["ops_s"]) >= {"add_"}  # outside it: profiled


def test_the_counter_does_not_count_inside_a_profile():
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        assert traffic.profiler_running()
        with pytest.raises(traffic.NestingError, match=r"^the traffic counter started while torch.profiler is "
                                                       r"recording: .*pytorch #195746"):
            traffic.count(_ops)
    assert not traffic.profiler_running()
    assert counted(_ops).calls == 2  # after the profile: counted as ever (ones, add_)


def test_a_profiler_started_inside_the_counter_stops_it_at_the_next_op():
    """A profiler not started through the ledger (a hook, a user's plug-in) is caught at the first op it would
    record twice."""
    from torch.profiler import ProfilerActivity, profile

    with pytest.raises(traffic.NestingError, match=r"^torch.profiler is recording inside the traffic counter \(at "):
        with traffic.TrafficCounter(), profile(activities=[ProfilerActivity.CPU]):
            _ops()
    assert traffic.active_counters() == [] and not traffic.profiler_running()
