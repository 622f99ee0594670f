"""docs/architectures.md's table: one row per causal-LM model type of a release, from the sweep's per-architecture
results (``scripts/architectures.py``): the attention implementation it ran under, counted passes per cache class
(KV bytes moved per decode step / KV bytes held) with the ops that make them up, memory allocated per step per KV
byte, and the one-line reason of each class or architecture that was not measured. Standard library only."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

CLASSES = ("dynamic", "static")
OPS_SHOWN = 4  # ops named per figure (the largest)
EXTRA_ABOVE = {"dynamic": 3.0, "static": 1.0}  # passes of a plain append-and-attend step: more is an extra pass


@dataclass
class ArchResult:
    """One architecture's outcome: ``figures[class] = (passes, {op: passes})``, ``memory[class]`` = allocated
    bytes per step per KV byte held; ``reason`` why it was not measured at all, ``skips[class]`` why a class was
    not."""

    model_type: str
    attention: str | None = None
    figures: dict[str, tuple[float, dict[str, float]]] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    skips: dict[str, str] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)
    bytes_per_token: int | None = None
    reason: str | None = None
    refused: bool = False  # not a decoder-only type: listed, not counted in the measured share

    @property
    def measured(self) -> bool:
        return bool(self.figures)


def result_from_run(model_type: str, doc: dict[str, Any]) -> ArchResult:
    """An :class:`ArchResult` from a run's JSON (``--benchmark-json``; its ``kv`` section)."""
    kv = doc.get("kv") or {}
    model = kv.get("model") or {}
    out = ArchResult(model_type, attention=model.get("attention"), changes=list(model.get("changes") or []),
                     bytes_per_token=model.get("bytes_per_token"))
    for cache, figure in (kv.get("traffic") or {}).items():
        passes = figure.get("passes") if isinstance(figure, dict) else None
        if isinstance(passes, (int, float)):
            out.figures[cache] = (float(passes), dict(figure.get("by_op") or {}))
    for cache, figure in (kv.get("memory") or {}).items():
        value = figure.get("allocated_passes") if isinstance(figure, dict) else None
        if isinstance(value, (int, float)):
            out.memory[cache] = float(value)
    for skip in kv.get("skipped") or []:
        name = skip.get("cache") or skip.get("name") or "?"
        out.skips.setdefault(name, one_line(skip.get("reason") or "skipped"))
    if not out.figures and out.reason is None and out.skips:
        out.reason = next(iter(out.skips.values()))
    return out


def one_line(text: str, limit: int = 160) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def cell(text: str) -> str:
    """Text escaped for a Markdown table cell (HTML and the pipe)."""
    return html.escape(text, quote=False).replace("|", "\\|")


def figure_cell(result: ArchResult, cache: str) -> str:
    """``**7.00** (repeat 3.00, cat 2.00, …)``: bold above :data:`EXTRA_ABOVE`; a skip's reason when not counted."""
    if cache not in result.figures:
        why = result.skips.get(cache)
        return cell(f"— ({why})") if why else "—"
    passes, by_op = result.figures[cache]
    ops = sorted(by_op.items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{op} {value:.2f}" for op, value in ops[:OPS_SHOWN] if value >= 0.005)
    more = " …" if len([v for _, v in ops if v >= 0.005]) > OPS_SHOWN else ""
    figure = f"{passes:.2f}"
    if passes > EXTRA_ABOVE.get(cache, float("inf")) + 0.05:
        figure = f"**{figure}**"
    return f"{figure} ({cell(shown)}{more})" if shown else figure


def table(results: list[ArchResult]) -> str:
    """The Markdown table, one row per architecture in the order given."""
    head = ["architecture", "attention", *(f"{c} passes (ops)" for c in CLASSES), "allocated/KV byte (dynamic)",
            "not measured: why"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        memory = f"{r.memory['dynamic']:.2f}" if "dynamic" in r.memory else "—"
        why = r.reason if not r.measured else "; ".join(f"{c}: {w}" for c, w in r.skips.items() if c in CLASSES)
        lines.append("| " + " | ".join([
            f"`{cell(r.model_type)}`", cell(r.attention or "—"), *(figure_cell(r, c) for c in CLASSES), memory,
            cell(why or "")]) + " |")
    return "\n".join(lines) + "\n"


def share_line(results: list[ArchResult]) -> str:
    """One line: how many decoder-only types were measured, of how many, and the share."""
    candidates = [r for r in results if not r.refused]
    measured = sum(r.measured for r in candidates)
    share = measured / len(candidates) if candidates else 0.0
    refused = len(results) - len(candidates)
    return (f"{measured} of {len(candidates)} decoder-only causal-LM types measured ({share:.0%}); "
            f"{refused} more causal-LM types refused (encoders, encoder-decoders), listed with the reason.")


def above(results: list[ArchResult]) -> list[tuple[str, str, float, dict[str, float]]]:
    """(type, class, passes, by_op) of every figure above :data:`EXTRA_ABOVE` (+0.05), largest first."""
    out = [(r.model_type, c, p, ops) for r in results for c, (p, ops) in r.figures.items()
           if c in EXTRA_ABOVE and p > EXTRA_ABOVE[c] + 0.05]
    return sorted(out, key=lambda row: -row[2])


def gib(value: float | None) -> str:
    return "—" if value is None else f"{value / 2**30:.2f} GiB"


def findings_table(results: list[ArchResult], kv_bytes: dict[str, float | None], tokens: int) -> str:
    """Every figure above :data:`EXTRA_ABOVE`: its extra passes, the ops that count most, and what the extra passes
    move per decode step at ``tokens`` tokens of the type's default (real) config (``kv_bytes``, bfloat16)."""
    lines = ["| architecture | class | passes | extra passes | largest ops | KV at "
             f"{tokens // 1024}k tokens (real config) | extra bytes per step at {tokens // 1024}k |",
             "|---|---|---|---|---|---|---|"]
    for kind, cache, passes, by_op in above(results):
        extra = passes - EXTRA_ABOVE[cache]
        ops = ", ".join(f"{op} {v:.2f}" for op, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:OPS_SHOWN])
        held = kv_bytes.get(kind)
        lines.append(f"| `{cell(kind)}` | {cache} | {passes:.2f} | {extra:.2f} | {cell(ops)} | {gib(held)} | "
                     f"{gib(None if held is None else extra * held)} |")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- architectures table: generated by scripts/architectures.py -->", "<!-- end of the table -->"


def generated(results: list[ArchResult], *, release: str, caches: str, wall_s: float | None,
              kv_bytes: dict[str, float | None] | None = None, tokens: int = 32768) -> str:
    """The generated part of the page: the command, the summary line, the table, and the figures above a plain
    step's with what they cost at ``tokens`` tokens of each type's real geometry."""
    timing = f", wall time {wall_s / 60:.1f} min" if wall_s is not None else ""
    return "\n".join([
        BEGIN, "",
        f"transformers {cell(release)}, `--kv-caches {cell(caches)}`, bfloat16, counted contexts of the suite "
        f"(`python scripts/architectures.py`{timing}).", "",
        share_line(results), "", table(results),
        f"### Above {EXTRA_ABOVE['dynamic']:.2f} (dynamic) or {EXTRA_ABOVE['static']:.2f} (static)", "",
        "Extra passes = passes − the plain step's (dynamic: append 2 + attention read 1; static: attention read 1); "
        "what they move per decode step at "
        f"{tokens:,} tokens of the type's default config (its real geometry, bfloat16).", "",
        findings_table(results, kv_bytes or {}, tokens), END])


def write_doc(path: Any, results: list[ArchResult], *, release: str, caches: str, wall_s: float | None,
              kv_bytes: dict[str, float | None] | None = None, tokens: int = 32768) -> None:
    """Write the generated part into ``path`` between :data:`BEGIN` and :data:`END` (the rest of the page, written
    by hand, kept); a page without the markers gets them appended."""
    from pathlib import Path

    page = Path(path)
    text = page.read_text(encoding="utf-8") if page.exists() else "# Every architecture\n\n"
    part = generated(results, release=release, caches=caches, wall_s=wall_s, kv_bytes=kv_bytes, tokens=tokens)
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + part + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + part + "\n"
    page.write_text(text, encoding="utf-8")
