"""``--kv-remeasure``'s choice (kvcache.measuring.noise): the noisiest points first, by the spread of their round
medians, or with one round by the relative interquartile range of its steps."""

from __future__ import annotations

import pytest

from kvcache.measuring.noise import RoundMedians


def test_one_round_is_ranked_by_its_relative_interquartile_range():
    medians = RoundMedians()
    medians.add("dynamic", 256, [1.0, 1.0, 1.0, 1.0])  # no spread
    medians.add("static", 256, [1.0, 2.0, 3.0, 4.0])  # median 2.5, IQR 4 - 2 = 2
    assert medians.noise(("static", 256)) == pytest.approx(2 / 2.5)
    assert medians.noisiest() == [("static", 256), ("dynamic", 256)]


def test_several_rounds_are_ranked_by_the_spread_of_their_medians():
    medians = RoundMedians()
    for step in (1.0, 1.5, 2.0):  # medians 1, 1.5, 2: spread 1 over a median of 1.5
        medians.add("dynamic", 512, [step] * 5)
    medians.add("static", 512, [0.1, 0.2, 10.0])  # one round, wide steps: IQR 9.9 over 0.2
    assert medians.noise(("dynamic", 512)) == pytest.approx(1 / 1.5)
    assert medians.noisiest()[0] == ("static", 512)


def test_a_zero_median_is_no_noise():
    medians = RoundMedians()
    medians.add("dynamic", 64, [0.0, 0.0, 0.0])
    assert medians.noise(("dynamic", 64)) == 0.0
