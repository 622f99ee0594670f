"""``kvcache comment BASE.json HEAD.json``: one Markdown body for a pull request's comment.

HEAD is judged against BASE by ``kvcache compare``'s judge (:func:`kvcache.analysing.compare.compare`, the
session-end gate's rules) and tabled by the one table renderer (:func:`kvcache.analysing.tables.markdown`); this
module only frames it for a pull request:

- a first line with the verdict: *regression* (a measure the gate judges exactly regressed, :data:`EXACT`:
  counted passes, the counted overhead, ATen ops per step and weight passes, or counted memory; or a class with
  counted passes in BASE has none in HEAD: skipped by its conftest, unsupported, not run), *inconclusive* (no
  regression, but a judged figure could not be judged) or *clean*;
- a table of classes × measures with BASE, HEAD and Δ: counted passes (bytes moved per KV-cache byte), ATen ops
  per step, weight passes (bytes that do not grow with context per weight byte) and memory where a run has it
  (allocated, peak and held passes: bytes per logical KV-cache byte), each marked as the gate judges it;
- timed figures are judged only from an A/B run (``--ab AB.json``, or an ``ab`` section in HEAD.json: ``kvcache
  ab``'s paired verdicts, ``ab.<cache>.timed`` and ``ab.<cache>.intercept``). Timed figures of two separate runs
  are shown in a table of their own, marked informational: base and head measured one after the other drift apart;
- the ops that grew, the reasons for inconclusive figures, a link to the full report (``--report-url``);
- a hidden marker (:data:`MARKER`) so that a workflow updates one comment instead of adding one per push;
- at most ``--max-chars`` characters (GitHub's limit, 65536, by default): longer bodies are cut at a line, with
  a note.

Every string that comes from a run (class and op names, labels, reasons) is escaped for Markdown.
Exit 0 whenever a body is written, a regression included (rendering is not judging: the gate is ``kvcache
compare``'s exit status); 2 on unreadable input, bad options or runs that are not comparable. No torch here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from kvcache.analysing import arguments, gate, identity, tables
from kvcache.analysing import compare as comparing
from kvcache.analysing.files import write_text_atomically
from kvcache.analysing.records import RecordError, Run, load_run
from kvcache.analysing.stats import finite, interval
from kvcache.analysing.tables import Table, num

#: The hidden marker a workflow finds its own comment by (list the comments, PATCH the one that has it).
MARKER = "<!-- kvcache-passes-comment -->"
#: GitHub's limit on a comment's body, in characters.
GITHUB_LIMIT = 65536
REGRESSION, INCONCLUSIVE, CLEAN = "regression", "inconclusive", "clean"
HEADLINE = {
    REGRESSION: "▲ KV-cache passes: regression",
    INCONCLUSIVE: "? KV-cache passes: inconclusive",
    CLEAN: "✓ KV-cache passes: no regression",
}
#: The measures the gate judges exactly (:data:`kvcache.analysing.gate.EXACT`), as compare's regression lines name
#: them (:data:`kvcache.analysing.compare.JUDGED`): they decide the comment's verdict.
EXACT = tuple(comparing.JUDGED[m] for m in gate.EXACT)
CHANGE_WORDS = {comparing.REGRESSED: "▲ regression", comparing.IMPROVED: "▼ better",
                comparing.INCONCLUSIVE: "? inconclusive", comparing.SAME: ""}
AB_WORDS = {"regression": "▲ regression", "improvement": "▼ better", "inconclusive": "? inconclusive", "pass": ""}
DASH = comparing.DASH
TRUNCATED = ("_Truncated: this comment was longer than GitHub allows ({limit:,} characters); the full comparison is "
             "in the job summary{where}._")


def md(text: Any) -> str:
    """A run's string as Markdown prose that renders as itself: the project's one escape
    (:func:`kvcache.analysing.tables.escape_markdown`). Table cells are not passed through it here: the table
    renderer escapes every cell itself."""
    return tables.escape_markdown(text)


class CommentError(ValueError):
    """Bad input to ``kvcache comment``: a one-line message."""


# --- the body ------------------------------------------------------------------------------------------------


def _traffic(run: Run, cache: str) -> dict[str, Any]:
    value = (run.kv.get("traffic") or {}).get(cache)
    return value if isinstance(value, dict) else {}


def _delta(head: float | None, base: float | None, spec: str) -> str:
    if head is None or base is None:
        return DASH
    return format(head - base, "+" + spec)


def _memory(run: Run, cache: str) -> dict[str, float]:
    """The counted memory figures the gate judges (:data:`kvcache.analysing.gate.MEMORY_FIGURES`: allocated, peak
    and held passes, bytes per logical KV-cache byte) of a class, where the run has them (``kv.memory.<cache>``)."""
    entry = (run.kv.get("memory") or {}).get(cache)
    if not isinstance(entry, dict):
        return {}
    return {name: float(entry[name]) for name in gate.MEMORY_FIGURES if finite(entry.get(name)) is not None}


def _part_change(verdicts: dict[str, Any] | None, measure: str, part: str, improved: bool) -> str:
    """The change of one part of a judged measure (weight passes of the overhead, a memory figure): the gate's
    status of that part, else *improved* (shown only) or *same*; "" where the measure had no baseline to judge."""
    verdict = (verdicts or {}).get(measure) or {}
    if verdict.get("status") in (None, "no-baseline", "not-measured"):
        return ""
    status = ((verdict.get("parts") or {}).get(part) or {}).get("status")
    return comparing.CHANGE_OF.get(str(status)) or (comparing.IMPROVED if improved else comparing.SAME)


#: compare's measures shown as rows (:func:`kvcache.analysing.compare.cell_texts` renders their values):
#: ``(measure, row label, the Cell's change and delta fields, Δ format)``.
ROWS = (("counted", "counted passes", "counted_change", "counted_delta", ".2f"),
        ("ops", "ATen ops per step", "ops_change", "ops_delta", ".0f"),
        ("weight_passes", "weight passes", "", "", ".3f"))


def _value(cell: comparing.Cell, measure: str) -> str:
    """The value of ``measure`` as compare's table shows it, without compare's change marks (a column here)."""
    return comparing.cell_texts(replace(cell, counted_change="", ops_change="", timed_change="", memory_change="",
                                        intercept_change=""), [measure])[0]


def counted_rows(comparison: comparing.Comparison, base: Run, head: Run) -> list[list[str]]:
    """Rows ``[class, measure, BASE, HEAD, Δ, change]`` of the measures judged exactly: the comparison's cells
    rendered by compare's :func:`~kvcache.analysing.compare.cell_texts`, changes as the gate judged them; a class
    missing from HEAD is a regression where compare calls it one (``require_classes``)."""
    missing = {r.cache for r in comparison.regressions if r.measure == comparing.JUDGED["counted"]}
    rules = comparison.rules[0] if comparison.rules else gate.Rules()  # BASE's: what judged HEAD
    rows: list[list[str]] = []
    for cache in comparison.caches:
        b, h = comparison.cells[cache]
        lost = CHANGE_WORDS[comparing.REGRESSED] + ": " if cache in missing and h.counted is None else ""
        if not h.present:
            why = f"{lost}not in HEAD{': ' + h.reason if h.reason else ''}"
            rows.append([str(cache), "counted passes", _value(b, "counted"), DASH, DASH, why])
            continue
        if not b.present:
            why = f"new in HEAD{'' if b.reason is None else ' (BASE: ' + b.reason + ')'}"
            rows.append([str(cache), "counted passes", DASH, _value(h, "counted"), DASH, why])
            continue
        for measure, label, change_field, delta_field, spec in ROWS:
            bv, hv = finite(getattr(b, measure)), finite(getattr(h, measure))
            if bv is None and hv is None and not (measure == "counted" and lost):
                continue
            if change_field:
                change = getattr(h, change_field)
            else:
                better = hv is not None and bv is not None and hv < bv - rules.weight_passes_tolerance
                change = _part_change(h.judged, "overhead", measure, better)
            delta = getattr(h, delta_field) if delta_field else None
            delta_text = format(delta, "+" + spec) if finite(delta) is not None else _delta(hv, bv, spec)
            word = f"{lost}no counted passes in HEAD" if measure == "counted" and lost else CHANGE_WORDS.get(change, "")
            rows.append([str(cache), label, _value(b, measure), _value(h, measure), delta_text, word])
        base_memory, head_memory = _memory(base, cache), _memory(head, cache)
        for name in gate.MEMORY_FIGURES:
            bv, hv = base_memory.get(name), head_memory.get(name)
            if bv is None and hv is None:
                continue
            better = bv is not None and hv is not None and hv < bv - rules.memory_tolerance
            change = _part_change(h.judged, "memory", name, better)
            rows.append([str(cache), f"memory: {name.replace('_', ' ')}", num(bv, ".2f", DASH), num(hv, ".2f", DASH),
                         _delta(hv, bv, ".2f"), CHANGE_WORDS.get(change, "")])
    return rows


def _ab_section(ab: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {str(k): v for k, v in (ab or {}).items() if isinstance(v, dict)}


def _ratio(verdict: dict[str, Any]) -> str:
    ratio = finite(verdict.get("ratio"))
    if ratio is None:
        return DASH
    text = f"×{ratio:.3f}"
    ci = verdict.get("ratio_ci")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in (finite(ci[0]), finite(ci[1])):
        text += f" [{ci[0]:.3f}–{ci[1]:.3f}]"
    return text


def ab_rows(ab: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Rows ``[class, measure, BASE, HEAD, Δ, change]`` of an A/B run's paired timed verdicts (Δ: HEAD/BASE)."""
    rows = []
    for cache, measures in ab.items():
        for measure, label in (("timed", "timed passes (A/B)"), ("intercept", "intercept ms (A/B)")):
            verdict = measures.get(measure)
            if not isinstance(verdict, dict):
                continue
            a, b = finite(verdict.get("a")), finite(verdict.get("b"))
            rows.append([str(cache), label, num(a, missing=DASH), num(b, missing=DASH), _ratio(verdict),
                         AB_WORDS.get(str(verdict.get("status")), str(verdict.get("status", "")))])
    return rows


def _timed_text(value: float | None, ci: tuple[float, float] | None, spec: str = ".2f") -> str:
    text = num(value, spec, DASH)
    if value is not None and ci is not None:
        text += f" [{ci[0]:{spec}}–{ci[1]:{spec}}]"
    return text


def informational_rows(comparison: comparing.Comparison, base: Run, head: Run) -> list[list[str]]:
    """Timed figures of two separate runs, ``[class, measure, BASE, HEAD, Δ]``: shown, never judged here."""
    rows = []
    for cache in comparison.caches:
        fits = [(run.kv.get("fit") or {}).get(cache) or {} for run in (base, head)]
        for key, ci_key, label, spec in (("passes", "passes_ci", "timed passes", ".2f"),
                                         ("intercept_ms", "intercept_ci", "intercept ms", ".1f")):
            values = [finite(fit.get(key)) for fit in fits]
            if all(v is None for v in values):
                continue
            texts = [_timed_text(v, interval(fit.get(ci_key)), spec) for v, fit in zip(values, fits)]
            rows.append([str(cache), label, *texts, _delta(values[1], values[0], spec)])
    return rows


def _ops_lines(comparison: comparing.Comparison, base: Run, head: Run) -> list[str]:
    """One bullet per class whose counted ops grew: the ops whose passes rose and the ATen calls that grew."""
    lines = []
    for cache in comparison.caches:
        b, h = comparison.cells[cache]
        if not (b.present and h.present):
            continue
        bt, ht = _traffic(base, cache), _traffic(head, cache)
        grew = gate.ops_that_grew(ht.get("by_op"), bt.get("by_op") or {}) if bt.get("by_op") is not None else {}
        calls = gate.calls_that_grew(ht.get("calls"), bt.get("calls")) if bt.get("calls") is not None else ""
        parts = []
        if grew:
            parts.append("passes grew: " + ", ".join(f"{md(op)} {delta:+.2f}" for op, delta in grew.items()))
        if calls:
            parts.append(f"calls grew: {md(calls)}")
        if parts:
            lines.append(f"- **{md(cache)}**: " + "; ".join(parts))
    return lines


def _inconclusive_lines(comparison: comparing.Comparison, ab: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for cache in comparison.caches:
        judged = comparison.cells[cache][-1].judged or {}
        for measure in gate.EXACT:
            verdict = judged.get(measure) or {}
            if verdict.get("status") == "inconclusive":
                lines.append(f"- **{md(cache)}** {md(comparing.JUDGED[measure])}: {md(verdict.get('reason', ''))}")
    for cache, measures in ab.items():
        for measure in ("timed", "intercept"):
            verdict = measures.get(measure)
            if isinstance(verdict, dict) and verdict.get("status") == "inconclusive":
                lines.append(f"- **{md(cache)}** {md(measure)} (A/B): {md(verdict.get('reason', ''))}")
    return lines


def verdict_of(comparison: comparing.Comparison, ab: dict[str, dict[str, Any]]) -> tuple[str, list[str]]:
    """The comment's verdict and the classes it names: a counted regression (or an A/B timed one), else
    inconclusive where a counted or A/B verdict is, else clean. Timed verdicts of two separate runs do not count."""
    regressed = [r.cache for r in comparison.regressions if r.measure in EXACT]
    regressed += [cache for cache, m in ab.items() for k in ("timed", "intercept")
                  if isinstance(m.get(k), dict) and m[k].get("status") == "regression"]
    if regressed:
        return REGRESSION, list(dict.fromkeys(regressed))
    unsure = [cache for cache in comparison.caches
              for measure in gate.EXACT
              if ((comparison.cells[cache][-1].judged or {}).get(measure) or {}).get("status") == "inconclusive"]
    unsure += [cache for cache, m in ab.items() for k in ("timed", "intercept")
               if isinstance(m.get(k), dict) and m[k].get("status") == "inconclusive"]
    if unsure:
        return INCONCLUSIVE, list(dict.fromkeys(unsure))
    return CLEAN, []


def _link(url: str) -> str:
    """``url`` safe inside a Markdown link's parentheses (spaces, parentheses and angle brackets encoded)."""
    return quote(url, safe=":/?#[]@!$&'*+,;=%~")


def _run_line(name: str, run: Run, label: str | None) -> str:
    named = f"{md(label)}: " if label else ""
    return f"**{name}**: {named}{md(run.label)} ({md(Path(run.path).name)})"


def build(base: Run, head: Run, *, ab: dict[str, Any] | None = None, report_url: str | None = None,
          limit: int = GITHUB_LIMIT, labels: tuple[str | None, str | None] = (None, None)) -> tuple[str, str]:
    """``(verdict, body)``: the pull request's comment for HEAD against BASE (see the module docstring); the
    body ends with :data:`MARKER` and has at most ``limit`` characters. ``labels`` name BASE and HEAD (a commit)."""
    # HEAD cannot loosen its own gate (BASE's rules), nor leave a class out of it (every class BASE counted)
    comparison = comparing.compare([base, head], rules_from="first", require_classes=True)
    paired = _ab_section(ab)
    verdict, named = verdict_of(comparison, paired)
    headline = f"### {HEADLINE[verdict]}"
    if named:
        headline += ": " + ", ".join(md(c) for c in named)
    ident = identity.describe(identity.of_run(head.kv))
    lines = [headline, "", f"{_run_line('BASE', base, labels[0])} · {_run_line('HEAD', head, labels[1])} · "
                           f"{md(ident)}", ""]
    rows = counted_rows(comparison, base, head) + ab_rows(paired)
    if rows:
        table = Table(["class", "measure", "BASE", "HEAD", "Δ", "change"], rows, None, [2, 3, 4])
        lines += [*tables.markdown(table), ""]
        lines += ["Counted figures are exact: passes = bytes moved per step / KV-cache bytes; weight passes = "
                  "bytes that do not grow with context / weight bytes; memory = bytes a step allocates, peaks at "
                  "and leaves held / KV-cache bytes (passes). ▲ beyond the tolerance (the gate's judge), "
                  "▼ better, ? inconclusive.", ""]
    else:
        lines += ["_Neither run has counted figures._", ""]
    regressions = [r for r in comparison.regressions if r.measure in EXACT]
    regressions += [comparing.Regression(c, "HEAD", f"{k} (A/B)", str(m[k].get("reason", "")))
                    for c, m in paired.items() for k in ("timed", "intercept")
                    if isinstance(m.get(k), dict) and m[k].get("status") == "regression"]
    if regressions:
        lines += ["#### Regressions", "", *(f"- **{md(r.cache)}** {md(r.measure)}: {md(r.reason)}"
                                           for r in regressions), ""]
    grew = _ops_lines(comparison, base, head)
    if grew:
        lines += ["#### Ops that grew", "", *grew, ""]
    unsure = _inconclusive_lines(comparison, paired)
    if unsure:
        lines += ["#### Inconclusive", "", *unsure, ""]
    timed = [] if paired else informational_rows(comparison, base, head)
    if timed:
        lines += ["#### Timed figures (informational)", "",
                  "_Not judged: BASE and HEAD were measured one after the other, and separate timed runs drift "
                  "apart. Judge timed figures with an A/B run (`kvcache ab`), passed here as `--ab`._", "",
                  *tables.markdown(Table(["class", "measure", "BASE", "HEAD", "Δ"], timed, None, [2, 3, 4])), ""]
    if report_url:
        lines += [f"Full report: [{'job summary' if 'actions/runs' in report_url else 'report'}]"
                  f"({_link(report_url)})", ""]
    return verdict, fit_limit(lines, limit, report_url)


def fit_limit(lines: list[str], limit: int, report_url: str | None = None) -> str:
    """The lines joined, with :data:`MARKER` last; cut at a line (the verdict line kept) with a note when that
    would exceed ``limit`` characters."""
    body = "\n".join(lines).rstrip() + "\n\n" + MARKER + "\n"
    if len(body) <= limit:
        return body
    where = f" ([link]({_link(report_url)}))" if report_url else ""
    note = TRUNCATED.format(limit=limit, where=where)
    tail = "\n\n" + note + "\n\n" + MARKER + "\n"
    kept: list[str] = []
    size = len(tail)
    for line in lines:
        if size + len(line) + 1 > limit and kept:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept).rstrip() + tail


# --- command -------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcache comment",
        description="Write one Markdown body for a pull request's comment: HEAD judged against BASE by kvcache "
        "compare's judge (BASE's rules; every class BASE counted required in HEAD), a verdict line, a table of "
        "classes by measure with BASE, HEAD and change (counted passes, ATen ops per step, weight passes, counted "
        "memory in passes), the ops that grew, the reasons for inconclusive figures and "
        "a hidden marker that a workflow updates one comment by. Timed figures are judged only from an A/B run "
        "(--ab); those of two separate runs are shown as informational. Exit 0 whenever the body is written, "
        "a regression included (kvcache compare is the gate); 2 on unreadable input, bad options or runs that "
        "are not comparable.",
    )
    parser.add_argument("base", metavar="BASE.json", help="the pull request's base run (pytest --benchmark-json)")
    parser.add_argument("head", metavar="HEAD.json", help="the pull request's head run")
    parser.add_argument("--ab", metavar="AB.json", help="an A/B run (kvcache ab --json) whose paired timed "
                        "verdicts (its 'ab' section) are shown and judged; an 'ab' section in HEAD.json is used "
                        "the same way")
    parser.add_argument("--report-url", metavar="URL", help="http(s) link to the full report or job summary")
    parser.add_argument("--base-label", metavar="TEXT", help="what BASE is, e.g. 'merge base 1a2b3c4'")
    parser.add_argument("--head-label", metavar="TEXT", help="what HEAD is, e.g. 'head 5d6e7f8'")
    parser.add_argument("--out", metavar="FILE", help="write the body here instead of to stdout")
    parser.add_argument("--max-chars", type=int, default=GITHUB_LIMIT,
                        help=f"longest body, in characters (default {GITHUB_LIMIT}, GitHub's limit)")
    parser.add_argument("--allow-mismatch", action="store_true",
                        help="compare runs whose identity differs (device, model, dtype, threads) anyway")
    return parser


def _read_ab(path: str) -> dict[str, Any] | None:
    """The ``ab`` section of a JSON file, or None when it has none; CommentError when unreadable."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CommentError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise CommentError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    ab = doc.get("ab") if isinstance(doc, dict) else None
    if ab is not None and not isinstance(ab, dict):
        raise CommentError(f"{path}: its 'ab' section is {type(ab).__name__}, not an object of cache classes")
    return ab


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments.parse(_parser(), argv)
    if isinstance(args, int):  # --help (0) or a usage error (2)
        return args
    try:
        if args.max_chars < 1000:
            raise CommentError(f"--max-chars {args.max_chars} is too small; give at least 1000 (GitHub allows "
                               f"{GITHUB_LIMIT})")
        if args.report_url is not None:
            parts = urlsplit(args.report_url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise CommentError(f"--report-url {args.report_url!r} is not an http(s) URL")
        try:
            base, head = load_run(args.base), load_run(args.head)
        except RecordError as exc:
            raise CommentError(str(exc)) from None
        problem = comparing.mismatch([base, head])
        if problem and not args.allow_mismatch:
            raise CommentError(f"refusing to compare runs that differ in {problem}; pass --allow-mismatch to "
                               "compare anyway")
        ab = _read_ab(args.ab) if args.ab else _read_ab(args.head)
        if args.ab and ab is None:
            raise CommentError(f"{args.ab}: no 'ab' section; is it kvcache ab's --json output?")
    except CommentError as exc:
        print(f"kvcache comment: {exc}", file=sys.stderr)
        return 2
    try:
        verdict, body = build(base, head, ab=ab, report_url=args.report_url, limit=args.max_chars,
                              labels=(args.base_label, args.head_label))
    except RecordError as exc:  # a run whose settings cannot judge
        print(f"kvcache comment: {exc}", file=sys.stderr)
        return 2
    if args.out:
        try:
            write_text_atomically(args.out, body)
        except OSError as exc:
            print(f"kvcache comment: --out {args.out}: cannot write ({exc.strerror or exc})", file=sys.stderr)
            return 2
        print(f"kvcache comment: {verdict}; body written to {args.out} ({len(body)} characters)", file=sys.stderr)
    else:
        sys.stdout.write(body)
        sys.stdout.flush()
    return 0
