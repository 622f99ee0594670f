"""The summary's notes under a class's counted line (:func:`counted_notes`): a step that does not grow with context,
passes amortised over a period, host syncs per step, a class prefilled whatever --kv-fill says. Stdlib only."""

from __future__ import annotations

from typing import Any

from kvcache.analysing import tables
from kvcache.analysing.tables import num


def counted_notes(cache: str, t: Any) -> list[str]:
    """Below a class's counted line: why it has no passes (its step does not grow with context), its passes
    amortised over its period (the steady step and the periodic part, by op) and its host syncs per step, where any."""
    out = []
    if t.fill:  # a class that needs a real prefill, counted in a run whose --kv-fill is synthetic
        out.append(f"counted {cache}: filled by {t.fill}: the class needs a real prefill, whatever --kv-fill says")
    if t.not_growing:
        out.append(f"counted {cache}: no passes: {t.not_growing}")
    a = t.amortised
    if a is not None and a.error:
        out.append(f"counted {cache}: period {a.period} ({a.period_source}), {a.error}")
    elif a is not None:
        out.append(f"counted {cache}: amortised over {a.window} steps (period {a.period}, {a.period_source}): one "
                   f"steady step {num(a.step_passes, '.3f')} + periodic {num(a.periodic_passes, '.3f')} = "
                   f"{tables.by_op(a.periodic_by_op)} per step")
    if t.host_syncs_per_step:
        out.append(f"counted {cache}: {t.host_syncs_per_step} host syncs per step (each makes a GPU's host wait) = "
                   + ", ".join(f"{op} {calls}" for op, calls in (t.host_syncs or {}).items()))
    return out
