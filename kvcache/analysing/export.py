"""``kvcache export RUN.json --format github-action-benchmark``: a run's figures for the tools teams already use.

``github-action-benchmark`` (its ``customSmallerIsBetter`` tool) reads a JSON array of ``{name, unit, value,
range?, extra?}``; pytest-benchmark's own JSON would give it only the timings (it ignores ``extra_info``). One
entry per (class, measure), every figure one where smaller is better:

- ``<class>: counted passes`` (unit ``passes``: bytes one decode step moves / KV-cache bytes, exact);
- ``<class>: ATen ops per step`` (unit ``ops``) and ``<class>: weight passes`` (unit ``passes``: bytes that do not
  grow with context / weight bytes), the counted overhead;
- ``<class>: timed passes`` (unit ``passes``) and ``<class>: intercept`` (unit ``ms``, per step with an empty
  cache), with ``range``, their bootstrap interval, as text;
- ``<class>: memory allocated passes``, ``... peak passes``, ``... held passes`` (unit ``passes``: bytes one decode
  step allocates, peaks at and leaves held / logical KV-cache bytes, exact) where the run records counted memory
  (``kv.memory.<class>``; the gate's :data:`kvcache.analysing.judges.MEMORY_FIGURES`, nothing else of that section).

``name`` is stable across runs (the action draws one line per name); ``extra`` names the run's identity (model,
dtype, device, Transformers and torch releases). A figure the run lacks, or that is not finite, is left out.
``--measures`` picks measures (``counted`` alone charts the exact figures only). Exit 0, or 2 on unreadable input
or bad options. No torch here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from kvcache.analysing import arguments, identity, judges
from kvcache.analysing.files import write_text_atomically
from kvcache.analysing.records import Fit, RecordError, Run, load_run
from kvcache.analysing.stats import finite, interval

FORMATS = ("github-action-benchmark",)
#: measure -> (name suffix, unit, section (kv.traffic or kv.fit), the record's field, its interval field)
MEASURES: dict[str, tuple[str, str, str, str, str | None]] = {
    "counted": ("counted passes", "passes", "traffic", "passes", None),
    "ops": ("ATen ops per step", "ops", "traffic", "ops_per_step", None),
    "weight_passes": ("weight passes", "passes", "traffic", "weight_passes", None),
    "timed": ("timed passes", "passes", "fit", "passes", "passes_ci"),
    "intercept": ("intercept", "ms", "fit", "intercept_ms", "intercept_ci"),
}
ALL = (*MEASURES, "memory")


def extra_of(run: Run) -> str:
    """The run's identity as one line: ``tiny, bfloat16 on cpu: ...; transformers 5.24.0; torch 2.13.0+cpu``."""
    ident = identity.of_run(run.record)
    return f"{identity.describe(ident)}; transformers {run.transformers}; torch {ident.get('torch')}"


def _range(value: Any) -> str | None:
    bounds = interval(value)
    return None if bounds is None else f"{bounds[0]:.4g} to {bounds[1]:.4g} (bootstrap interval)"


def github_action_benchmark(run: Run, measures: Sequence[str] = ALL) -> list[dict[str, Any]]:
    """The ``customSmallerIsBetter`` entries of ``run``: ``name`` (str), ``unit`` (str), ``value`` (a finite
    number), ``range`` (str, where the figure has an interval) and ``extra`` (str, the identity)."""
    kv = run.record
    extra = extra_of(run)
    sections: dict[str, dict[str, Any]] = {"traffic": kv.traffic,
                                           "fit": {c: f for c, f in kv.fit.items() if isinstance(f, Fit)}}
    entries = []
    for cache in run.caches():
        for measure in measures:
            if measure == "memory":
                memory = kv.memory.get(cache)  # allocated, peak and held passes
                figures = {} if memory is None else {n: finite(getattr(memory, n)) for n in judges.MEMORY_FIGURES}
                entries += [{"name": f"{cache}: memory {name.replace('_', ' ')}", "unit": "passes", "value": value,
                             "extra": extra} for name, value in figures.items() if value is not None]
                continue
            suffix, unit, section, key, interval_key = MEASURES[measure]
            record = sections[section].get(cache)
            raw = getattr(record, key) if record is not None else None
            value = finite(raw)
            if value is None:  # absent, not finite, or not a number (a bool included)
                continue
            entry: dict[str, Any] = {"name": f"{cache}: {suffix}", "unit": unit,
                                     "value": raw if isinstance(raw, int) else value}
            text = _range(getattr(record, interval_key)) if interval_key else None
            if text:
                entry["range"] = text
            entry["extra"] = extra
            entries.append(entry)
    return entries


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcache export",
        description="Write a run's figures in a format other tools read. github-action-benchmark: a JSON array "
        "for its customSmallerIsBetter tool, one entry per class and measure (counted passes, ATen ops per step, "
        "weight passes, timed passes and intercept with their interval as range, memory allocated, peak and held "
        "passes where recorded), each "
        "with name, unit, value and the run's identity as extra. Exit 0, or 2 on unreadable input or bad "
        "options.",
    )
    parser.add_argument("run", metavar="RUN.json", help="a pytest --benchmark-json file of the suite")
    parser.add_argument("--format", required=True, metavar="FORMAT", help=f"one of: {', '.join(FORMATS)}")
    parser.add_argument("--measures", default=",".join(ALL),
                        help=f"comma-separated, from {', '.join(ALL)} (default: all the run has)")
    parser.add_argument("--out", metavar="FILE", help="write here instead of to stdout")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments.parse(_parser(), argv)
    if isinstance(args, int):  # --help (0) or a usage error (2)
        return args
    if args.format not in FORMATS:
        print(f"kvcache export: --format {args.format!r} is not known; choose from {', '.join(FORMATS)}",
              file=sys.stderr)
        return 2
    measures = [m.strip() for m in args.measures.split(",") if m.strip()]
    unknown = [m for m in measures if m not in ALL]
    if unknown or not measures:
        print(f"kvcache export: --measures {args.measures!r}: {', '.join(map(repr, unknown)) or 'none given'}; "
              f"choose from {', '.join(ALL)}", file=sys.stderr)
        return 2
    try:
        run = load_run(args.run)
    except RecordError as exc:
        print(f"kvcache export: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(github_action_benchmark(run, measures), indent=2) + "\n"
    if args.out:
        try:
            write_text_atomically(args.out, text)
        except OSError as exc:
            print(f"kvcache export: --out {args.out}: cannot write ({exc.strerror or exc})", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0
