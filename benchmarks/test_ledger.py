"""The per-op timed ledger: ``--kv-ledger-steps`` profiled steps per (cache class, context), in a round of their
own after the timed rounds (before the drift check): where the time of a step goes, op by op, under the counted
breakdown's names. Not collected with ``--kv-ledger-steps 0``."""

import pytest


@pytest.mark.timed
def test_ledger(kv, kv_ledger):
    kv.run_ledger(kv_ledger)
