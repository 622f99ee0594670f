"""``kvcache history add|plot``: runs across commits or releases, and their trend. ``add`` appends one entry (the
run's figures per class, keyed by commit or release and identity; never replaced) to a JSON-lines store, rewritten
atomically under a lock; ``plot`` draws one trend PNG per measure with the steps marked
(:mod:`kvcache.analysing.step_detect`) and writes ``steps.json`` and ``steps.md`` (docs/pull-requests.md). No torch
(matplotlib, Agg, for the PNGs)."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvcache.analysing import arguments, files
from kvcache.analysing.estimates import finite, interval
from kvcache.analysing.export import finite_figure, why_no_figure
from kvcache.analysing.judge import measure_table
from kvcache.analysing.records import Run, identity, jsonfile
from kvcache.analysing.records.file_formats import FULL_SHA, STORE_SCHEMA, HistoryEntry
from kvcache.analysing.records.jsonrecord import RecordError, too_large_number
from kvcache.analysing.report.data import ReportError
from kvcache.analysing.step_detect import Step, counted_steps, steps_markdown, timed_steps


#: The measures kept and plotted (the measure table's ``history`` rows), by name: also the PNG's file stem and the
#: figure's key in a store entry (its interval: ``<name>_ci``; counted passes' per-op parts: ``by_op``).
def trend_measures() -> dict[str, measure_table.Measure]:
    return {m.name: m for m in measure_table.selected("history")}


class HistoryError(ValueError):
    """Bad input to ``kvcache history``: a one-line message."""


# --- entries -------------------------------------------------------------------------------------------------


def figures_of(run: Run, notes: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{cache: {measure: value, ...}}``: what an entry keeps of a run, every :func:`trend_measures` figure with its
    interval (``<name>_ci``) and counted passes' per-op parts (``by_op``); a figure that is there but not a finite
    number is left out and named in ``notes``."""
    kv = run.record
    out: dict[str, dict[str, Any]] = {}
    for cache in run.caches():
        figures: dict[str, Any] = {}
        for name, m in trend_measures().items():
            raw, detail = measure_table.raw_of(kv, m, cache)
            value = raw if isinstance(raw, int) and not isinstance(raw, bool) else \
                finite_figure(raw, f"{cache}: {m.label}", notes)
            if value is None:
                continue
            figures[name] = value
            if m.interval:
                figures[f"{name}_ci"] = interval(getattr(measure_table.record_of(kv, m, cache), m.interval, None))
            if name == "counted" and isinstance(detail, dict):
                figures["by_op"] = {str(k): v for k, v in detail.items()
                                    if finite_figure(v, f"{cache}: {m.label} of {k}", notes) is not None}
        out[cache] = {k: v for k, v in figures.items() if v not in (None, {})}
    return out


def entry_of(run: Run, *, commit: str | None = None, release: str | None = None,
             notes: list[str] | None = None) -> HistoryEntry:
    """One store line for ``run`` at ``commit`` (or ``release``); HistoryError when no class has a figure (the
    message says why: every class skipped, no counted traffic or fit)."""
    ident = identity.of_run(run.record)
    found_notes: list[str] = []
    caches = {cache: found for cache, found in figures_of(run, found_notes).items() if found}
    if not caches:
        raise HistoryError(f"{run.path}: no figure to add: {why_no_figure(run, list(trend_measures()), found_notes)}")
    if notes is not None:
        notes.extend(found_notes)
    return HistoryEntry(schema=STORE_SCHEMA, commit=commit, release=release, identity=ident.to_json(),
                        setup=identity.describe(ident), transformers=run.transformers, datetime=run.datetime,
                        run=Path(run.path).name, caches=caches)


def release_of(entry: HistoryEntry) -> str:
    """An entry's release as the installer names it (``v5.23.0`` and ``5.23`` are ``5.23.0``, what an older store
    may hold), or as stored when it is not a release number."""
    try:
        return arguments.release("--release", str(entry.release))
    except ValueError:
        return str(entry.release)


def entry_key(entry: HistoryEntry) -> tuple[str, str]:
    """What makes an entry unique: its commit (or release, normalised) and its identity."""
    where = f"commit {entry.commit}" if entry.commit else f"release {release_of(entry)}"
    return where, json.dumps(entry.identity, sort_keys=True)


def label_of(entry: HistoryEntry) -> str:
    """The entry's name on an axis: the commit's first 8 characters, or the release."""
    return str(entry.commit)[:8] if entry.commit else release_of(entry)


def read_store(path: str | Path) -> list[HistoryEntry]:
    """The entries of a store (a missing store has none), each line read by :meth:`HistoryEntry.read`; HistoryError
    naming the file and line when unreadable."""
    p = Path(path)
    text = jsonfile.read_text(p, str(p), what="history store", error=HistoryError)
    entries = []
    for n, line in enumerate((text or "").splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = jsonfile.parse_json(line, f"{p}:{n}", what="history entry", error=HistoryError)
            problem = too_large_number(raw)
            if problem:  # stored before history add refused it: every plot of the store crashed on it
                raise HistoryError(f"{p}:{n}: {problem}")
            entries.append(HistoryEntry.read(raw, f"{p}:{n}"))
        except RecordError as exc:
            raise HistoryError(str(exc)) from None
    return entries


def add(store: str | Path, entry: HistoryEntry) -> None:
    """Append ``entry`` to ``store`` atomically, under a lock on its sibling ``.lock`` file
    (:func:`kvcache.analysing.records.jsonfile.update_json`); HistoryError when the store has its key already."""
    path = files.target(store)
    if not path.parent.is_dir():
        raise HistoryError(f"--store {store}: folder {path.parent} does not exist")

    def added(entries: list[HistoryEntry]) -> list[HistoryEntry]:
        where, ident = entry_key(entry)
        if any(entry_key(e) == (where, ident) for e in entries):
            raise HistoryError(f"{store} already has an entry for {where} on {entry.setup}; an entry is never "
                               "replaced (give another --commit or --release, or another store)")
        return [*entries, entry]

    def write(p: Path, entries: list[HistoryEntry]) -> None:
        text = "".join(jsonfile.dumps(e.to_json(), indent=None, sort_keys=True) for e in entries)
        try:
            files.write_text_atomically(p, text)
        except OSError as exc:
            raise HistoryError(f"--store {store}: cannot write ({exc.strerror or exc})") from None

    jsonfile.update_json(path, added, load=read_store, write=write, lock=jsonfile.sibling_lock)


def _rev_parse(rev: str, cwd: str | Path | None) -> tuple[str, str]:
    """``(full sha, "")`` of commit ``rev`` in ``cwd``, else ``("", why)``."""
    try:
        done = subprocess.run(["git", "rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}"], cwd=cwd,
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return "", f"git could not run: {exc}"
    if done.returncode != 0 or not done.stdout.strip():
        return "", " ".join(done.stderr.split()) or f"git rev-parse exit {done.returncode}"
    return done.stdout.strip(), ""


def resolve_commit(rev: str, cwd: str | Path | None = None) -> str:
    """The full sha of commit ``rev`` (``git rev-parse --verify REV^{commit}`` in ``cwd``), so that ``HEAD``, a short
    sha and the full one are one entry. A full sha that git cannot resolve here (no git, another clone's commit) is
    kept as given, lower-cased; anything else is a HistoryError naming ``rev``."""
    sha, why = _rev_parse(rev, cwd)
    if sha:
        return sha
    if FULL_SHA.fullmatch(rev):
        return rev.lower()
    raise HistoryError(f"--commit {rev!r} is not a commit of the repository here ({why}); give a commit git can "
                       "resolve (HEAD, a branch, a sha), a full 40-character sha, or --release VERSION")


def git_head(cwd: str | Path | None = None) -> str:
    """``git rev-parse HEAD`` in ``cwd`` (the full sha); HistoryError when there is no git or no repository."""
    sha, why = _rev_parse("HEAD", cwd)
    if not sha:
        raise HistoryError(f"no --commit given and git rev-parse HEAD failed ({why}); pass --commit REV or "
                           "--release VERSION")
    return sha


def release_key(release: str) -> tuple[tuple[int, Any], ...]:
    """Sort key of a release by version: numbers as numbers (``4.9`` before ``4.10``), a pre-release (``5.0.0rc1``)
    before its release, a leading ``v`` ignored."""
    text = release[1:] if release[:1] in ("v", "V") else release
    parts = re.findall(r"\d+|[A-Za-z]+", text)
    return (*((1, int(p)) if p.isdigit() else (-1, p.lower()) for p in parts), (0, ""))


def ordered(entries: list[HistoryEntry]) -> list[HistoryEntry]:
    """The entries in plotting order: releases (a store of releases only) by version, whatever order they were
    added in; commits as added (the order they were measured in)."""
    if entries and all(e.release and not e.commit for e in entries):
        return sorted(entries, key=lambda e: release_key(release_of(e)))
    return list(entries)


# --- steps ---------------------------------------------------------------------------------------------------


def setup_of(entry: HistoryEntry, measure: str) -> str:
    """What an entry's ``measure`` is comparable across: its identity key for that measure (counted passes do not
    depend on which CPU ran them, so runs from runners with other CPUs make one line)."""
    ident = entry.identity
    if not isinstance(ident, dict):
        return str(entry.setup)
    group = trend_measures()[measure].group or "counted"
    return identity.baseline_key(identity.Identity.from_json(ident, "history entry identity"), group)


def trend_series(entries: list[HistoryEntry], measure: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """``{(setup, cache): [figures per entry, {} where the entry lacks the class or is of another setup]}``,
    setups by :func:`setup_of` for ``measure``."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for i, entry in enumerate(entries):
        for cache, figures in entry.caches.items():
            row = out.setdefault((setup_of(entry, measure), str(cache)), [{} for _ in entries])
            row[i] = figures if isinstance(figures, dict) else {}
    return out


def steps_of(entries: list[HistoryEntry], measure: str) -> list[Step]:
    """The steps of every class's series of ``measure`` (see :func:`counted_steps`, :func:`timed_steps`)."""
    trend = trend_measures()[measure]
    exact = trend.exact
    labels = [label_of(e) for e in entries]
    out = []
    for (setup, cache), row in trend_series(entries, measure).items():
        values = [finite(f.get(measure)) for f in row]
        intervals = [f.get(f"{measure}_ci") for f in row]
        found = (counted_steps(values, trend.resolution or measure_table.COUNTED_RESOLUTION) if exact
                 else timed_steps(values, intervals))
        out += [Step(measure, cache, setup, i, labels[i], before, after) for i, before, after in found]
    return out


# --- plot ----------------------------------------------------------------------------------------------------


def plot(entries: list[HistoryEntry], out: str | Path) -> tuple[list[Path], list[Step]]:
    """One PNG per measure the entries have, in ``out``, and ``steps.json`` and ``steps.md``; returns the PNGs and
    the steps. The steps need no matplotlib: without it they are written all the same, then :class:`HistoryError`
    names the PNGs that could not be drawn."""
    from kvcache.analysing.report.charts import _plain_text, _pyplot
    from kvcache.analysing.report.data import PALETTE

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    labels = [label_of(e) for e in entries]
    trends = {}  # measure -> (series per (setup, cache), the figures drawn, the steps): what a PNG shows
    for measure in trend_measures():
        rows = trend_series(entries, measure)
        drawn = {key: [finite(f.get(measure)) for f in row] for key, row in rows.items()}
        drawn = {key: values for key, values in drawn.items() if any(v is not None for v in values)}
        if drawn:
            trends[measure] = (rows, drawn, [s for s in steps_of(entries, measure) if (s.setup, s.cache) in drawn])
    all_steps = [step for _, _, steps in trends.values() for step in steps]

    @_plain_text
    def draw(measure: str) -> Path:
        plt = _pyplot()
        rows, drawn, steps = trends[measure]
        setups = list(dict.fromkeys(setup for setup, _ in rows))
        colours = {key: PALETTE[i % len(PALETTE)] for i, key in enumerate(rows)}
        trend = trend_measures()[measure]
        title, exact = trend.title, trend.exact
        fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(entries) + 3), 4.2))
        for key, values in drawn.items():
            setup, cache = key
            name = cache if len(setups) == 1 else f"{cache} ({setup})"
            xs = [i for i, v in enumerate(values) if v is not None]
            ys = [values[i] for i in xs]
            ax.plot(xs, ys, marker="o", color=colours[key], label=name, drawstyle="steps-post" if exact else None)
            if not exact:
                cis = [rows[key][i].get(f"{measure}_ci") for i in xs]
                lo = [c[0] if c else y for c, y in zip(cis, ys)]
                hi = [c[1] if c else y for c, y in zip(cis, ys)]
                ax.fill_between(xs, lo, hi, color=colours[key], alpha=0.15, linewidth=0)
        for step in steps:
            colour = colours[(step.setup, step.cache)]
            ax.axvline(step.index, color=colour, linestyle="--", linewidth=1, alpha=0.8)
            last = step.index == len(entries) - 1
            ax.annotate(f"{step.label}: {step.delta:+.3g}", (step.index, step.after), xytext=(-8 if last else 8, 8),
                        textcoords="offset points", fontsize=8, color=colour, ha="right" if last else "left",
                        bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": colour, "alpha": 0.9})
            ax.plot([step.index], [step.after], marker="^" if step.delta > 0 else "v", markersize=11,
                    color=colour, linestyle="none")
        ax.set_xticks(range(len(entries)))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        ax.set_xlim(-0.5, len(entries) - 0.5)
        ax.margins(y=0.2)
        ax.set_ylabel(title.split(" (")[0])
        kind = "every change is a step" if exact else "a step where the levels' intervals do not overlap"
        by = "commit" if any(e.commit for e in entries) else "release"
        ax.set_title(f"{title} by {by}\n{'; '.join(setups)}; marked: {kind}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize=8, frameon=False)
        path = out / f"{measure}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return path

    written, undrawn = [], ""
    try:
        for measure in trends:
            written.append(draw(measure))
    except ReportError:  # no matplotlib: the steps are written all the same
        undrawn = ", ".join(f"{m}.png" for m in trends)
    feed = [{**asdict(s), "delta": s.delta} for s in all_steps]
    files.write_text_atomically(out / "steps.json", json.dumps(feed, indent=2) + "\n")
    files.write_text_atomically(out / "steps.md", steps_markdown(all_steps, entries, written))
    if undrawn:
        raise HistoryError("matplotlib is not installed (pip install matplotlib; in a checkout, "
                           f"pip install -e '.[report]'): cannot draw {undrawn}; wrote steps.json and steps.md "
                           f"({len(all_steps)} steps) to {out}")
    return written, all_steps


# --- command -------------------------------------------------------------------------------------------------


#: The files ``plot`` writes into ``--out``: one PNG per measure, steps.json and steps.md.
def plot_files() -> tuple[str, ...]:
    return (*(f"{measure}.png" for measure in trend_measures()), "steps.json", "steps.md")
