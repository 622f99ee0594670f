"""Counted figures of the test-only classes of issue 48 on ``tiny`` (2 layers, bf16): a class with a declared period
counted over a window of steps (amortised passes, the periodic part named), a step that does not grow with context
(no passes, the reason), host syncs per step, and a double gather charged for the rows it reads."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.analysing.settings import Settings  # noqa: E402
from kvcache.measuring import caches  # noqa: E402
from kvcache.measuring.cachespec import period_steps  # noqa: E402
from kvcache.measuring.devices import Device  # noqa: E402
from kvcache.measuring.session import KVSession  # noqa: E402

CLASSES = ("dynamic", "planted-periodic", "planted-fixed-window", "planted-syncs", "planted-double-gather")


@pytest.fixture(scope="module")
def counted(one_torch_thread):
    settings = Settings(model="tiny", device="cpu", dtype="bfloat16", warmup=1, counted_contexts=(256, 512))
    session = KVSession(settings, Device.from_choice("cpu"))
    return {cache: session.count(cache) for cache in CLASSES}


def test_a_declared_period_is_counted_over_a_window_and_amortised(counted):
    """A whole copy of K/V every 4 steps: +2 passes on that step, +0.5 per step amortised, named ``clone``."""
    t = counted["planted-periodic"]
    a = t.amortised
    assert (a.period, a.window, a.period_source) == (4, 4, "declared")
    assert a.passes == pytest.approx(3.5, abs=1e-6) and t.passes == a.passes  # the gated figure is the amortised one
    assert a.step_passes == pytest.approx(3.0, abs=1e-6)  # the one steady step misses the copy
    assert a.periodic_passes == pytest.approx(0.5, abs=1e-6) and a.periodic_by_op == {"clone": 0.5}
    assert t.stored_passes == pytest.approx(3.5, abs=0.05)  # per stored byte amortised alike (it stores its K/V)
    for backend in ("flash", "efficient", "cudnn"):  # each backend's steps over the same window
        assert t.backends[backend].passes == pytest.approx(3.5, abs=1e-6), backend
    assert counted["dynamic"].amortised is None


def test_a_step_that_does_not_grow_has_no_passes_and_says_why(counted):
    t = counted["planted-fixed-window"]
    assert t.passes is None and t.counted().passes is None
    assert "does not grow with context" in t.not_growing and "at 256 tokens" in t.not_growing
    assert t.counted().why_missing == t.not_growing
    assert t.step_bytes["256"] == t.step_bytes["512"]  # the measured bytes are kept


def test_host_syncs_per_step(counted):
    assert counted["dynamic"].host_syncs_per_step == 0 and counted["dynamic"].host_syncs == {}
    t = counted["planted-syncs"]
    assert t.host_syncs_per_step == 2 * t.layers == 4 and t.host_syncs == {"item": 4}  # two .item() per layer
    assert t.passes == pytest.approx(3.0, abs=1e-6)


def test_two_gathers_of_every_row_are_charged_the_rows_they_read(counted):
    t = counted["planted-double-gather"]
    assert t.by_op["gather"] == pytest.approx(4.0, abs=0.05)  # two gathers of K and V: each reads and writes them
    assert t.passes == pytest.approx(7.0, abs=0.06)


def test_a_period_is_an_int_or_a_function_of_the_config_and_a_bad_one_is_one_line():
    spec = caches.get("planted-periodic")
    assert period_steps(spec, None) == 4
    with pytest.raises(ValueError, match=r"register_cache\('bad'\): period 0 is not accepted"):
        caches.register_cache("bad", spec.build, period=0, in_all=False, replace=True)
    try:
        made = caches.register_cache("by-config", spec.build, period=lambda config: None, in_all=False, replace=True)
        assert period_steps(made, None) is None
        made = caches.register_cache("by-config", spec.build, period=lambda config: "8", in_all=False, replace=True)
        with pytest.raises(ValueError, match=r"register_cache\('by-config'\): period '8' is not accepted"):
            period_steps(made, None)
    finally:
        caches._REGISTRY.pop("by-config", None)


def test_under_the_generate_driver_a_period_is_named_and_not_amortised(one_torch_thread):
    settings = Settings(model="tiny", device="cpu", dtype="bfloat16", warmup=1, counted_contexts=(256, 512),
                        driver="generate")
    t = KVSession(settings, Device.from_choice("cpu")).count("planted-periodic")
    assert t.amortised.period == 4 and t.amortised.passes is None
    assert t.amortised.error.startswith("not amortised: --kv-driver generate counts one step")


def test_kvcache_traffic_prints_a_flat_class_and_the_notes(counted, capsys):
    from kvcache.commands.traffic import print_one

    print_one("planted-fixed-window", counted["planted-fixed-window"], None)
    print_one("planted-syncs", counted["planted-syncs"], None)
    out = capsys.readouterr().out
    assert "planted-fixed-window: no counted passes per step" in out
    assert "  no passes: its counted step moved" in out
    assert "  4 host syncs per step (each makes a GPU's host wait) = item 4" in out
