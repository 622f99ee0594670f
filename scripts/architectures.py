"""Every causal-LM model type of the installed Transformers, counted (``make architectures``): one process per
architecture (the suite's counted run, ``pytest benchmarks -m counted --kv-model arch:<type>``), so that a crash or a
hang is that architecture's skip; a progress line per architecture; its JSON and log in ``--out``; then
docs/architectures.md's table (:mod:`kvcache.analysing.architectures_table`). No torch here. docs/architectures.md::

    python scripts/architectures.py [--types a,b] [--caches dynamic,static] [--jobs 2] [--timeout 300]
                                    [--out .architectures] [--doc docs/architectures.md] [-- PYTEST ARGS]"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from versions import _argument, positive  # noqa: E402  (scripts/versions.py: the scripts' one argument check)

from kvcache.analysing.architectures_table import ArchResult, one_line, result_from_run, write_doc  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    made = argparse.ArgumentParser(prog="scripts/architectures.py", description=__doc__.split("::")[0])
    made.add_argument("--types", help="comma-separated model types (default: every causal-LM type)")
    made.add_argument("--caches", default="dynamic,static", help="--kv-caches of each run (default dynamic,static)")
    made.add_argument("--jobs", type=_argument(positive), default=2, help="architectures counted at once (default 2)")
    made.add_argument("--timeout", type=_argument(seconds), default=300.0,
                      help="seconds one architecture may take (default 300)")
    made.add_argument("--out", type=Path, default=ROOT / ".architectures", help="JSON and logs (.architectures)")
    made.add_argument("--doc", type=Path, default=ROOT / "docs" / "architectures.md", help="the page written")
    made.add_argument("--table-only", action="store_true", help="write the page from --out's results, run nothing")
    made.add_argument("--shard", metavar="I/N", help="count only every N-th architecture from the I-th (1-based), as "
                      "one job of a CI matrix does; the page is then written by a --table-only run over all shards")
    args = made.parse_args(own)
    args.pytest_args = extra
    return args


def seconds(text: str) -> float:
    """A number of seconds above 0; anything else is a ValueError naming it."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{text!r} is not a number of seconds above 0")
    return value


TOKENS = 32768  # the context the findings' costs are stated at


def list_types(kv_at: int | None = None) -> dict:
    """``kvcache architectures --all --json``: the release, {type: reason refused or None} and, with ``kv_at``, each
    accepted type's KV bytes at that many tokens of its default config."""
    cmd = [sys.executable, "-m", "kvcache.cli", "architectures", "--all", "--json"]
    done = subprocess.run([*cmd, *(["--kv-at", str(kv_at)] if kv_at else [])], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def error_line(log: str) -> str:
    """The one line a failed run says why: its ``ERROR:`` line, else the last exception line, else the last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("ERROR: "):
            return line.removeprefix("ERROR: ")
    for line in reversed(lines):
        if line.startswith(("E   ", "INTERNALERROR> ")) and ("Error" in line or "Exception" in line):
            return line.removeprefix("INTERNALERROR> ").removeprefix("E   ").strip()
    return lines[-1] if lines else "no output"


def run_one(kind: str, args: argparse.Namespace) -> tuple[ArchResult, float]:
    """Count ``kind`` in its own process; its result (:func:`collect`) and the seconds taken."""
    json_path, log_path = args.out / f"{kind}.json", args.out / f"{kind}.log"
    json_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-m", "counted", "--kv-model", f"arch:{kind}",
           "--kv-caches", args.caches, "--kv-no-gate", "--kv-baseline", "none", "-p", "no:cacheprovider", "-q",
           "--benchmark-json", str(json_path), *args.pytest_args]
    start = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        try:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, timeout=args.timeout,
                           env={**os.environ, "COLUMNS": "400"})
        except subprocess.TimeoutExpired:
            log.write(f"\n{TIMED_OUT} after {args.timeout:g} s\n")
    return collect(kind, args.out), time.monotonic() - start


TIMED_OUT = "scripts/architectures.py: timed out"
SECTION = re.compile(r"^_{3,} test_\w+\[(?P<cache>[^\]]+)\] _{3,}$")
FAILED = re.compile(r"^FAILED \S+\[(?P<cache>[^\]]+)\] - (?P<why>.*)$")


def failures(log: str) -> dict[str, str]:
    """Per class whose test failed, its error: the last ``E   ...Error: ...`` line of its section of the log (the
    short summary's ``FAILED`` line where there is none; pytest cuts that one to the terminal's width)."""
    out: dict[str, str] = {}
    cache = None
    for line in log.splitlines():
        header = SECTION.match(line)
        if header:
            cache = header["cache"]
        elif cache and line.startswith("E   ") and re.match(r"^E\s+\w+(Error|Exception)\b", line):
            out[cache] = line[1:].strip()
        match = FAILED.match(line.strip())
        if match:
            out.setdefault(match["cache"], match["why"])
    return out


def collect(kind: str, out: Path) -> ArchResult:
    """``kind``'s result from its JSON and log in ``out``: the figures, each class that failed with its error line,
    or why nothing was measured."""
    json_path, log_path = out / f"{kind}.json", out / f"{kind}.log"
    text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    if json_path.exists():
        result = result_from_run(kind, json.loads(json_path.read_text(encoding="utf-8")))
    else:
        result = ArchResult(kind)
    for cache, why in failures(text).items():  # a class whose test failed has no figure, whatever it recorded
        result.skips[cache] = one_line(why)
        result.figures.pop(cache, None)
    if not result.measured:
        timed_out = next((line for line in text.splitlines() if line.startswith(TIMED_OUT)), None)
        result.reason = one_line(timed_out.split(": ", 1)[1] if timed_out else
                                 next(iter(result.skips.values()), None) or error_line(text) if text else "not run")
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    listed = list_types()
    release, types = listed["transformers"], listed["types"]
    wanted = [t.strip() for t in args.types.split(",")] if args.types else list(types)
    unknown = [t for t in wanted if t not in types]
    if unknown:
        print(f"scripts/architectures.py: --types {','.join(unknown)} not causal-LM types of transformers "
              f"{release} (kvcache architectures --list)", file=sys.stderr)
        return 2
    results: dict[str, ArchResult] = {}
    lock = threading.Lock()
    started = time.monotonic()
    todo = [t for t in wanted if types[t] is None]
    if args.shard:
        index, count = (int(part) for part in args.shard.split("/"))
        if not 1 <= index <= count:
            print(f"scripts/architectures.py: --shard {args.shard}: I must lie in 1..N", file=sys.stderr)
            return 2
        todo = todo[index - 1::count]

    def one(kind: str) -> None:
        if args.table_only:
            result, seconds = collect(kind, args.out), 0.0
        else:
            result, seconds = run_one(kind, args)
        with lock:
            results[kind] = result
            figures = ", ".join(f"{c} {p:.2f}" for c, (p, _) in result.figures.items())
            print(f"[{len(results)}/{len(todo)}] {kind}: {figures or 'skipped: ' + (result.reason or '?')} "
                  f"({result.attention or '-'}, {seconds:.0f} s)", flush=True)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, todo))
    for kind in wanted:
        if types[kind] is not None:
            results[kind] = ArchResult(kind, reason=f"refused: {types[kind]}", refused=True)
    if args.shard:
        print(f"shard {args.shard}: {sum(r.measured for r in results.values())} of {len(todo)} measured; the page "
              "is written by --table-only over every shard's results", flush=True)
        return 0
    ordered = [results[t] for t in wanted]
    wall = time.monotonic() - started
    kv_bytes = list_types(TOKENS).get("kv_bytes", {})
    write_doc(args.doc, ordered, release=release, caches=args.caches, wall_s=None if args.table_only else wall,
              kv_bytes=kv_bytes, tokens=TOKENS)
    measured = sum(r.measured for r in ordered)
    print(f"{measured} of {len(todo)} measured in {wall / 60:.1f} min; {args.doc} written", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
