"""kvcache.measuring.decoding: the strategy registry, keys through the cache registry and ``--kv-attn``'s crossing,
and the phases the traffic counter charges (a cache method wrapped as a phase; what no phase was charged)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.measuring import attention, caches, decoding  # noqa: E402
from kvcache.measuring.counting import traffic  # noqa: E402
from kvcache.measuring.decoding.figures import outside_phases, phase_passes  # noqa: E402


def test_keys_cross_with_attention_and_resolve_to_their_class():
    assert attention.cross(["dynamic", "dynamic#beam:4"], ["sdpa", "eager"]) == [
        "dynamic", "dynamic@eager", "dynamic#beam:4", "dynamic@eager#beam:4"]
    spec = caches.get("static@eager#beam:4")
    assert spec.name == "static@eager#beam:4" and spec.attention == "eager" and not spec.in_all
    assert spec.build is caches.get("static").build
    assert caches.parse_caches("dynamic#beam:2,static") == ["dynamic#beam:2", "static"]
    with pytest.raises(caches.CacheError, match="beams 1 is below 2"):
        caches.parse_caches("dynamic#beam:1")
    with pytest.raises(ValueError, match="'#'"):
        caches.register_cache("mine#2", caches.get("dynamic").build)


def test_the_registry_gives_each_family_its_strategy():
    beam = decoding.strategy_for("dynamic#beam:4")
    assert beam.family == "beam" and beam.rows() == 4 and beam.generation_options()["num_beams"] == 4
    greedy = decoding.strategy_for("dynamic")
    assert greedy.rows() == 1 and greedy.point(dict) is dict  # the session's own point, untouched
    chunked = decoding.strategy_for("dynamic#chunked-prefill:256")
    assert chunked.generation_options() == {"prefill_chunk_size": 256}
    later = decoding.strategy_for("dynamic#prompt-lookup:3")
    if isinstance(later, decoding.Unregistered):  # no module registered the family: every class skipped
        assert "no strategy registered" in later.unavailable(caches.get("dynamic"), None)


def test_a_class_with_its_own_point_is_skipped_by_every_strategy_but_greedy():
    paged = caches.registry()["paged"]
    reason = decoding.strategy_for("paged#beam:2").unavailable(paged, None)
    assert reason and "its own point" in reason
    assert decoding.strategy_for("paged").unavailable(paged, None) is None


class _Cache:
    def __init__(self) -> None:
        self.keys = torch.ones(4, 8)

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        self.keys = self.keys.index_select(0, beam_idx)


def test_a_wrapped_cache_method_is_charged_to_its_phase_and_the_rest_to_other():
    cache = _Cache()
    traffic.charge_methods(cache, {"reorder_cache": decoding.REORDER})
    idx = torch.tensor([1, 0, 3, 2])

    def step() -> None:
        cache.keys.sum()
        cache.reorder_cache(idx)

    _, count = traffic.count(step)
    assert set(count.scopes) == {"reorder"}
    assert count.scope("reorder").ops["index_select"].total > 0
    other = outside_phases(count)
    assert "index_select" not in other.ops and other.ops["sum"].read == count.ops["sum"].read
    phases = phase_passes({1: count, 2: count}, {1: 1.0, 2: 2.0})
    assert phases["reorder"].passes == 0 and phases["other"].passes == 0  # no growth between equal counts
