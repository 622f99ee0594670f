"""``counted.md`` of ``scripts/versions.py`` (``make versions``): the counted figures of one model across Transformers
releases, one row per group of consecutive releases with identical cells, one column per class, read from each
release's run records (:mod:`kvcache.analysing.records`) and rendered by the one table renderer
(:mod:`kvcache.analysing.tables`). No torch."""

from __future__ import annotations

from pathlib import Path

from kvcache.analysing import tables
from kvcache.analysing.records import KV, GpuPrediction, Memory, Traffic, load_run
from kvcache.analysing.releases import version_key
from kvcache.bisect.probing import failed_counts


def _passes(value: object) -> str:
    return tables.num(value, missing="?")


def traffic_cell(t: Traffic, memory: Memory | None = None) -> str:
    """One class's counted figures: passes (per layer kind where the model mixes them; fused and unfused when
    compiled, or the compile error), ATen ops per step and weight passes; with its counted memory (``kv.memory``),
    held and peak passes ("held 1.00 / peak 0.02 mem") and, past every sliding window, how much more it held."""
    if t.kinds:
        parts = [", ".join(f"{kind} {_passes(k.passes)}" + ("" if k.grows is not False else " (no growth)")
                           for kind, k in t.kinds.items())]
    else:
        parts = [_passes(t.passes)]
    if t.strategy is not None and t.tokens_per_step not in (None, 1):  # --kv-decoding: several tokens a step
        parts.append(f"{_passes(t.passes_per_token)} per token ({t.tokens_per_step:g} a step)")
    compiled = t.compiled
    if compiled is not None and compiled.error:
        parts.append("compile failed: " + str(compiled.error)[:60])
    elif compiled is not None:
        fused, unfused = compiled.fused, compiled.unfused
        parts.append(f"fused {_passes(fused.passes if fused else None)} / "
                     f"unfused {_passes(unfused.passes if unfused else None)}")
    if isinstance(t.ops_per_step, int):
        parts.append(f"{t.ops_per_step} ops")
    if isinstance(t.weight_passes, (int, float)):
        parts.append(f"{t.weight_passes:.3f} w")
    if memory is not None and isinstance(memory.held_passes, (int, float)):
        parts.append(f"held {_passes(memory.held_passes)} / peak {_passes(memory.peak_passes)} mem")
        growth = memory.beyond.held_growth_bytes if memory.beyond else None
        if isinstance(growth, int):
            parts.append("holds no more past the window" if growth == 0 else f"holds +{growth:,} B past the window")
    return " · ".join(parts)


def counted_cells(path: Path) -> tuple[str, dict[str, str]]:
    """(release, {class: traffic_cell, "skipped: reason" or "failed: message"}) of one run JSON: its records
    (``kv.traffic``, ``kv.memory``, ``kv.skipped``, and ``kv.session`` for the classes whose count failed)."""
    kv = load_run(path).record
    cells = {cache: "failed: " + why[:80] for cache, why in failed_classes(kv, path).items()}
    for skip in kv.skipped:  # a class skipped outright, else at the context where it was skipped
        if skip.context is None or skip.cache not in cells:
            cells[skip.cache] = "skipped: " + skip.reason[:60]
    for cache, t in kv.traffic.items():
        cells[cache] = traffic_cell(t, kv.memory.get(cache))
        for gpu, entry in (t.gpus or {}).items():  # --kv-gpus: a column per class and GPU class
            cells[f"{cache} on {gpu}"] = gpu_cell(entry)
    return str(kv.environment.transformers or "?"), cells


def with_decoding(row: tuple[str, dict[str, str]], path: Path) -> tuple[str, dict[str, str]]:
    """``row`` with the cells of the release's decoding run beside it (``decoding-<stem>.json`` for
    ``counted-<stem>.json``: ``dynamic#beam:4``, ``dynamic#assisted:self:4``), where there is one."""
    other = path.with_name(path.name.replace("counted-", "decoding-", 1))
    if other == path or not other.is_file():
        return row
    try:
        _, cells = counted_cells(other)
    except (OSError, ValueError) as exc:
        cells = {"decoding": "failed: " + str(exc)[:80]}
    return row[0], {**row[1], **{cache: cell for cache, cell in cells.items() if "#" in cache or cache == "decoding"}}


def gpu_cell(entry: GpuPrediction) -> str:
    """One class on one GPU class (``kv.traffic.<cache>.gpus.<gpu>``): the counted passes under the SDPA backend
    torch's rules select there, and the backend (``25.26 (math)``), or why it was not predicted."""
    if entry.backend is None:
        return str(entry.error or "not predicted")[:60]
    return f"{_passes(entry.passes)} ({entry.backend})"


def failed_classes(kv: KV, path: Path) -> dict[str, str]:
    """{class: why} of the classes whose count failed in the run of ``path``: ``kv.session.failed``, each with the
    message pytest showed (``kv.session.reasons``; in a run written before them, from the run's log beside it,
    ``<stem>.log`` for ``counted-<stem>.json``)."""
    if kv.session is None:
        return {}
    shown = kv.session.reasons
    if kv.session.failed and not shown:  # a run written before kv.session.reasons: the log pytest wrote beside it
        log = path.with_name(path.name.removeprefix("counted-").removesuffix(".json") + ".log")
        try:
            shown = failed_counts(log.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            shown = {}
    return {cache: shown.get(cache, "see the run's log") for cache in kv.session.failed}


def counted_table(paths: list[Path], absent: dict[str, str] | None = None) -> str:
    """Markdown (:func:`kvcache.analysing.tables.markdown`): one row per group of consecutive releases with identical
    cells, one column per class; ``absent`` ({release: reason}) adds the releases that lack the model, in release
    order."""
    rows = [with_decoding(counted_cells(p), p) for p in paths]
    rows += [(release, {"": "skipped: " + reason}) for release, reason in (absent or {}).items()]
    rows.sort(key=lambda row: version_key(row[0]))
    caches = list(dict.fromkeys(c for _, cells in rows for c in cells if c))
    # A class skipped for the same reason in every release that has the model gets a line under the table.
    present = [cells for _, cells in rows if "" not in cells]
    always = {c: present[0][c] for c in caches if present and present[0].get(c, "").startswith("skipped")
              and all(cells.get(c) == present[0][c] for cells in present)}
    caches = [c for c in caches if c not in always]
    groups: list[tuple[list[str], dict[str, str]]] = []
    for release, cells in rows:
        if groups and groups[-1][1] == cells:
            groups[-1][0].append(release)
        else:
            groups.append(([release], cells))
    table = tables.Table(["releases", *caches])
    for releases, cells in groups:
        if "" in cells:  # the release lacks the model: one cell across
            table.rows.append([", ".join(releases), cells[""], *[""] * (len(caches) - 1)])
        else:
            table.rows.append([", ".join(releases), *(cells.get(c, tables.MISSING) for c in caches)])
    lines = tables.markdown(table)
    if always:
        lines += [""] + [f"- `{c}` in every release: {tables.escape_markdown(why)}" for c, why in always.items()]
    return "\n".join(lines) + "\n"
