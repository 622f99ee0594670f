"""The clock of ``kvcache ab``'s driver: every second it measures (each side's seconds alone and each pair's wall in
:mod:`kvcache.ab.schedule`, the phases in :mod:`kvcache.commands.ab`, the ``--more-rounds-within`` budget and the
cost of an extension in :mod:`kvcache.ab.extend`) is read from :func:`now`, so that one replacement of :data:`source`
changes them all (the waits for a worker, such as :data:`kvcache.ab.sides.STOP_WAIT`, are the operating system's).

The measured figures are not read from here: they are timed in each side's worker (:mod:`kvcache.measuring`). What
this clock decides is how the session spends its budget, never a verdict. The tests replace :data:`source` in the
driver process (``tests/abdriver.py``: a clock that advances a fixed step each time it is read), so that the
budget of ``--more-rounds-within`` pays for the same extensions on any machine. Standard library only."""

from __future__ import annotations

import time
from collections.abc import Callable

#: Where :func:`now` reads the time, in seconds: the monotonic clock (only differences between two readings mean
#: anything).
source: Callable[[], float] = time.monotonic


def now() -> float:
    """Seconds on :data:`source`."""
    return source()
