"""The stages of one timed measurement, marked where they end: :data:`PREPARED` once its untimed preparation is
done (a point's cache filled, the copy bandwidth's tensors allocated and paged in) and its timed part is next;
:data:`MEASURED` once its timed part is done (the timed steps, the profiled steps, the timed copies) and only
untimed work is left (counting one more step, reading the profile, records).

A plain run ignores the marks. ``kvcache ab``'s worker (:mod:`kvcache.ab.worker`) waits at each for its driver, which
lets each side's timed part run alone while both sides' untimed parts run at the same time. Standard library only.
"""

from __future__ import annotations

from typing import Callable

PREPARED, MEASURED = "prepared", "measured"

_handler: list[Callable[[str], None]] = []


def reached(stage: str) -> None:
    """Mark the end of ``stage`` (:data:`PREPARED` or :data:`MEASURED`); returns when the run may go on."""
    if _handler:
        _handler[0](stage)


def prepared() -> None:
    reached(PREPARED)


def handle(handler: Callable[[str], None] | None) -> None:
    """Call ``handler(stage)`` at every mark from now on (None: marks are ignored again)."""
    _handler[:] = [handler] if handler is not None else []
