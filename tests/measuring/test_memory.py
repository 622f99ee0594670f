"""Counted memory (:mod:`kvcache.measuring.counting.memory`): bytes a decode step allocates, peaks at and holds, per KV
byte.

Figures on ``tiny`` (2 layers; one layer's K and V are half the KV bytes, its K a quarter), counted at 256 and 512:

- DynamicCache: ``cat`` allocates the whole new K and V every step (allocated 1.00), the old ones are freed layer by
  layer as the new ones replace them (peak 0.25: one layer's K at a time above what was live), it holds its K/V
  (held 1.00);
- StaticCache: writes the new token in place (allocated and peak near 0), holds its buffer (held 1.00);
- leaking classes registered through the public plug-in API (``tests/suite/plugins/kv_leaks.py``): their leak shows
  in held passes exactly (2.00, 1.50) while their counted passes and allocations stay DynamicCache's.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from kvcache.analysing.records import MemoryStep
from kvcache.analysing.settings import Settings
from kvcache.measuring.counting import memory
from kvcache.measuring.devices import Device
from kvcache.measuring.session import KVSession

PLUGIN = Path(__file__).resolve().parents[1] / "suite" / "plugins" / "kv_leaks.py"


def _load_leaks():
    spec = importlib.util.spec_from_file_location("kv_leaks", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers the leaking classes through kvcache.caches.register_cache
    return module


@pytest.fixture(scope="module")
def counted(one_torch_thread):
    """{cache: (counted traffic, kv.memory entry)} on tiny, measured once per module."""
    _load_leaks()
    session = KVSession(Settings(model="tiny", device="cpu", warmup=1), Device.from_choice("cpu"))
    out = {}

    def get(name):
        if name not in out:
            out[name] = (session.count(name), session.memories[name])
        return out[name]
    get.session = session
    return get


def test_dynamic_allocates_its_cache_every_step_and_holds_it_once(counted):
    _, mem = counted("dynamic")
    assert mem.allocated_passes == pytest.approx(1.0, abs=1e-9)
    assert mem.held_passes == pytest.approx(1.0, abs=1e-9)
    assert mem.peak_passes == pytest.approx(0.25, abs=1e-9)  # one layer's new K beside the old: 1/(2 layers × K,V)
    assert list(mem.allocated_by_op) == ["cat"]
    assert mem.declared_factor == 2.0 and mem.factor_problem is None


def test_static_holds_its_buffer_and_allocates_next_to_nothing(counted):
    _, mem = counted("static")
    assert mem.held_passes == pytest.approx(1.0, abs=1e-9)
    assert abs(mem.allocated_passes) < 0.05 and abs(mem.peak_passes) < 0.01


@pytest.mark.parametrize(("name", "held"), [("leak-previous", 2.0), ("leak-previous-keys", 1.5)])
def test_a_leak_shows_in_held_passes_exactly_while_passes_stay(counted, name, held):
    clean_traffic, clean = counted("dynamic")
    traffic, mem = counted(name)
    assert mem.held_passes == pytest.approx(held, abs=1e-9)
    assert traffic.passes == pytest.approx(clean_traffic.passes, abs=1e-9)  # it moves no extra byte
    assert traffic.by_op == clean_traffic.by_op
    assert mem.allocated_passes == pytest.approx(clean.allocated_passes, abs=1e-9)


def test_the_same_measure_twice_gives_identical_figures(counted):
    _, first = counted("dynamic")
    session = counted.session
    session.count("dynamic")
    assert session.memories["dynamic"] == first


def test_a_class_needing_more_than_its_memory_factor_is_named(counted):
    steps = {256: MemoryStep(before=100, allocated=0, peak=60, held=100),
             512: MemoryStep(before=200, allocated=0, peak=120, held=200)}
    found = memory.memory_passes(steps, {256: 100.0, 512: 200.0}, declared_factor=1.2)
    assert found.peak_factor == pytest.approx(1.6)
    assert "needs 1.60 cache sizes at its peak, declares memory_factor 1.2" in found.factor_problem
    assert memory.memory_passes(steps, {256: 100.0, 512: 200.0}, declared_factor=2.0).factor_problem is None


def test_on_a_padded_batch_the_factor_is_checked_per_allocated_byte():
    """The declared factor counts cache sizes of the allocated (padded) bytes: a ragged batch whose live bytes are
    half its rectangle needs 1.60 per live byte but 0.80 per allocated byte, within a declared 1.2."""
    steps = {256: MemoryStep(before=100, allocated=0, peak=60, held=100),
             512: MemoryStep(before=200, allocated=0, peak=120, held=200)}
    live, allocated = {256: 100.0, 512: 200.0}, {256: 200.0, 512: 400.0}
    found = memory.memory_passes(steps, live, declared_factor=1.2, factor_bytes=allocated)
    assert found.peak_factor == pytest.approx(1.6) and found.factor_problem is None  # the figure: per live byte
    tight = memory.memory_passes(steps, live, declared_factor=0.5, factor_bytes=allocated)
    assert ("needs 0.80 cache sizes at its peak per allocated KV byte, declares memory_factor 0.5"
            in tight.factor_problem)


@pytest.mark.parametrize("cache", ["static", "inplace", "static-sliced"])
def test_a_ragged_batch_is_not_flagged_for_its_padding(one_torch_thread, cache):
    """``--kv-batch 3 --kv-ragged``: per live byte these classes' buffers looked like 1.60 cache sizes, above the
    declared 1.5 (a false MEMORY FACTOR TOO SMALL); per allocated byte, what the factor declares, they fit."""
    session = KVSession(Settings(model="tiny", caches=(cache,), batch=3, ragged=True, warmup=1),
                        Device.from_choice("cpu"))
    session.count(cache)
    mem = session.memories[cache]
    assert mem.factor_problem is None, mem.factor_problem


def test_tracker_charges_new_storages_and_sees_them_freed():
    tracker = memory.MemoryTracker()
    from kvcache.measuring.counting import traffic

    with tracker:
        a = torch.ones(1000)  # 4000 bytes, before the counted region
        with traffic.TrafficCounter():
            b = torch.cat([a, a])  # +8000
            view = b[10:]  # a view allocates nothing
            del a  # -4000
            c = b * 2  # +8000, the peak: 4000 + 8000 + 8000 - 4000 above the 4000 before
            del c  # -8000
    step = tracker.step
    assert (step.before, step.allocated, step.peak, step.held) == (4000, 16000, 12000, 8000)
    assert step.by_op == {"cat": 8000, "mul": 8000}
    assert view.untyped_storage().nbytes() == 8000


def test_a_storage_inherits_nothing_from_a_freed_one_with_its_id():
    """CPython gives a freed storage's id to the next storage made: the scope a dead storage was first seen in must
    not be charged the bytes of a later one (it was: a token made outside every layer, held after the step, was
    charged to whichever layer's dead scratch tensor had had its id, 8 bytes in about half of all runs)."""
    from kvcache.measuring.counting import traffic

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    layer = Double()
    tracker = memory.MemoryTracker()
    with tracker, traffic.TrafficCounter(scopes={layer: "layer.0"}):
        scratch = layer(torch.ones(4))  # allocated in layer.0, then freed
        key = id(scratch.untyped_storage())
        del scratch
        assert key not in tracker.scope_of and key not in tracker.origin  # nothing left for the id's next holder
        token = torch.ones(2, dtype=torch.int64) + 1  # made outside every scope, held after the step
    assert tracker.scopes.held == {}
    assert tracker.step.held == token.untyped_storage().nbytes() == 16


def test_a_sliding_window_holds_no_more_bytes_past_it(tmp_path):
    """Mistral's structure (every layer sliding, window 32): past the window the bytes a DynamicCache holds after a
    step stop growing (transformers 4.56 and later; before, DynamicCache kept every token)."""
    from test_families import config_dir

    session = KVSession(Settings(model=config_dir(tmp_path, "mistral"), caches=("dynamic",), counted_contexts=(8, 16)),
                        Device.from_choice("cpu"))
    session.count("dynamic")
    mem = session.memories["dynamic"]
    assert mem.held_passes == pytest.approx(1.0, abs=1e-9)  # below the window: all of it
    assert mem.beyond.held_growth_bytes == 0


def test_a_ragged_batch_holds_its_padding(one_torch_thread):
    """Two sequences, the shorter left-padded: per live KV byte the cache holds its padding too; per allocated
    byte (the padded rectangle) it holds each byte once."""
    session = KVSession(Settings(model="tiny", caches=("dynamic",), batch=2, ragged=True, warmup=1),
                        Device.from_choice("cpu"))
    session.count("dynamic")
    mem = session.memories["dynamic"]
    assert mem.held_passes > 1.2
    assert mem.per_allocated.held_passes == pytest.approx(1.0, abs=0.01)
    assert mem.per_allocated.allocated_passes == pytest.approx(1.0, abs=0.01)


def test_the_attentions_own_kv_copies_are_not_charged_to_the_class(counted):
    """Under eager, ``repeat_kv`` copies one layer's K and V to every query head (9 for 3 KV heads) while that layer
    attends: on ``tiny`` 3 × half the KV bytes, 1.50 cache sizes at the step's peak. They are the attention's, not
    the class's: the check adds them to StaticCache's declared 1.5 and finds nothing too small; under SDPA
    (native GQA) nothing is added."""
    _, eager = counted("static@eager")
    assert eager.attention_factor == pytest.approx(1.5)
    assert eager.peak_factor > eager.declared_factor == 1.5
    assert eager.factor_problem is None
    _, sdpa = counted("static")
    assert sdpa.attention_factor is None


def test_the_attention_factor_is_added_to_the_declared_one_and_named():
    steps = {256: MemoryStep(before=100, allocated=0, peak=60, held=100),
             512: MemoryStep(before=200, allocated=0, peak=120, held=200)}
    kv = {256: 100.0, 512: 200.0}
    assert memory.memory_passes(steps, kv, declared_factor=1.2, attention_factor=0.4).factor_problem is None
    short = memory.memory_passes(steps, kv, declared_factor=1.2, attention_factor=0.3)
    assert short.attention_factor == 0.3
    assert ("needs 1.60 cache sizes at its peak, declares memory_factor 1.2 (+ 0.30 for the attention's own K/V "
            "copies)") in short.factor_problem


def test_copies_factor_is_one_layers_kv_times_the_query_groups_where_attention_expands():
    from kvcache.analysing.records import Probe
    from kvcache.measuring.attention import copies_factor

    assert copies_factor(Probe.of(attention="eager", expansions=60), 9, 3, [768] * 30) == pytest.approx(0.1)
    assert copies_factor(Probe.of(attention="eager", expansions=4), 9, 3, [768, 256]) == pytest.approx(3 * 768 / 1024)
    assert copies_factor(Probe.of(attention="eager", expansions=0), 9, 3, [768] * 30) == 0.0
    assert copies_factor(None, 9, 3, [768] * 30) == 0.0
