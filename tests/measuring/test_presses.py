"""``kvcache.caches.register_press``: a kvpress press as a cache class in one call, with a stand-in ``kvpress``
package (the fake press of :mod:`kvcache.testing.press` under kvpress's names): no kvpress needed. Without the
package the class is skipped naming it; a press is made fresh for every point; a ``*Decoding*`` press keeps its
hooks on through the decode steps."""

from __future__ import annotations

import sys
import textwrap

import pytest

pytest.importorskip("torch")

from kvcache.caches import register_press  # noqa: E402
from kvcache.measuring import caches, compat, decode  # noqa: E402

STAND_IN = textwrap.dedent('''
    from kvcache.testing.press import FakePress

    made = []
    entered = []

    class KnormPress(FakePress):
        def __init__(self, compression_ratio=0.0):
            super().__init__(1 - compression_ratio)
            made.append(self)

        def __call__(self, model):
            entered.append(self)
            return super().__call__(model)

    class DecodingPress(KnormPress):
        pass
''')


@pytest.fixture
def registered():
    before = dict(caches.registry())
    yield register_press
    caches._REGISTRY.clear()
    caches._REGISTRY.update(before)


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    (tmp_path / "kvpress").mkdir()
    (tmp_path / "kvpress" / "__init__.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kvpress", raising=False)
    yield
    sys.modules.pop("kvpress", None)


def test_registering_a_press_is_one_call_and_compresses(registered, stand_in, tiny):
    spec = registered("knorm", "KnormPress(0.5)")
    assert spec.needs_prefill and spec.fill_context is not None and not spec.in_all
    assert caches.cache_unavailable_reason(spec, "cpu") is None
    model, mspec, device = tiny
    points = [decode.open_point(model, mspec, caches.get("knorm"), device, 32, warmup=1, steps=1) for _ in range(2)]
    try:
        assert compat.layer_kv(points[0].cache, 0)[0].shape[-2] == 17  # half of 32, one warm-up step
        assert len(sys.modules["kvpress"].made) >= 2  # a fresh press per point
    finally:
        for point in points:
            point.release()


def test_a_press_keeps_its_hooks_on_while_decoding_as_with_press_around_generate(registered, stand_in):
    assert registered("dec", "DecodingPress(0.5)").decode_context is not None
    assert registered("knorm", "KnormPress(0.5)").decode_context is not None
    assert registered("off", "DecodingPress(0.5)", decoding=False).decode_context is None


def test_without_kvpress_the_class_is_skipped_naming_it(registered, monkeypatch):
    monkeypatch.setitem(sys.modules, "kvpress", None)  # import kvpress raises ImportError
    spec = registered("knorm", "KnormPress(0.5)")
    reason = caches.cache_unavailable_reason(spec, "cpu")
    assert reason is not None and "kvpress" in reason


def test_a_bad_press_argument_is_a_one_line_error(registered):
    with pytest.raises(ValueError, match=r"^register_press\('p'\): press 3 is not accepted"):
        registered("p", 3)


def test_a_press_given_itself_is_copied_for_every_point(registered, stand_in, tiny):
    import kvpress

    press = kvpress.KnormPress(0.5)
    spec = registered("knorm-itself", press)
    assert "KnormPress" in spec.description
    model, mspec, device = tiny
    point = decode.open_point(model, mspec, caches.get("knorm-itself"), device, 32, warmup=1, steps=1)
    try:
        assert compat.layer_kv(point.cache, 0)[0].shape[-2] == 17
        assert kvpress.entered and all(p is not press for p in kvpress.entered)  # a copy entered, not the press
    finally:
        point.release()
