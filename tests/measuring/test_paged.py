"""The ``paged`` class (continuous batching's PagedAttentionCache, driven by
``kvcache.measuring.paged_point.PagedPoint``): at batch 1 it decodes the greedy tokens of a DynamicCache; in a ragged
batch every sequence decodes what it decodes alone (the block-diagonal mask and the read/write indices keep them
apart); a counted step shows the gather of the live K/V; a release without continuous batching is skipped with a
one-line reason.

The model is ``tiny`` in float32, re-initialised "lively" as in test_fixed_caches.py (the suite's random weights make
greedy decoding repeat its input token whatever attention computes, which would prove nothing).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.measuring import caches, compat, decode, paged_api, paged_point  # noqa: E402
from kvcache.measuring.batch import BatchShape  # noqa: E402
from kvcache.measuring.counting import traffic  # noqa: E402
from kvcache.measuring.devices import Device  # noqa: E402
from kvcache.measuring.models import build_model  # noqa: E402
from kvcache.testing.classes import lively  # noqa: E402

CPU = Device.from_choice("cpu")
STEPS = 10
CONTEXT = 40
GATHERS = ("index_select", "index")  # 5.6+: torch.index_select; 4.53-5.5: advanced indexing of the pool

pytestmark = pytest.mark.usefixtures("one_torch_thread")
needs_paged = pytest.mark.skipif(paged_point.unsupported_reason() is not None,
                                 reason=paged_point.unsupported_reason() or "")


@pytest.fixture(scope="module")
def tiny(one_torch_thread):
    model, spec = build_model("tiny", CPU.torch_device, "float32")
    return lively(model), spec


def greedy(point: decode.DecodePoint, steps: int = STEPS) -> list[list[int]]:
    """Every step's next token of every sequence."""
    tokens = []
    for _ in range(steps):
        point.step()
        tokens.append(point.next_ids.view(-1).tolist())
    return tokens


def point(tiny, name: str, context: int, *, seed: int = 0, fill: str = "synthetic", **extra):
    model, spec = tiny
    spec_ = caches.get(name)
    cls = spec_.point or decode.DecodePoint
    return cls(model, spec, spec_, CPU, context, decode.tokens_needed(context, 0, STEPS), fill=fill, seed=seed,
               **extra).build()


# --- the skip -------------------------------------------------------------------------------------------------

def test_a_release_without_continuous_batching_is_skipped_with_one_line():
    reason = paged_point.unsupported_reason("4.52.4")
    assert reason == "paged: transformers 4.52.4 has no PagedAttentionCache (continuous batching arrived in 4.53)"
    assert "\n" not in reason
    assert paged_point.unsupported_reason("4.53.0") is None and paged_point.unsupported_reason("5.24.0") is None
    # what the session asks: the same reason on this release, or None where the class runs
    assert caches.cache_unavailable_reason(caches.get("paged"), "cpu") == paged_point.unsupported_reason()


def test_a_model_caching_another_geometry_is_skipped_with_one_line():
    """The pool is sized from the config's KV heads and head dim; DeepSeek's latent (1 x 512 + 64) is not that."""
    pool = SimpleNamespace(num_key_value_heads=16, head_dim=64)
    latent = SimpleNamespace(name="latent-model", cached_shapes=lambda: [(1, 512, 64)])
    with pytest.raises(compat.Unsupported) as info:
        paged_api.check_geometry(pool, latent)
    assert "16 KV heads x 64 dims" in str(info.value) and "latent-model caches 1 x 512" in str(info.value)
    assert "\n" not in str(info.value)
    paged_api.check_geometry(pool, SimpleNamespace(name="plain", cached_shapes=lambda: [(16, 64, 64), None]))


def test_the_registry_entry_brings_its_point():
    spec = caches.get("paged")
    assert spec.attention == "sdpa_paged" and spec.kinds == ("full",) and spec.point is not None
    assert "paged" in caches.parse_caches("all")


# --- decoding -----------------------------------------------------------------------------------------------

@needs_paged
@pytest.mark.parametrize("fill", ["synthetic", "prefill"])
def test_batch_one_decodes_the_tokens_of_a_dynamic_cache(tiny, fill):
    reference = greedy(point(tiny, "dynamic", CONTEXT, fill=fill))
    stepped = greedy(point(tiny, "paged", CONTEXT, fill=fill))
    assert stepped == reference
    assert len({t[0] for t in reference}) > STEPS // 2, "the generation must vary for the comparison to mean anything"


@needs_paged
def test_a_ragged_batch_decodes_each_sequence_as_alone(tiny):
    """Sequence i of the batch holds ``batch.lengths(context)[i]`` tokens drawn with seed ``seed + i``: alone, a
    DynamicCache point with that seed and context decodes the same tokens."""
    batch = BatchShape(3, ragged=True)
    p = point(tiny, "paged", CONTEXT, batch=batch)
    assert isinstance(p, paged_point.PagedPoint) and p.lengths == batch.lengths(CONTEXT) and p.position == CONTEXT
    stepped = greedy(p)
    assert p.lengths == [n + STEPS for n in batch.lengths(CONTEXT)] and p.position == CONTEXT + STEPS
    for i, length in enumerate(batch.lengths(CONTEXT)):
        alone = greedy(point(tiny, "dynamic", length, seed=i))
        assert [t[i] for t in stepped] == [t[0] for t in alone], f"sequence {i} ({length} tokens)"


# --- counting ------------------------------------------------------------------------------------------------

@needs_paged
@pytest.mark.parametrize("batch", [BatchShape(1), BatchShape(4), BatchShape(3, ragged=True)],
                         ids=["batch1", "batch4", "ragged3"])
def test_a_counted_step_shows_the_gather_of_the_live_kv(tiny, batch):
    """The gather reads every live K/V and writes their copy: 2 passes per live byte (plus its indices). Up to 5.5 it
    is advanced indexing (``index``), from 5.6 ``index_select``: lookups, charged the rows they select (rule 5)."""
    model, spec = tiny
    counts, live = {}, {}
    for context in (256, 512):
        p = decode.open_point(model, spec, caches.get("paged"), CPU, context, warmup=1, steps=1, batch=batch)
        assert isinstance(p, paged_point.PagedPoint)
        _, counts[context] = traffic.count(p.step)
        live[context] = batch.live_bytes(spec, context, added=2)
        assert compat.stored_bytes(p.cache) >= live[context]  # the pool holds every live token
        assert "lift_fresh" not in counts[context].ops  # nothing made from host data inside the step
        assert "_local_scalar_dense" not in counts[context].ops  # nothing read back to the host either
        p.release()
    result = traffic.counted_passes(counts, spec.bytes_per_token, kv_bytes=live)
    gather = [name for name in GATHERS if name in result.by_op and result.by_op[name] >= 1.95]
    assert len(gather) == 1, result.by_op
    if gather == ["index_select"] or not batch.ragged:
        assert result.by_op[gather[0]] <= 2.03, result.by_op
    assert result.by_op["scaled_dot_product_attention"] >= 0.99
    assert result.passes >= 3.0
