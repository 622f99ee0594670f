"""The judge of the ``decoding`` verdict (``kv.verdict.<cache>#<strategy>.decoding``, --kv-decoding): a key's
counted passes per generated token, by phase (forward, reorder, crop, draft, other), of the chunked prefill and of a
draft model's own cache (passes per KV byte the draft's cache holds, and per generated token), each against its
baseline figure (``decoding_per_token``, ``decoding_phases`` {phase: passes}, ``prefill_passes``, ``draft_passes``,
``draft_per_token``) plus the counted tolerance, as exactly as counted passes. The draft's acceptance (a share, not
passes) is reported, not judged: a lower acceptance yields fewer tokens a step, which raises ``per_token`` and
``draft_per_token``, both judged. The figures are the measure table's rows whose verdict is ``decoding``, each
worse when higher. Stdlib only; docs/decoding.md."""

from __future__ import annotations

from typing import Any

from kvcache.analysing.judge.entries import BaselineEntry
from kvcache.analysing.judge.judges import COUNTED_RELATIVE_SLACK, PRIORITY, fmt
from kvcache.analysing.judge.measure_table import ANY, finite_number, is_node, member_of, of_verdict
from kvcache.analysing.records import Part, Traffic, Verdict


def decoding_figures(traffic: Traffic | None) -> dict[str, float]:
    """{part name: passes} of a key's decoding figures, one per row of the measure table judged in ``decoding``
    (``name:KEY`` for a row per key): ``per_token``, ``phase:<phase>``, ``prefill``, ``draft`` (passes per KV byte
    the draft's own cache holds) and ``draft_per_token``; the figures the run has, finite. Passes only, each worse
    when higher: the draft's ``acceptance`` is no row of them (see the module's docstring)."""
    if traffic is None:
        return {}
    found: dict[str, Any] = {}
    for m in of_verdict("decoding"):
        node: Any = traffic
        for part in m.path[:m.path.index(ANY)] if m.per_key else m.path:
            node = member_of(node, part)
        if m.per_key:
            keyed = node.items() if isinstance(node, dict) else ()
            found.update({f"{m.name}:{key}": member_of(value, m.field) for key, value in keyed if is_node(value)})
        elif is_node(node):
            found[m.name] = member_of(node, m.field)
    return {name: float(v) for name, v in found.items() if finite_number(v)}


def baseline_figures(base: BaselineEntry | None) -> dict[str, float]:
    """The same names from a baseline entry (each row's ``baseline`` field: ``decoding_per_token``,
    ``decoding_phases`` {phase: passes}, ``prefill_passes``, ``draft_passes``, ``draft_per_token``)."""
    if base is None:
        return {}
    found: dict[str, Any] = {}
    for m in of_verdict("decoding"):
        value = getattr(base, m.baseline or "", None)
        if m.per_key:
            found.update({f"{m.name}:{key}": v for key, v in value.items()} if isinstance(value, dict) else {})
        else:
            found[m.name] = value
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
    ``decoding_phases`` {phase: passes}, ``prefill_passes``, ``draft_passes`` and ``draft_per_token``, each where
    the run has it."""
    figures = decoding_figures(traffic)
    out: dict[str, Any] = {}
    for m in of_verdict("decoding"):
        if m.per_key:
            keyed = {name.partition(":")[2]: v for name, v in figures.items() if name.startswith(f"{m.name}:")}
            if keyed:
                out[m.baseline or m.name] = keyed
        elif m.name in figures:
            out[m.baseline or m.name] = figures[m.name]
    return out
