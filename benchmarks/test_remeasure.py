"""With ``--kv-remeasure N``: after the rounds, the N noisiest points measured once more, each as an
extra round, within ``--kv-remeasure-seconds``. Not collected at all when N is 0 (the default)."""

import pytest


@pytest.mark.timed
def test_remeasure(kv, kv_remeasure, benchmark):
    kv.remeasure(kv_remeasure, benchmark)
