"""The output of ``kvcache sentinel``: each change found (a step: the first commit or release that moved one figure),
the changes still open and those recovered, the terminal lines, the ``--json`` document, and the Markdown of the
``--issue-out`` body and of one issue per change (grouped by the commit that made it), every string from a run or
a commit escaped (:func:`kvcache.analysing.tables.escape_markdown`). Standard library only."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvcache.analysing import tables
from kvcache.bisect import search
from kvcache.bisect.report import bisect_options

if TYPE_CHECKING:
    from kvcache.analysing.records.file_formats import BisectStep
    from kvcache.bisect.probing import ProbeResult, Revision
    from kvcache.bisect.walk import Plan
    from kvcache.sentinel.figures import Watched


@dataclass
class Found:
    """What one range gave: the steps of every figure that moved (:func:`report.step`; a figure the head no longer
    has: :func:`report.lost`) and the head's figures."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    head: dict[str, Watched] = field(default_factory=dict)


SENTINEL_JSON_FORMAT = 1
ISSUE_MARKER = "<!-- kvcache-sentinel: {key} -->"  # in each issue body: the change the issue is about


def _figure(watched: Watched) -> dict[str, Any]:
    m = watched.measure
    return {"figure": watched.key, "label": watched.label, "cache": watched.cache, "measure": m.name,
            "path": list(m.path), "unit": m.unit, "tolerance": watched.tolerance}


def reproduce(plan: Plan, cache: str, parent: str, bad: str) -> str:
    """The ``kvcache bisect`` command that finds the same change again."""
    extra = plan.runner.suite.extra
    where = (f"--releases {parent}..{bad}" if plan.mode == "releases"
             else f"--repo transformers --good {parent} --bad {bad}")
    return (f"kvcache bisect {where} {bisect_options(plan)} --class {shlex.quote(cache)}"
            + (" -- " + " ".join(extra) if extra else ""))


def step(watched: Watched, found: BisectStep, plan: Plan) -> dict[str, Any]:
    """One change of one figure from a bisect's step (:func:`kvcache.bisect.report.step_record`)."""
    bad = found.first_bad or (found.candidates or [None])[-1]
    return {**_figure(watched), "kind": "changed", "commit": found.first_bad, "candidates": list(found.candidates),
            "subject": found.subject, "date": found.date, "parent": found.parent, "before": found.before,
            "after": found.after, "change": found.change, "ops": found.ops,
            "reproduce": reproduce(plan, watched.cache, found.parent, bad) if bad else None}


def unbisected(watched: Watched, before: float, plan: Plan, reason: str) -> dict[str, Any]:
    """A figure that moved between the ends whose commit the walk could not name, and why."""
    return {**_figure(watched), "kind": "changed", "commit": None, "candidates": [], "subject": "", "date": "",
            "parent": plan.ends[0].name, "before": before, "after": watched.value, "change": watched.value - before,
            "ops": {}, "reason": reason, "reproduce": reproduce(plan, watched.cache, plan.ends[0].name,
                                                                plan.ends[1].name)}


def lost(key: str, before: float, plan: Plan) -> dict[str, Any]:
    """A figure of the last commit checked that the head no longer has (its class failed, or was skipped)."""
    return {"figure": key, "label": key, "cache": key.split(".")[1], "kind": "lost", "commit": None,
            "candidates": [], "subject": "", "date": "", "parent": plan.ends[0].name, "before": before,
            "after": None, "change": None, "ops": {}, "unit": "", "reproduce": None,
            "reason": f"not measured at {plan.ends[1].short} (a figure that is missing cannot be bisected: "
                      "the head's run says why)"}


def settle(opened: list[dict[str, Any]], found: Found, head: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(still open, recovered)``: a change reported before (``opened``, oldest first) is recovered when its figure
    is back within its tolerance of where it was before that change, or before an earlier open change of the same
    figure (undoing the first of two changes undoes both). A recovered change is named with the step of this run that
    brought the figure back to where it was before it (else the last step of the figure, where there is one), and the
    figure's steps are marked ``recovered``; every other step of this run opens a new change."""
    still, recovered = [], []
    for figure in dict.fromkeys(i["figure"] for i in opened):
        chain = [i for i in opened if i["figure"] == figure]
        now = found.head.get(figure)
        back = next((n for n, i in enumerate(chain) if now is not None
                     and not search.differs(now.value, i["before"], now.tolerance)), len(chain))
        still += [{**i, "now": now.value} if now is not None else i for i in chain[:back]]
        if back == len(chain):
            continue
        steps = [s for s in found.steps if s["figure"] == figure]
        for s in steps:
            s["kind"] = "recovered"
        for i in chain[back:]:  # named with the step that brought the figure back to where it was before it
            at = next((s for s in steps if s["after"] is not None
                       and not search.differs(s["after"], i["before"], now.tolerance)), steps[-1] if steps else {})
            recovered.append({**i, "now": now.value, "recovered_at": at.get("commit"),
                              "recovered_subject": at.get("subject", ""), "recovered_date": at.get("date", "")})
    still += [{**s, "found_at": head, "now": found.head[s["figure"]].value if s["figure"] in found.head else None}
              for s in found.steps if s["kind"] != "recovered"]
    return still, recovered


def change_key(change: dict[str, Any]) -> str:
    """The change an issue is about: the commit (or release) that made it, else the range's figure; letters, digits
    and ``. _ @ -`` only (it goes into the issue's marker and the workflow's filter)."""
    key = change["commit"] or (f"candidates-{change['candidates'][0]}" if change["candidates"]
                               else f"unbisected-{change['parent'][:12]}-{change['figure']}")
    return re.sub(r"[^A-Za-z0-9._@-]", "-", key)


def document(mode: str, where: str, branch: str | None, start: Revision, end: Revision | None, options: list[str],
             notes: list[str]) -> dict[str, Any]:
    return {"kvcache_sentinel": SENTINEL_JSON_FORMAT, "mode": mode, "where": where, "branch": branch,
            "last": start.name, "head": end.name if end is not None else None, "options": options, "notes": notes}


def probe_entry(probe: ProbeResult) -> dict[str, Any]:
    """One probe of the run: the commit or release, what it imported, and why it has no figures (a skip)."""
    return {"item": probe.item.name, "subject": probe.item.subject, "transformers": probe.transformers,
            "skipped": probe.kv is None, "reason": probe.reason, "untrusted": probe.untrusted,
            "cached": probe.cached, "seconds": round(probe.seconds, 1)}


def fill(doc: dict[str, Any], found: Found, recovered: list[dict[str, Any]], still: list[dict[str, Any]], code: int,
         probes: list[ProbeResult]) -> None:
    """Complete ``doc`` with what the run found, the changes open and recovered, one issue per change, the probes
    and the exit status."""
    doc["probes"] = [probe_entry(p) for p in probes]
    doc.setdefault("status", "changed" if found.steps or recovered else "unchanged")
    if found.head:
        doc["figures"] = {k: w.value for k, w in found.head.items()}
    doc.update(changes=found.steps, recovered=recovered, open=still, exit=code)
    doc["issues"] = [{"key": key, "state": "open" if parts["open"] else "closed",
                      "title": issue_title(key, parts, doc), "body": issue_body(key, parts, doc)}
                     for key, parts in grouped(still, recovered).items()]


def grouped(opened: list[dict[str, Any]], recovered: list[dict[str, Any]]) -> dict[str, dict[str, list]]:
    """``{change key: {"open": [...], "recovered": [...]}}``: the figures of each change (:func:`change_key`)."""
    groups: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for state, items in (("open", opened), ("recovered", recovered)):
        for change in items:
            groups.setdefault(change_key(change), {"open": [], "recovered": []})[state].append(change)
    return groups


def _short(name: str | None) -> str:
    return (name or "")[:12]


def issue_title(key: str, parts: dict[str, list[dict[str, Any]]], doc: dict[str, Any]) -> str:
    changes = parts["open"] + parts["recovered"]
    what = ", ".join(dict.fromkeys(c["label"] for c in changes))
    first = changes[0]
    at = _short(first["commit"]) if first["commit"] else "a commit not named"
    return f"kvcache sentinel: {at} changed {what}"[:250]


def value(number: float | None, unit: str) -> str:
    if number is None:
        return tables.MISSING
    return f"{number:g}" if unit == "ops" else f"{number:.3f}" if unit == "weight passes" else f"{number:.2f}"


def measure_of(change: dict[str, Any]) -> search.Followed:
    """The bisect measure a change was found in (counted passes for a change recorded without one)."""
    return search.followed(str(change.get("measure", "")))


def change_rows(changes: list[dict[str, Any]], now: bool) -> list[str]:
    table = tables.Table(["figure", "before", "after", *(["now"] if now else []), "ops that changed"])
    for c in changes:
        measure = measure_of(c)
        ops = search.fmt_changes(c["ops"], measure) if c.get("ops") else (c.get("reason") or tables.MISSING)
        table.rows.append([c["label"], value(c["before"], c["unit"]), value(c["after"], c["unit"]),
                           *([value(c.get("now"), c["unit"])] if now else []), ops])
    return tables.markdown(table)


def commit_line(change: dict[str, Any], kind: str) -> str:
    if change["commit"]:
        subject = tables.escape_markdown(change["subject"]) if change["subject"] else ""
        return (f"First {kind} that changed it: `{change['commit']}`" + (f" {subject}" if subject else "")
                + (f" (authored {tables.escape_markdown(change['date'])})" if change["date"] else ""))
    if change["candidates"]:
        return (f"One of these {kind}s changed it (the others between could not be measured): "
                + ", ".join(f"`{c}`" for c in change["candidates"]))
    return f"No {kind} named: {tables.escape_markdown(change.get('reason') or '')}"


def section(key: str, parts: dict[str, list[dict[str, Any]]], doc: dict[str, Any]) -> list[str]:
    """The Markdown of one change: the commit, its figures before and after (and now), the ops, how to reproduce."""
    kind = "release" if doc["mode"] == "releases" else "commit"
    changes = parts["open"] + parts["recovered"]
    first = changes[0]
    lines = [f"### {tables.escape_markdown(issue_title(key, parts, doc))}", "", commit_line(first, kind), ""]
    lines += change_rows(changes, now=True)
    for at in dict.fromkeys(c.get("recovered_at") for c in parts["recovered"]):
        back = [c for c in parts["recovered"] if c.get("recovered_at") == at]
        where = f"`{at}`" if at else f"the range up to `{doc['head']}`"
        subject = back[0].get("recovered_subject")
        lines += ["", f"**Recovered** at {where}" + (f" {tables.escape_markdown(subject)}" if subject else "") + ": "
                  + tables.escape_markdown(", ".join(f"{c['label']} back to {value(c['now'], c['unit'])}"
                                                     for c in back))]
    commands = list(dict.fromkeys(c["reproduce"] for c in changes if c.get("reproduce")))
    if commands:
        lines += ["", "Reproduce it (in a Transformers checkout):", "", "```sh", *commands, "```"]
    return lines


def footer(doc: dict[str, Any]) -> list[str]:
    where = (f"`{doc['last']}` .. `{doc['head']}` on {tables.escape_markdown(doc['branch'] or '')}"
             if doc["mode"] == "commits" else tables.escape_markdown(doc["where"]))
    return ["", f"Found by `kvcache sentinel` ({where}); suite: {tables.escape_markdown(' '.join(doc['options']))}. "
                "Counted figures are exact: a change beyond the counted judge's tolerance is a change in what the "
                "code does."]


def issue_body(key: str, parts: dict[str, list[dict[str, Any]]], doc: dict[str, Any]) -> str:
    return "\n".join([ISSUE_MARKER.format(key=key), *section(key, parts, doc), *footer(doc)]) + "\n"


def issue_out_body(doc: dict[str, Any]) -> str:
    """The ``--issue-out`` body: every change of the run and every change it found recovered."""
    lines = [f"## kvcache sentinel: {doc['status']}"]
    if doc.get("reason"):
        lines += ["", f"The head could not be measured: {tables.escape_markdown(doc['reason'])}"]
    this_run = [{**c, "now": doc.get("figures", {}).get(c["figure"])} for c in doc["changes"]
                if c["kind"] != "recovered"]
    for key, parts in grouped(this_run, doc["recovered"]).items():
        lines += ["", *section(key, parts, doc)]
    if doc.get("releases"):
        lines += ["", *release_table(doc)]
    if not doc["changes"] and not doc["recovered"]:
        lines += ["", "No counted figure changed."]
    return "\n".join([*lines, *footer(doc)]) + "\n"


def release_table(doc: dict[str, Any]) -> list[str]:
    """One row per release replayed: the figures that changed at it (before -> after) and the ops."""
    table = tables.Table(["release", "figures that changed", "ops that changed"])
    for row in doc["releases"]:
        if row.get("skipped"):
            table.rows.append([row["release"], f"skipped: {row['skipped']}", ""])
            continue
        moved = [f"{c['label']} {value(c['before'], c['unit'])} → {value(c['after'], c['unit'])}"
                 for c in row["changes"]]
        ops = [search.fmt_changes(c["ops"], measure_of(c))
               for c in row["changes"] if c.get("ops")]
        table.rows.append([row["release"], "; ".join(moved) or "none", "; ".join(dict.fromkeys(ops))])
    return tables.markdown(table)


def terminal_lines(doc: dict[str, Any]) -> list[str]:
    """The closing lines for the terminal."""
    out = []
    for c in doc["changes"]:
        at = (c["commit"] or ("one of " + ", ".join(_short(x) for x in c["candidates"]) if c["candidates"]
                              else f"not named ({c.get('reason')})"))
        out.append(f"{c['kind']}: {c['label']} {value(c['before'], c['unit'])} -> {value(c['after'], c['unit'])} "
                   f"at {at}" + (f"  {c['subject']}" if c["subject"] else ""))
        if c.get("ops"):
            measure = measure_of(c)
            out.append(f"  ops that changed: {search.fmt_changes(c['ops'], measure)}")
    for c in doc["recovered"]:
        out.append(f"recovered: {c['label']} back to {value(c['now'], c['unit'])} (changed at "
                   f"{_short(c['commit']) or 'a commit not named'}: {value(c['before'], c['unit'])} -> "
                   f"{value(c['after'], c['unit'])})")
    if not doc["changes"] and not doc["recovered"]:
        out.append("no counted figure changed" + (f" ({len(doc['figures'])} figures)" if doc.get("figures") else ""))
    out.append(f"open changes: {len(doc['open'])}")
    return out
