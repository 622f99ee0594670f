"""The output of ``kvcache bisect``: the closing lines for the terminal and the ``--json`` document (``first_bad``,
``before``, ``after``, ``measure``, ``probes``, ``changes``, ``others``). Standard library only."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from kvcache.analysing.records.file_formats import BisectStep
from kvcache.bisect import search
from kvcache.bisect.probing import DEFAULT_CACHES, EXIT_AMBIGUOUS

if TYPE_CHECKING:
    from kvcache.bisect.walk import Bisect, Change, Plan, Result

#: The version of the ``--json`` document (its key ``kvcache_bisect``).
BISECT_JSON_FORMAT = 1


def step_record(bisect: Bisect, step: Change) -> BisectStep:
    """One change the walk found, as the ``--json`` document's ``changes[]`` holds it (``candidates`` only where
    items in between could not be measured)."""
    good, bad = bisect.item(step.good), bisect.item(step.first_bad)
    found = BisectStep.of(first_bad=None if step.skipped else bad.name, subject=bad.subject, date=bad.date,
                          parent=good.name, before=step.before.value, after=step.after.value,
                          change=(None if step.before.value is None or step.after.value is None
                                  else step.after.value - step.before.value),
                          ops=search.op_changes(step.before.detail, step.after.detail), unit=bisect.plan.measure.unit)
    if step.skipped:
        found.update(candidates=[bisect.item(i).name for i in [*step.skipped, step.first_bad]])
    return found


def probe_json(bisect: Bisect, index: int, cls: str | None) -> dict[str, Any]:
    probe = bisect.probes[index]
    n = len(bisect.plan.items)
    fig = bisect.figure(index, cls) if cls else None
    measure = bisect.plan.measure
    doc = {"item": probe.item.name, "index": index, "role": {-1: "good end", n - 1: "bad end"}.get(index, "probe"),
           "subject": probe.item.subject, "date": probe.item.date, "transformers": probe.transformers,
           "figure": fig.value if fig else None,
           "figures": {c: search.figure_of(probe.kv, measure, c).value for c in search.classes(probe.kv)} if probe.kv
           else {},
           "reason": probe.reason or (fig.reason if fig is not None and fig.value is None else None),
           "untrusted": probe.untrusted, "cached": probe.cached, "seconds": round(probe.seconds, 1)}
    verdict, note = bisect.judged.get(index, (None, None))
    if verdict:
        doc["verdict"] = verdict
    if note:
        doc["note"] = note
    return doc


def report(bisect: Bisect, result: Result) -> tuple[list[str], dict[str, Any]]:
    """The closing lines for the terminal and the ``--json`` document."""
    plan, measure = bisect.plan, bisect.plan.measure
    cls = result.cls
    lines: list[str] = []
    steps = [step_record(bisect, s) for s in result.changes]
    probes = [probe_json(bisect, i, cls) for i in bisect.order]
    doc: dict[str, Any] = {"kvcache_bisect": BISECT_JSON_FORMAT, "where": plan.where, "mode": plan.mode,
                           "good": plan.ends[0].name, "bad": plan.ends[1].name, "notes": plan.notes,
                           "identity": plan.cache.identity,
                           "measure": {"name": measure.name, "label": measure.label, "unit": measure.unit,
                                       "class": cls, "tolerance": result.tolerance},
                           "first_bad": None, "before": None, "after": None,
                           "changes": [s.to_json() for s in steps], "probes": probes,
                           "others": {c: other.to_json() for c, other in result.others.items()},
                           "exit": result.exit}
    if result.hint:
        doc["hint"] = result.hint
    if steps:
        first = steps[0]
        doc.update(first_bad=first.first_bad, subject=first.subject, date=first.date, parent=first.parent,
                   before=first.before, after=first.after, ops=first.ops)
        doc["accounts_for_all"] = len(steps) == 1 and not (result.exit == EXIT_AMBIGUOUS)
    kind = "release" if plan.mode == "releases" else "commit"
    for i, (step, sj) in enumerate(zip(result.changes, steps)):
        label = f"first bad {kind}" if i == 0 else f"then the first bad {kind} after it"
        if step.skipped:
            lines.append(f"{label}: one of {len(sj.candidates)} (the others could not be measured): "
                         + ", ".join(bisect.item(j).short for j in [*step.skipped, step.first_bad]))
            continue
        bad = bisect.item(step.first_bad)
        lines.append(f"{label}: {bad.name}")
        if bad.subject or bad.date:
            lines.append(f"  {bad.subject}" + (f"  ({bad.date})" if bad.date else ""))
        delta = sj.change
        spec = "+g" if measure.name == "ops" else "+.2f"
        lines.append(f"  {measure.label} of {cls}: {search.fmt_value(sj.before, measure)} -> "
                     f"{search.fmt_value(sj.after, measure)}" + (f" ({delta:{spec}})" if delta is not None else "")
                     + f" against {'the release before' if plan.mode == 'releases' else 'its parent'} "
                     f"{bisect.item(step.good).short}")
        lines.append(f"  ops that changed: {search.fmt_changes(sj.ops, measure)}")
        for index in (step.good, step.first_bad):
            if bisect.probes.get(index) and bisect.probes[index].untrusted:
                lines.append(f"  not to be trusted ({bisect.item(index).short}, a development version): "
                             + "; ".join(bisect.probes[index].untrusted))
    if steps and len(steps) > 1:
        lines.append(f"  the first bad {kind} does not account for the whole change: {len(steps)} changes found")
    if plan.mode == "releases" and steps and steps[0].first_bad:
        first_change = result.changes[0]
        good, bad = bisect.item(first_change.good).name, bisect.item(first_change.first_bad).name
        lines.append(f"  next, in a Transformers checkout: kvcache bisect --repo transformers --good v{good} "
                     f"--bad v{bad} {bisect_options(plan)}".rstrip())
    if cls and result.others:
        lines.append("other classes: " + "; ".join(
            f"{c} {search.fmt_value(o.good, measure)} -> {search.fmt_value(o.bad, measure)}"
            + (" (changed too: --class " + c + " bisects it)" if o.changed else " (unchanged)" if o.good
               is not None and o.bad is not None else f" ({o.reason})")
            for c, o in result.others.items()))
    skipped = sum(1 for i, p in bisect.probes.items()
                  if p.kv is None or bisect.judged.get(i, (None,))[0] == search.SKIP)
    cached = sum(1 for p in bisect.probes.values() if p.cached)
    lines.append(f"probes: {len(bisect.probes)} ({skipped} skipped, {cached} from the cache {plan.cache.folder})")
    return lines, doc


def bisect_options(plan: Plan) -> str:
    """The suite options to repeat in a follow-up bisect (those that differ from the defaults)."""
    opts = plan.runner.suite.options()
    pairs = dict(zip(opts[0::2], opts[1::2])) if len(opts) % 2 == 0 else {}
    parts = [f"--model {pairs.get('--kv-model', 'tiny')}"]
    if pairs.get("--kv-caches", DEFAULT_CACHES) != DEFAULT_CACHES:
        parts.append(f"--caches {shlex.quote(pairs['--kv-caches'])}")  # dynamic#beam:4: '#' starts a shell comment
    if plan.measure.name != search.DEFAULT_MEASURE:
        parts.append(f"--measure {plan.measure.name}")
    return " ".join(parts)
