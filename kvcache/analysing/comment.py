"""The body of ``kvcache comment BASE.json HEAD.json`` (:mod:`kvcache.commands.comment`): one Markdown body for a pull
request's comment. HEAD is judged against BASE by ``kvcache compare``'s judge and tabled by the one table renderer;
this module only frames it: the verdict line, the classes × measures table, timed figures judged only from an A/B
run, the ops that grew, the reasons, the hidden marker (:data:`COMMENT_MARKER`), at most ``limit`` characters, every
string from a run escaped (docs/pull-requests.md). No torch here."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kvcache.analysing import compare as comparing
from kvcache.analysing import tables
from kvcache.analysing.compare import Cell, Comparison, Regression
from kvcache.analysing.compare_render import cell_texts, with_interval
from kvcache.analysing.estimates import finite, interval
from kvcache.analysing.judge import judges, measure_table
from kvcache.analysing.judge.measure_table import EXACT_VERDICTS, VERDICT_LABELS, of_verdict
from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.records import Fit, Run, Verdict, identity
from kvcache.analysing.records.ab_document import PairedVerdict, read_ab_section
from kvcache.analysing.tables import MISSING, Table, num

#: The hidden marker a workflow finds its own comment by (list the comments, PATCH the one that has it).
COMMENT_MARKER = "<!-- kvcache-passes-comment -->"
#: GitHub's limit on a comment's body, in characters.
GITHUB_LIMIT = 65536
REGRESSION, INCONCLUSIVE, CLEAN = "regression", "inconclusive", "clean"
HEADLINE = {
    REGRESSION: "▲ KV-cache passes: regression",
    INCONCLUSIVE: "? KV-cache passes: inconclusive",
    CLEAN: "✓ KV-cache passes: no regression",
}
#: The verdicts of exact figures (:data:`kvcache.analysing.judge.measure_table.EXACT_VERDICTS`), as compare's
#: regression lines
#: name them: they decide the comment's verdict.
EXACT_REGRESSION_MEASURES = tuple(VERDICT_LABELS[m] for m in EXACT_VERDICTS)
CHANGE_WORDS = {comparing.REGRESSED: "▲ regression", comparing.IMPROVED: "▼ better",
                comparing.INCONCLUSIVE: "? inconclusive", comparing.SAME: ""}
AB_WORDS = {"regression": "▲ regression", "improvement": "▼ better", "inconclusive": "? inconclusive", "pass": ""}
#: The paired measures of an A/B run's ``ab`` section that the comment shows and judges.
AB_MEASURES = ("timed", "intercept")
TRUNCATED = ("_Truncated: this comment was longer than GitHub allows ({limit:,} characters); the full comparison is "
             "in the job summary{where}._")


def md(text: Any) -> str:
    """A run's string as Markdown prose that renders as itself: the project's one escape
    (:func:`kvcache.analysing.tables.escape_markdown`). Table cells are not passed through it here: the table
    renderer escapes every cell itself."""
    return tables.escape_markdown(text)


def _delta(head: float | None, base: float | None, spec: str) -> str:
    if head is None or base is None:
        return MISSING
    return format(head - base, "+" + spec)


def _memory(run: Run, cache: str) -> dict[str, float]:
    """The counted memory figures the gate judges (the memory verdict's rows of the measure table: allocated, peak
    and held passes, bytes per logical KV-cache byte) of a class, where the run has them (``kv.memory.<cache>``)."""
    memory = run.record.memory.get(cache)
    if memory is None:
        return {}
    figures = {m.field: finite(getattr(memory, m.field)) for m in of_verdict("memory")}
    return {name: value for name, value in figures.items() if value is not None}


def _judged(cell: Cell, measure: str) -> Verdict | None:
    """The judge's verdict of ``measure`` in ``cell`` (against the first run), None when not judged."""
    return cell.judged.get(measure) if cell.judged else None


def _part_change(cell: Cell, measure: str, part: str, improved: bool) -> str:
    """The change of one part of a judged measure (weight passes of the overhead, a memory figure): the gate's
    status of that part, else *improved* (shown only) or *same*; "" where the measure had no baseline to judge."""
    verdict = _judged(cell, measure)
    if verdict is None or verdict.status in ("no-baseline", "not-measured"):
        return ""
    status = comparing.part_status(verdict, part)
    return comparing.CHANGE_OF.get(str(status)) or (comparing.IMPROVED if improved else comparing.SAME)


#: Δ format of each exactly judged figure shown as a row of its own (passes: 2 decimals unless said here).
DELTA_SPEC = {"ops": ".0f", "syncs": ".0f", "weight_passes": ".3f"}


def _rows() -> tuple:
    """The commented figures with a column of compare's table, as ``(measure, label, Δ format)``: counted passes
    and the overhead's (memory and GPU classes are rows per part, below)."""
    return tuple((m.name, m.label, DELTA_SPEC.get(m.name, ".2f")) for m in measure_table.selected("commented")
                 if m.compared and not m.per_key and m.verdict != "memory")


def _value(cell: Cell, measure: str) -> str:
    """The value of ``measure`` as compare's table shows it, without compare's change marks (a column here)."""
    return cell_texts(replace(cell, changes={}), [measure])[0]


def counted_rows(comparison: Comparison, base: Run, head: Run) -> list[list[str]]:
    """Rows ``[class, measure, BASE, HEAD, Δ, change]`` of the measures judged exactly: the comparison's cells
    rendered by compare's :func:`~kvcache.analysing.compare_render.cell_texts`, changes as the gate judged them; a
    class missing from HEAD is a regression where compare calls it one (``require_classes``)."""
    missing = {r.cache for r in comparison.regressions if r.measure == VERDICT_LABELS["counted"]}
    rules = comparison.rules[0] if comparison.rules else Rules()  # BASE's: what judged HEAD
    rows: list[list[str]] = []
    for cache in comparison.caches:
        b, h = comparison.cells[cache]
        lost = CHANGE_WORDS[comparing.REGRESSED] + ": " if cache in missing and h.counted is None else ""
        if not h.present:
            why = f"{lost}not in HEAD{': ' + h.reason if h.reason else ''}"
            rows.append([str(cache), "counted passes", _value(b, "counted"), MISSING, MISSING, why])
            continue
        if not b.present:
            why = f"new in HEAD{'' if b.reason is None else ' (BASE: ' + b.reason + ')'}"
            rows.append([str(cache), "counted passes", MISSING, _value(h, "counted"), MISSING, why])
            continue
        for measure, label, spec in _rows():
            bv, hv = finite(b.figures.get(measure)), finite(h.figures.get(measure))
            if bv is None and hv is None and not (measure == "counted" and lost):
                continue
            if measure in h.changes:
                change = h.changes[measure]
            else:  # a part of a verdict (weight passes of the overhead)
                better = hv is not None and bv is not None and hv < bv - comparing.rules_tolerance(
                    rules, measure_table.BY_NAME[measure])
                change = _part_change(h, measure_table.BY_NAME[measure].verdict or "", measure, better)
            delta = h.deltas.get(measure)
            delta_text = format(delta, "+" + spec) if finite(delta) is not None else _delta(hv, bv, spec)
            word = f"{lost}no counted passes in HEAD" if measure == "counted" and lost else CHANGE_WORDS.get(change, "")
            rows.append([str(cache), label, _value(b, measure), _value(h, measure), delta_text, word])
        base_memory, head_memory = _memory(base, cache), _memory(head, cache)
        for name in (m.field for m in of_verdict("memory")):
            bv, hv = base_memory.get(name), head_memory.get(name)
            if bv is None and hv is None:
                continue
            rows.append(_part_row(cache, h, "memory", name, f"memory: {name.replace('_', ' ')}", bv, hv,
                                  rules.memory_tolerance))
        for gpu in dict.fromkeys([*(b.gpus or {}), *(h.gpus or {})]):  # --kv-gpus: passes per GPU class
            bv, hv = finite((b.gpus or {}).get(gpu)), finite((h.gpus or {}).get(gpu))
            if bv is None and hv is None:
                continue
            gpu_row = measure_table.BY_NAME["gpu"]
            rows.append(_part_row(cache, h, gpu_row.verdict or "", gpu, f"{gpu_row.label} {gpu}", bv, hv,
                                  rules.counted_tolerance))
    return rows


def _part_row(cache: str, head: Cell, measure: str, part: str, label: str, bv: float | None, hv: float | None,
              tolerance: float) -> list[str]:
    """``[class, label, BASE, HEAD, Δ, change]`` of one part of a judged measure (a memory figure, a GPU class)."""
    better = bv is not None and hv is not None and hv < bv - tolerance
    change = _part_change(head, measure, part, better)
    return [str(cache), label, num(bv), num(hv), _delta(hv, bv, ".2f"), CHANGE_WORDS.get(change, "")]


def paired(ab: dict[str, Any] | None) -> dict[str, dict[str, PairedVerdict]]:
    """``{cache: {measure: paired verdict}}`` of an A/B run's ``ab`` section (:mod:`kvcache.analysing.judge.paired`),
    the
    measures the comment shows (:data:`AB_MEASURES`); {} for none."""
    section = read_ab_section(ab) if ab else {}
    return {cache: {m: v for m, v in measures.items() if m in AB_MEASURES} for cache, measures in section.items()}


def _ratio(verdict: PairedVerdict) -> str:
    ratio = finite(verdict.ratio)
    if ratio is None:
        return MISSING
    return with_interval(f"×{ratio:.3f}", interval(verdict.ratio_ci), ".3f")


def ab_rows(ab: dict[str, dict[str, PairedVerdict]]) -> list[list[str]]:
    """Rows ``[class, measure, BASE, HEAD, Δ, change]`` of an A/B run's paired timed verdicts (Δ: HEAD/BASE)."""
    rows = []
    for cache, paired_verdicts in ab.items():
        for measure, label in (("timed", "timed passes (A/B)"), ("intercept", "intercept ms (A/B)")):
            if measure in paired_verdicts:
                verdict = paired_verdicts[measure]
                rows.append([str(cache), label, num(verdict.a), num(verdict.b), _ratio(verdict),
                             AB_WORDS.get(verdict.status, verdict.status)])
    return rows


def informational_rows(comparison: Comparison, base: Run, head: Run) -> list[list[str]]:
    """Timed figures of two separate runs, ``[class, measure, BASE, HEAD, Δ]``: shown, never judged here."""
    rows = []
    for cache in comparison.caches:
        fits = [run.record.fit.get(cache) for run in (base, head)]
        fits = [fit if isinstance(fit, Fit) else None for fit in fits]
        for key, ci_key, label, spec in (("passes", "passes_ci", "timed passes", ".2f"),
                                         ("intercept_ms", "intercept_ci", "intercept ms", ".1f")):
            values = [finite(getattr(fit, key)) if fit else None for fit in fits]
            if all(v is None for v in values):
                continue
            texts = [with_interval(num(v, spec), interval(getattr(fit, ci_key)) if fit and v is not None else None,
                                   spec) for v, fit in zip(values, fits)]
            rows.append([str(cache), label, *texts, _delta(values[1], values[0], spec)])
    return rows


def _ops_lines(comparison: Comparison, base: Run, head: Run) -> list[str]:
    """One bullet per class whose counted ops grew: the ops whose passes rose and the ATen calls that grew."""
    lines = []
    for cache in comparison.caches:
        b, h = comparison.cells[cache]
        bt, ht = base.record.traffic.get(cache), head.record.traffic.get(cache)
        if not (b.present and h.present) or bt is None or ht is None:
            continue
        grew = judges.ops_that_grew(ht.by_op, bt.by_op)
        calls = judges.calls_that_grew(ht.calls, bt.calls) if bt.calls is not None else ""
        parts = []
        if grew:
            parts.append(f"passes grew: {md(tables.by_op(grew, '+.2f'))}")
        if calls:
            parts.append(f"calls grew: {md(calls)}")
        if parts:
            lines.append(f"- **{md(cache)}**: " + "; ".join(parts))
    return lines


def _ab_with(ab: dict[str, dict[str, PairedVerdict]], status: str) -> list[tuple[str, str, PairedVerdict]]:
    """``(cache, measure, verdict)`` of the paired verdicts with ``status``."""
    return [(cache, m, v) for cache, measures in ab.items() for m, v in measures.items() if v.status == status]


def _inconclusive(comparison: Comparison) -> list[tuple[str, str, Verdict]]:
    """``(cache, measure, verdict)`` of HEAD's exactly judged measures that the judge found inconclusive."""
    found = [(cache, m, _judged(comparison.cells[cache][-1], m)) for cache in comparison.caches for m in EXACT_VERDICTS]
    return [(cache, m, v) for cache, m, v in found if v is not None and v.status == "inconclusive"]


def _inconclusive_lines(comparison: Comparison, ab: dict[str, dict[str, PairedVerdict]]) -> list[str]:
    lines = [f"- **{md(cache)}** {md(VERDICT_LABELS[m])}: {md(v.reason)}"
             for cache, m, v in _inconclusive(comparison)]
    lines += [f"- **{md(cache)}** {md(m)} (A/B): {md(v.reason)}"
              for cache, m, v in _ab_with(ab, "inconclusive")]
    return lines


def verdict_of(comparison: Comparison, ab: dict[str, dict[str, PairedVerdict]]) -> tuple[str, list[str]]:
    """The comment's verdict and the classes it names: a counted regression (or an A/B timed one), else
    inconclusive where a counted or A/B verdict is, else clean. Timed verdicts of two separate runs do not count."""
    regressed = [r.cache for r in comparison.regressions if r.measure in EXACT_REGRESSION_MEASURES]
    regressed += [cache for cache, _, _ in _ab_with(ab, "regression")]
    if regressed:
        return REGRESSION, list(dict.fromkeys(regressed))
    unsure = [cache for cache, _, _ in _inconclusive(comparison)]
    unsure += [cache for cache, _, _ in _ab_with(ab, "inconclusive")]
    if unsure:
        return INCONCLUSIVE, list(dict.fromkeys(unsure))
    return CLEAN, []


def link(url: str) -> str:
    """``url`` safe inside a Markdown link's parentheses (spaces, parentheses and angle brackets encoded)."""
    return quote(url, safe=":/?#[]@!$&'*+,;=%~")


def _run_line(name: str, run: Run, label: str | None) -> str:
    named = f"{md(label)}: " if label else ""
    return f"**{name}**: {named}{md(run.label)} ({md(Path(run.path).name)})"


def build(base: Run, head: Run, *, ab: dict[str, Any] | None = None, report_url: str | None = None,
          limit: int = GITHUB_LIMIT, labels: tuple[str | None, str | None] = (None, None)) -> tuple[str, str]:
    """``(verdict, body)``: the pull request's comment for HEAD against BASE (see the module docstring); the
    body ends with :data:`COMMENT_MARKER` and has at most ``limit`` characters. ``labels`` name BASE and HEAD (a
    commit)."""
    # HEAD cannot loosen its own gate (BASE's rules), nor leave a class out of it (every class BASE counted)
    comparison = comparing.compare([base, head], rules_from="first", require_classes=True)
    pairs = paired(ab)
    verdict, named = verdict_of(comparison, pairs)
    headline = f"### {HEADLINE[verdict]}"
    if named:
        headline += ": " + ", ".join(md(c) for c in named)
    ident = identity.describe(identity.of_run(head.record))
    lines = [headline, "", f"{_run_line('BASE', base, labels[0])} · {_run_line('HEAD', head, labels[1])} · "
                           f"{md(ident)}", ""]
    rows = counted_rows(comparison, base, head) + ab_rows(pairs)
    if rows:
        table = Table(["class", "measure", "BASE", "HEAD", "Δ", "change"], rows, None, [2, 3, 4])
        lines += [*tables.markdown(table), ""]
        lines += ["Counted figures are exact: passes = bytes moved per step / KV-cache bytes; weight passes = "
                  "bytes that do not grow with context / weight bytes; memory = bytes a step allocates, peaks at "
                  "and leaves held / KV-cache bytes (passes). ▲ beyond the tolerance (the gate's judge), "
                  "▼ better, ? inconclusive.", ""]
    else:
        lines += ["_Neither run has counted figures._", ""]
    regressions = [r for r in comparison.regressions if r.measure in EXACT_REGRESSION_MEASURES]
    regressions += [Regression(c, "HEAD", f"{m} (A/B)", v.reason)
                    for c, m, v in _ab_with(pairs, "regression")]
    if regressions:
        lines += ["#### Regressions", "", *(f"- **{md(r.cache)}** {md(r.measure)}: {md(r.reason)}"
                                           for r in regressions), ""]
    grew = _ops_lines(comparison, base, head)
    if grew:
        lines += ["#### Ops that grew", "", *grew, ""]
    unsure = _inconclusive_lines(comparison, pairs)
    if unsure:
        lines += ["#### Inconclusive", "", *unsure, ""]
    timed = [] if ab else informational_rows(comparison, base, head)  # an A/B run judges the timed figures
    if timed:
        lines += ["#### Timed figures (informational)", "",
                  "_Not judged: BASE and HEAD were measured one after the other, and separate timed runs drift "
                  "apart. Judge timed figures with an A/B run (`kvcache ab`), passed here as `--ab`._", "",
                  *tables.markdown(Table(["class", "measure", "BASE", "HEAD", "Δ"], timed, None, [2, 3, 4])), ""]
    if report_url:
        lines += [f"Full report: [{'job summary' if 'actions/runs' in report_url else 'report'}]"
                  f"({link(report_url)})", ""]
    return verdict, fit_limit(lines, limit, report_url)


def fit_limit(lines: list[str], limit: int, report_url: str | None = None) -> str:
    """The lines joined, with :data:`COMMENT_MARKER` last; cut at a line (the verdict line kept) with a note when that
    would exceed ``limit`` characters."""
    body = "\n".join(lines).rstrip() + "\n\n" + COMMENT_MARKER + "\n"
    if len(body) <= limit:
        return body
    where = f" ([link]({link(report_url)}))" if report_url else ""
    note = TRUNCATED.format(limit=limit, where=where)
    tail = "\n\n" + note + "\n\n" + COMMENT_MARKER + "\n"
    kept: list[str] = []
    size = len(tail)
    for line in lines:
        if size + len(line) + 1 > limit and kept:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept).rstrip() + tail
