"""The judge of the ``decoding`` verdict (``kv.verdict.<cache>#<strategy>.decoding``, --kv-decoding): a key's
counted passes per generated token, by phase (forward, reorder, crop, draft, other) and of the chunked prefill, each
against its baseline figure (``decoding_per_token``, ``decoding_phases`` {phase: passes}, ``prefill_passes``) plus the
counted tolerance, as exactly as counted passes. Stdlib only; docs/decoding.md."""

from __future__ import annotations

from typing import Any

from kvcache.analysing.judge.entries import BaselineEntry
from kvcache.analysing.judge.judges import COUNTED_RELATIVE_SLACK, PRIORITY, fmt
from kvcache.analysing.records import Part, Traffic, Verdict


def decoding_figures(traffic: Traffic | None) -> dict[str, float]:
    """{part name: passes} of a key's decoding figures: ``per_token``, ``phase:<phase>``, ``prefill``; the figures
    the run has, finite."""
    if traffic is None:
        return {}
    found: dict[str, Any] = {"per_token": traffic.passes_per_token}
    found.update({f"phase:{name}": phase.passes for name, phase in (traffic.phases or {}).items()})
    if traffic.prefill is not None:
        found["prefill"] = traffic.prefill.passes
    return {name: float(v) for name, v in found.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < float("inf")}


def baseline_figures(base: BaselineEntry | None) -> dict[str, float]:
    """The same names from a baseline entry."""
    if base is None:
        return {}
    found: dict[str, Any] = {"per_token": base.decoding_per_token, "prefill": base.prefill_passes}
    found.update({f"phase:{name}": value for name, value in (base.decoding_phases or {}).items()})
    return {name: float(v) for name, v in found.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def judge_decoding(traffic: Traffic | None, base: BaselineEntry | None, *, tolerance: float, key: str) -> Verdict:
    """Each decoding figure of the key against its baseline + ``tolerance`` passes (``parts``: one per figure); the
    verdict is the worst part, its reason the parts above their allowed value (or the figures without a baseline)."""
    figures, based = decoding_figures(traffic), baseline_figures(base)
    if not figures:
        return Verdict("not-measured", "no counted figure of a decoding strategy (--kv-decoding) was measured")
    parts: dict[str, Part] = {}
    for name, value in figures.items():
        if name not in based:
            parts[name] = Part("no-baseline", value=value, reason=f"no baseline for {key!r} of {name}")
            continue
        allowed = based[name] + tolerance
        above = value > allowed * (1 + COUNTED_RELATIVE_SLACK) + COUNTED_RELATIVE_SLACK
        parts[name] = Part("regression" if above else "pass", value=value, allowed=allowed,
                           reason=f"{name} {fmt(value)} is above the allowed {fmt(allowed)}" if above else None)
    worst = max((p.status for p in parts.values()), key=lambda s: PRIORITY.get(s, 0))
    if worst == "no-baseline" and any(p.status == "pass" for p in parts.values()):
        worst = "pass"
    above = [p.reason for p in parts.values() if p.status == "regression"]
    if above:
        reason = "; ".join(r for r in above if r)
    elif worst == "no-baseline":
        reason = f"no baseline for {key!r} of the decoding figures; record one with --kv-update-baseline"
    else:
        reason = f"{', '.join(n for n, p in parts.items() if p.status == 'pass')} within the allowed"
    return Verdict(worst, reason, parts=parts)


def decoding_entry(traffic: Traffic) -> dict[str, Any]:
    """The counted baseline entry's figures of a --kv-decoding key (none for greedy): ``decoding_per_token``,
    ``decoding_phases`` {phase: passes}, ``prefill_passes``, each where the run has it."""
    figures = decoding_figures(traffic)
    phases = {name.partition(":")[2]: v for name, v in figures.items() if name.startswith("phase:")}
    out = {"decoding_per_token": figures.get("per_token"), "decoding_phases": phases or None,
           "prefill_passes": figures.get("prefill")}
    return {name: value for name, value in out.items() if value is not None}
