"""``kvcache ab`` on a clock that ticks, for the tests that run it end to end: ``python tests/abdriver.py STEP ARGS``
runs ``kvcache ab ARGS`` in this process with its driver's clock (:data:`kvcache.ab.clock.source`) advancing
``STEP`` seconds each time it is read, whatever time passes.

Every second the driver records (each side's seconds alone, each pair's wall, the phases) and the whole budget of
``--more-rounds-within`` (what has been spent, what the next extension is estimated to cost) are then counts of
readings: the same sequence of readings, so the same extensions, on a quiet machine or a busy one. The workers are
the command's own and time their steps as ever (``tests/suite/plugins/kv_ab_figures.py`` makes their figures up
too, where a verdict must not depend on them)."""

from __future__ import annotations

import sys
from pathlib import Path

#: Seconds the clock advances at each reading, unless the command line says otherwise.
STEP_S = 1.0


class Ticks:
    """A clock (seconds) that advances ``step_s`` each time it is read: the n-th reading is ``n * step_s``."""

    def __init__(self, step_s: float = STEP_S) -> None:
        self.step_s, self.readings = step_s, 0

    def __call__(self) -> float:
        self.readings += 1
        return self.readings * self.step_s


def command(*args: str, step_s: float = STEP_S) -> list[str]:
    """The command line of ``kvcache ab ARGS`` on a clock of ``step_s`` seconds a reading, from any folder (the
    driver is this checkout's ``kvcache``; each side's worker imports it as that side's environment does)."""
    return [sys.executable, str(Path(__file__).resolve()), str(step_s), *args]


def main(argv: list[str]) -> int:
    from kvcache.ab import clock
    from kvcache.cli import main as kvcache

    clock.source = Ticks(float(argv[0]))
    return kvcache(["ab", *argv[1:]])


if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the checkout first, not tests/: as -m kvcache.cli
    sys.exit(main(sys.argv[1:]))
