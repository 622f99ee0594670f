"""Counted passes across Transformers releases on this machine (``make versions``): each release installed side by
side (:mod:`kvcache.analysing.releases`), the counted suite run on each, ``kvcache compare`` over the results and
``counted.md`` (:mod:`kvcache.bisect.versions_table`); no torch (the runs are read as records). docs/releases.md::

    python scripts/versions.py [--releases 4.45.2,...] [--models M1,M2|families] [--out DIR] [--jobs 1] [--list]
                               [--decoding beam:4,assisted:self:4|none] [-- PYTEST ARGS]"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kvcache.analysing.presets import ABSENT_ARCHITECTURE  # the standard library only: no torch needed
from kvcache.analysing.records import RecordError, load_run
from kvcache.analysing.releases import (  # the one side-by-side installer (standard library only)
    ReleaseError,
    ensure,
    normalise,
    published,
    release_env,
    venv_versions,
    version_key,
    write_constraints,
)
from kvcache.analysing.releases import (
    newest_per_minor as releases_newest_per_minor,
)
from kvcache.bisect.versions_table import counted_table

ROOT = Path(__file__).resolve().parent.parent
SINCE = "4.45"
# The release list: newest patch of every minor from 4.45 on, as of writing. `make versions` uses it when
# `pip index versions` fails; .github/workflows/versions.yml's matrix lists the same releases (checked by
# tests/without_torch/test_versions_list.py). Add a new release here and there together.
RELEASES = (
    "4.45.2 4.46.3 4.47.1 4.48.3 4.49.0 4.50.3 4.51.3 4.52.4 4.53.3 4.54.1 4.55.4 4.56.2 4.57.6 "
    "5.0.0 5.1.0 5.2.0 5.3.0 5.4.0 5.5.4 5.6.2 5.7.0 5.8.1 5.9.0 5.10.4 5.11.0 5.12.1 5.13.1 5.14.1 "
    "5.15.1 5.16.1 5.17.0 5.18.0 5.19.0 5.20.2 5.21.1 5.22.2 5.23.0 5.24.0 5.25.0"
).split()
# `--models families`: every family preset at the depth its docs/models.md row uses (a multiple of its layer pattern;
# tests/suite/test_versions_script.py checks these are kvcache.analysing.presets.FAMILY_PRESETS).
FAMILIES = ("qwen3-0.6b@layers=4", "mistral-7b@layers=1", "gemma3-270m@layers=6", "qwen3-next-80b-a3b@layers=4",
            "deepseek-v2-lite@layers=1", "falcon-7b@layers=1")
DEFAULT_MODEL = "smollm2-135m"
DECODING = "beam:4,assisted:self:4"  # the default model's decoding columns (a second run per release, docs/releases.md)



# --- release lists (pure) ----------------------------------------------------------------------------------


def newest_per_minor(versions: list[str], since: str = SINCE) -> list[str]:
    """The newest patch of every ``major.minor`` at or after ``since``, oldest first
    (:mod:`kvcache.analysing.releases`)."""
    return releases_newest_per_minor(versions, since)


class Releases(list):
    """Releases, oldest first, with ``notes``: how a value given short was read (``4.45 is read as 4.45.0``)."""

    notes: list[str]


def parse_releases(text: str) -> Releases:
    """A comma-separated ``--releases`` value: final releases, deduplicated, oldest first; ``4.45`` is read as
    ``4.45.0`` (the release pip installs for it) and noted, so the install is checked against the right number."""
    given = [v.strip() for v in text.split(",") if v.strip()]
    if not given:
        raise ValueError("--releases is empty")
    read = [normalise(version) for version in given]
    releases = Releases(sorted({release for release, _ in read}, key=version_key))
    releases.notes = list(dict.fromkeys(note for _, note in read if note))
    return releases


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split at the first ``--``: (this script's arguments, extra pytest arguments)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def parse_args(argv: list[str]) -> argparse.Namespace:
    own, extra = split_argv(argv)
    parser = argparse.ArgumentParser(
        prog="scripts/versions.py", description="Counted passes across Transformers releases (make versions)."
    )
    parser.add_argument("--releases", type=_argument(parse_releases), help="comma-separated releases (default: "
                        f"newest patch of every minor since {SINCE}, from `pip index versions transformers`)")
    parser.add_argument("--since", default=SINCE, type=_argument(release_number),
                        help=f"oldest minor of the default list ({SINCE})")
    parser.add_argument("--models", type=_argument(parse_models), default=None,
                        help="comma-separated --kv-model values, each run per release, or `families` (every family "
                        "preset at its docs/models.md depth); default: the --kv-model in the pytest arguments, else "
                        f"{DEFAULT_MODEL}")
    parser.add_argument("--out", type=Path, default=ROOT / ".versions" / "results", help="JSON, logs, compare.md")
    parser.add_argument("--dir", type=Path, default=ROOT / ".versions", help="where releases are installed")
    parser.add_argument("--jobs", type=_argument(positive), default=1, help="releases installed and run at once (1)")
    parser.add_argument("--decoding", default=DECODING, help="--kv-decoding strategies counted on dynamic under "
                        f"--kv-driver generate for the default model, a column each ({DECODING}; none: no run)")
    parser.add_argument("--list", action="store_true", help="print the releases and exit")
    parser.add_argument("--tabulate", action="store_true", help="run nothing: compare and tabulate the JSON and logs "
                        "already in --out (e.g. after re-running a few releases)")
    args = parser.parse_args(own)
    args.pytest_args = extra
    return args


def _argument(parse):
    """An argparse ``type`` from a parser that raises ValueError: argparse prints its message."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def parse_models(text: str) -> list[str]:
    """A comma-separated ``--models`` value (``families`` expands to FAMILIES), deduplicated, in order."""
    models: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        for model in (FAMILIES if item == "families" else (item,) if item else ()):
            if model not in models:
                models.append(model)
    if not models:
        raise ValueError("--models is empty (give --kv-model values, or `families`)")
    from kvcache.analysing.presets import ModelError, check_name  # the standard library only: no torch needed

    for model in models:
        try:
            check_name(model)
        except ModelError as exc:
            raise ValueError(str(exc)) from None
    return models


def release_number(text: str) -> str:
    """A final release number such as ``4.45.2``, as given; anything else is a ValueError."""
    version_key(text)
    return text


def positive(text: str) -> int:
    """A whole number of at least 1; anything else is a ValueError naming it."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{text!r} is not a whole number of at least 1")
    return value


def default_releases(since: str = SINCE) -> tuple[list[str], str]:
    """(releases, where from): from the package index, else the built-in list."""
    try:
        releases = newest_per_minor(published(), since)
        if releases:
            return releases, "pip index versions transformers"
    except ReleaseError:
        pass
    return newest_per_minor(RELEASES, since), "built-in list (pip index versions failed)"


# --- installing and running ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    release: str
    status: str = "skipped"  # ran | failed | skipped
    reason: str = ""
    json: Path | None = None
    seconds: float = 0.0
    model: str | None = None  # None: the single model of a run without --models


def _stem(release: str, model: str | None) -> str:
    return release if model is None else f"{release}-{re.sub(r'[^A-Za-z0-9.=-]+', '_', model)}"


def run_release(release: str, args: argparse.Namespace, constraints: Path, installed: dict[str, str],
                model: str | None = None) -> Outcome:
    """Install ``release`` and run the counted suite on it (on ``model`` when given: ``--kv-model`` last wins)."""
    outcome = Outcome(release, model=model)
    start = time.monotonic()
    json_path = args.out / f"counted-{_stem(release, model)}.json"
    json_path.unlink(missing_ok=True)
    log_path = args.out / f"{_stem(release, model)}.log"
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            target = ensure(release, args.dir, log, cwd=ROOT, constraints=constraints, installed=installed)
        except ReleaseError as exc:
            target, outcome.reason = None, str(exc)
        if target is not None:
            # No gate, no baseline in the runs: releases are compared with each other by `kvcache compare`.
            cmd = [sys.executable, "-m", "pytest", "benchmarks", "-m", "counted", "--kv-model", DEFAULT_MODEL,
                   "--kv-caches", "all", "--kv-no-gate", "--kv-baseline", "none",
                   "-p", "no:cacheprovider",
                   "--benchmark-json", str(json_path), "-q", *args.pytest_args,
                   *(["--kv-model", model] if model is not None else [])]
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=release_env(target))
            if args.decoding != "none" and model in (None, DEFAULT_MODEL):  # the beam and assisted columns
                decoding_path = json_path.with_name(json_path.name.replace("counted-", "decoding-", 1))
                decoding_path.unlink(missing_ok=True)
                more = [sys.executable, "-m", "pytest", "benchmarks", "-m", "counted", "--kv-model", DEFAULT_MODEL,
                        "--kv-driver", "generate", "--kv-caches", "dynamic", "--kv-decoding", args.decoding,
                        "--kv-no-gate", "--kv-baseline", "none", "-p", "no:cacheprovider",
                        "--benchmark-json", str(decoding_path), "-q", *args.pytest_args]
                log.write("$ " + " ".join(more) + "\n")
                log.flush()
                subprocess.run(more, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=release_env(target))
            ran = _recorded_release(json_path)
            if ran is not None and ran != release:
                outcome.status, outcome.reason = "failed", f"the run recorded transformers {ran}, not {release}"
            elif ran is None and (absent := _absent(log_path)):
                outcome.reason = absent
            elif ran is None:
                outcome.status, outcome.reason = "failed", f"pytest exited {done.returncode} without a run JSON"
            else:
                outcome.json = json_path
                outcome.status = "ran"
                outcome.reason = "" if done.returncode == 0 else f"pytest exited {done.returncode} (JSON kept)"
    outcome.seconds = time.monotonic() - start
    return outcome


def _absent(log_path: Path) -> str | None:
    """The suite's one-line error when this release lacks the model's architecture, else None."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = [line.strip() for line in text.splitlines() if ABSENT_ARCHITECTURE in line]
    return found[-1].removeprefix("ERROR:").strip()[:200] if found else None


def recorded_outcome(release: str, out: Path, model: str | None = None) -> Outcome:
    """The outcome an earlier run left in ``out`` for ``release`` (and ``model``): its JSON, or the reason."""
    stem = _stem(release, model)
    path = out / f"counted-{stem}.json"
    ran = _recorded_release(path)
    if ran == release:
        return Outcome(release, "ran", json=path, model=model)
    absent = _absent(out / f"{stem}.log")
    if absent:
        return Outcome(release, reason=absent, model=model)
    return Outcome(release, "failed", "no run JSON of this release in --out" if ran is None else
                   f"the run recorded transformers {ran}, not {release}", model=model)


def recorded_releases(out: Path) -> list[str]:
    """The releases an earlier run left a log of in ``out`` (``<release>.log``, ``<release>-<model>.log``), oldest
    first."""
    found = {m[1] for path in out.glob("*.log") if (m := re.match(r"(\d+(?:\.\d+)+)[-.]", path.name))}
    return sorted(found, key=version_key)


def _recorded_release(path: Path) -> str | None:
    """The transformers release a run JSON records, or None when there is no readable run."""
    try:
        release = load_run(path).record.environment.transformers
    except RecordError:
        return None
    return None if release is None else str(release)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{seconds:.1f}s"


def run_releases(releases: list[str], models: list[str | None], args: argparse.Namespace) -> list[Outcome]:
    """Install and run every release (``--jobs`` at once), each model in turn, printing each outcome."""
    installed = venv_versions()
    constraints = write_constraints(args.out / "constraints.txt", installed)
    lock = threading.Lock()

    def one(release: str) -> list[Outcome]:
        outcomes = []
        for model in models:
            outcome = run_release(release, args, constraints, installed, model)
            with lock:
                note = f": {outcome.reason}" if outcome.reason else ""
                what = release if model is None else f"{release} {model}"
                print(f"  {what}: {outcome.status} in {_duration(outcome.seconds)}{note}", flush=True)
            outcomes.append(outcome)
            if outcome.reason.startswith(("pip install failed", "import failed")):
                break  # the same for every model
        return outcomes

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        return [o for batch in pool.map(one, releases) for o in batch]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.releases:
        releases, source = args.releases, "--releases"
        for note in getattr(args.releases, "notes", []):
            print(f"--releases: {note}", flush=True)
    elif args.tabulate:
        releases, source = recorded_releases(args.out), f"logs in {args.out}"
    else:
        releases, source = default_releases(args.since)
    models: list[str | None] = list(args.models) if args.models else [None]
    print(f"{len(releases)} releases ({source}): {', '.join(releases)}", flush=True)
    if args.models:
        print(f"{len(models)} models: {', '.join(args.models)}", flush=True)
    if args.list:
        return 0
    started = time.monotonic()
    args.out = args.out.resolve()
    args.dir = args.dir.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.tabulate:
        outcomes = [recorded_outcome(release, args.out, model) for release in releases for model in models]
    else:
        outcomes = run_releases(releases, models, args)

    status = 1 if any(o.status == "failed" for o in outcomes) or not any(o.json for o in outcomes) else 0
    compares, tables = [], []
    for model in models:
        mine = sorted((o for o in outcomes if o.model == model), key=lambda o: version_key(o.release))
        jsons = [o.json for o in mine if o.json is not None]
        absent = {o.release: o.reason for o in mine if o.json is None and ABSENT_ARCHITECTURE in o.reason}
        if not jsons:
            continue
        cmd = [sys.executable, "-m", "kvcache.cli", "compare", *map(str, jsons), "--markdown"]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        heading = "" if model is None else f"## {model}\n\n"
        compares.append(heading + done.stdout)
        tables.append(heading + counted_table(jsons, absent))
        print()
        print(heading + done.stdout, end="")
        print(done.stderr, end="", file=sys.stderr)
        status = max(status, done.returncode)
    if compares:
        (args.out / "compare.md").write_text("\n".join(compares), encoding="utf-8")
        (args.out / "counted.md").write_text("\n".join(tables), encoding="utf-8")
    print()
    for kind in ("ran", "failed", "skipped"):
        chosen = [o for o in outcomes if o.status == kind]
        if chosen:
            print(f"{kind} ({len(chosen)}): " + "; ".join(
                o.release + ("" if o.model is None else f" {o.model}") + (f" ({o.reason})" if o.reason else "")
                for o in chosen))
    print(f"{len(releases)} releases in {_duration(time.monotonic() - started)}; "
          f"results in {args.out}" + (" (compare.md, counted.md)" if compares else " (nothing to compare)"))
    return status


if __name__ == "__main__":
    sys.exit(main())
