"""The tokens a timed point gained per step (``kv.points[].tokens_per_step``): one a step unless the strategy says
otherwise (None: left out of the record); a speculative point's, the mean length gain of its timed iterations."""

from __future__ import annotations

from types import SimpleNamespace

from kvcache.measuring.decode import DecodePoint
from kvcache.measuring.decoding.speculative import SpeculativePoint


def test_a_point_of_one_token_a_step_says_none():
    assert DecodePoint.timed_tokens_per_step(SimpleNamespace()) is None


def test_a_speculative_point_gives_the_mean_gain_of_its_timed_iterations():
    """``lengths``: before the call, then after each iteration; the first (prefill) iteration and the leading
    untimed ones are left out: the last ``len(step_seconds)`` gains."""
    point = SimpleNamespace(lengths=[10, 15, 17, 20, 22], step_seconds=[0.1, 0.1])
    assert SpeculativePoint.timed_tokens_per_step(point) == 2.5  # gains 5 (prefill), 2 (untimed), 3, 2
    point = SimpleNamespace(lengths=[10, 15, 20, 25, 30], step_seconds=[0.1, 0.1, 0.1])
    assert SpeculativePoint.timed_tokens_per_step(point) == 5
    assert SpeculativePoint.timed_tokens_per_step(SimpleNamespace(lengths=[10, 15, 20], step_seconds=[])) is None
    assert SpeculativePoint.timed_tokens_per_step(SimpleNamespace(lengths=[], step_seconds=[0.1])) is None
