"""Counted passes across Transformers releases on this machine (``make versions``); stdlib only.

    python scripts/versions.py [--releases 4.45.2,4.48.3,...] [--out DIR] [--jobs 1] [--list] [-- PYTEST ARGS]

Each release is installed once with its own huggingface_hub/tokenizers/safetensors into
``.versions/<release>`` (``pip install --target``), constrained to this venv's versions of every other
package (numpy included) so nothing there shadows the venv with something different; copies identical to
the venv's are then removed, and torch never lands there. The counted suite then runs with that directory
first on PYTHONPATH, writing ``<out>/counted-<release>.json`` and ``<out>/<release>.log``; a release that
does not install or import is recorded as skipped with the reason. Finally ``kvcache compare`` (oldest
release = baseline) writes ``<out>/compare.md``, and ``<out>/counted.md`` tabulates per release and class
the counted passes, ATen ops per step and weight passes (releases with identical rows grouped). Exit status:
compare's (1 on a regression), or 1 when a release's suite failed without writing its JSON or no release ran.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SINCE = "4.45"
# Released alongside transformers and pinned by it: these must come from each release's own resolution.
FAMILY = {"transformers", "huggingface-hub", "tokenizers", "safetensors", "hf-xet"}
NEVER = {"torch"}  # must come from the venv; transformers does not depend on it
BINARY_ONLY = "tokenizers,safetensors,hf-xet,numpy"  # no Rust/C builds from source
# The release list: newest patch of every minor from 4.45 on, as of writing. `make versions` uses it when
# `pip index versions` fails; .github/workflows/versions.yml's matrix lists the same releases (checked by
# tests/analysing/test_versions_list.py). Add a new release here and there together.
RELEASES = (
    "4.45.2 4.46.3 4.47.1 4.48.3 4.49.0 4.50.3 4.51.3 4.52.4 4.53.3 4.54.1 4.55.4 4.56.2 4.57.6 "
    "5.0.0 5.1.0 5.2.0 5.3.0 5.4.0 5.5.4 5.6.2 5.7.0 5.8.1 5.9.0 5.10.4 5.11.0 5.12.1 5.13.1 5.14.1 "
    "5.15.1 5.16.1 5.17.0 5.18.0 5.19.0 5.20.2 5.21.1 5.22.2 5.23.0 5.24.0"
).split()
FINAL = re.compile(r"^\d+(\.\d+)+$")


# --- release lists (pure) ----------------------------------------------------------------------------------


def version_key(version: str) -> tuple[int, ...]:
    """Numeric sort key of a final release such as ``4.45.2``."""
    if not FINAL.match(version):
        raise ValueError(f"not a final release number: {version!r}")
    return tuple(int(part) for part in version.split("."))


def parse_pip_index(text: str) -> list[str]:
    """Final releases listed by ``pip index versions PACKAGE`` (its ``Available versions:`` line)."""
    for line in text.splitlines():
        if line.strip().startswith("Available versions:"):
            listed = line.split(":", 1)[1].split(",")
            return [v.strip() for v in listed if FINAL.match(v.strip())]
    raise ValueError("no 'Available versions:' line in pip index output")


def newest_per_minor(versions: list[str], since: str = SINCE) -> list[str]:
    """The newest patch of every ``major.minor`` at or after ``since``, oldest first."""
    floor = version_key(since)[:2]
    newest: dict[tuple[int, ...], str] = {}
    for version in versions:
        key = version_key(version)
        minor = key[:2]
        if minor >= floor and (minor not in newest or key > version_key(newest[minor])):
            newest[minor] = version
    return [newest[minor] for minor in sorted(newest)]


def parse_releases(text: str) -> list[str]:
    """A comma-separated ``--releases`` value: final releases, deduplicated, oldest first."""
    releases = [v.strip() for v in text.split(",") if v.strip()]
    if not releases:
        raise ValueError("--releases is empty")
    for version in releases:
        version_key(version)
    return sorted(set(releases), key=version_key)


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
    parser.add_argument("--releases", type=_releases, help="comma-separated releases (default: newest patch of "
                        f"every minor since {SINCE}, from `pip index versions transformers`)")
    parser.add_argument("--since", default=SINCE, type=_since, help=f"oldest minor of the default list ({SINCE})")
    parser.add_argument("--out", type=Path, default=ROOT / ".versions" / "results", help="JSON, logs, compare.md")
    parser.add_argument("--dir", type=Path, default=ROOT / ".versions", help="where releases are installed")
    parser.add_argument("--jobs", type=_positive, default=1, help="releases installed and run at once (1)")
    parser.add_argument("--list", action="store_true", help="print the releases and exit")
    args = parser.parse_args(own)
    args.pytest_args = extra
    return args


def _releases(text: str) -> list[str]:
    try:
        return parse_releases(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _since(text: str) -> str:
    try:
        version_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def default_releases(since: str = SINCE) -> tuple[list[str], str]:
    """(releases, where from): from the package index, else the built-in list."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", "transformers", "--disable-pip-version-check"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
        releases = newest_per_minor(parse_pip_index(done.stdout), since)
        if releases:
            return releases, "pip index versions transformers"
    except (OSError, subprocess.SubprocessError, ValueError):
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


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def venv_versions() -> dict[str, str]:
    """Normalised name -> version of every distribution importable by this interpreter."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(_norm(name), dist.version)
    return found


def write_constraints(path: Path, installed: dict[str, str]) -> Path:
    """Pin everything outside the transformers family to the venv's version."""
    own = _norm("kvcache-passes")
    lines = [f"{name}=={version}" for name, version in sorted(installed.items()) if name not in FAMILY | {own}]
    path.write_text("\n".join(lines) + "\n")
    return path


def prune(target: Path, installed: dict[str, str]) -> list[str]:
    """Remove from ``target`` copies identical to the venv's and anything in NEVER; the names removed."""
    removed = []
    for dist in metadata.distributions(path=[str(target)]):
        name, version = _norm(dist.metadata["Name"] or ""), dist.version
        if name not in NEVER and installed.get(name) != version:
            continue
        for file in dist.files or []:
            path = Path(dist.locate_file(file)).resolve()
            if target.resolve() in path.parents and path.is_file():
                path.unlink()
        removed.append(f"{name}=={version}")
    for folder in sorted((p for p in target.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    return removed


def _last_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["(no output)"])[-1][:300]


def install(release: str, root: Path, constraints: Path, installed: dict[str, str], log) -> str | None:
    """Install ``release`` into ``root/<release>`` unless already there; None on success, else the reason."""
    target = root / release
    marker = target / ".kvcache-installed"
    if marker.exists():
        log.write(f"# {target} already installed\n")
        return None
    shutil.rmtree(target, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{release}-", dir=root))
    cmd = [sys.executable, "-m", "pip", "install", "--target", str(staging), "--no-input",
           "--disable-pip-version-check", "--only-binary", BINARY_ONLY, "-c", str(constraints),
           f"transformers=={release}"]
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    done = subprocess.run(cmd, capture_output=True, text=True)
    log.write(done.stdout + done.stderr)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        return f"pip install failed: {_last_error(done.stderr or done.stdout)}"
    removed = prune(staging, installed)
    log.write(f"# removed (same as the venv, or never wanted here): {', '.join(removed) or 'nothing'}\n")
    staging.rename(target)
    marker.write_text(f"transformers=={release}\n")
    return None


def _env(target: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), env.get("PYTHONPATH", "")) if p)
    return env


def run_release(release: str, args: argparse.Namespace, constraints: Path, installed: dict[str, str]) -> Outcome:
    outcome = Outcome(release)
    start = time.monotonic()
    json_path = args.out / f"counted-{release}.json"
    json_path.unlink(missing_ok=True)
    target = args.dir / release
    with open(args.out / f"{release}.log", "w", encoding="utf-8") as log:
        reason = install(release, args.dir, constraints, installed, log)
        if reason is None:
            probe = [sys.executable, "-c", "import transformers; print(transformers.__version__)"]
            done = subprocess.run(probe, capture_output=True, text=True, cwd=ROOT, env=_env(target))
            log.write(f"$ {' '.join(probe)}\n{done.stdout}{done.stderr}")
            if done.returncode != 0:
                reason = f"import failed: {_last_error(done.stderr)}"
            elif done.stdout.strip() != release:
                reason = f"imported transformers {done.stdout.strip()} instead of {release}"
        if reason is not None:
            outcome.reason = reason
        else:
            # No gate, no baseline in the runs: releases are compared with each other by `kvcache compare`.
            cmd = [sys.executable, "-m", "pytest", "benchmarks", "-m", "counted", "--kv-model", "smollm2-135m",
                   "--kv-caches", "all", "--kv-no-gate", "--kv-baseline", str(args.out / "no-baseline.json"),
                   "-p", "no:cacheprovider",
                   "--benchmark-json", str(json_path), "-q", *args.pytest_args]
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=_env(target))
            ran = _recorded_release(json_path)
            if ran is not None and ran != release:
                outcome.status, outcome.reason = "failed", f"the run recorded transformers {ran}, not {release}"
            elif ran is None:
                outcome.status, outcome.reason = "failed", f"pytest exited {done.returncode} without a run JSON"
            else:
                outcome.json = json_path
                outcome.status = "ran"
                outcome.reason = "" if done.returncode == 0 else f"pytest exited {done.returncode} (JSON kept)"
    outcome.seconds = time.monotonic() - start
    return outcome


def _recorded_release(path: Path) -> str | None:
    """The transformers release a run JSON records, or None when there is no readable run."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return str(doc["kv"]["environment"]["transformers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{seconds:.1f}s"


def counted_cells(path: Path) -> tuple[str, dict[str, str]]:
    """(release, {class: "passes · ops/step · weight passes" or "skipped: reason"}) of one run JSON."""
    kv = json.loads(path.read_text(encoding="utf-8"))["kv"]
    cells = {}
    for entry in kv.get("skipped") or []:
        if entry.get("context") is None:
            cells[entry["cache"]] = "skipped: " + str(entry.get("reason", ""))[:60]
    for cache, t in (kv.get("traffic") or {}).items():
        passes, ops, weight = t.get("passes"), t.get("ops_per_step"), t.get("weight_passes")
        parts = [f"{passes:.2f}" if isinstance(passes, (int, float)) else "?"]
        if isinstance(ops, int):
            parts.append(f"{ops} ops")
        if isinstance(weight, (int, float)):
            parts.append(f"{weight:.3f} w")
        cells[cache] = " · ".join(parts)
    return str(kv["environment"]["transformers"]), cells


def counted_table(paths: list[Path]) -> str:
    """Markdown: one row per group of consecutive releases with identical cells, one column per class."""
    rows = [counted_cells(p) for p in paths]
    caches = list(dict.fromkeys(c for _, cells in rows for c in cells))
    groups: list[tuple[list[str], dict[str, str]]] = []
    for release, cells in rows:
        if groups and groups[-1][1] == cells:
            groups[-1][0].append(release)
        else:
            groups.append(([release], cells))
    lines = ["| releases | " + " | ".join(caches) + " |", "|---" * (len(caches) + 1) + "|"]
    lines += ["| " + ", ".join(releases) + " | " + " | ".join(cells.get(c, "—") for c in caches) + " |"
              for releases, cells in groups]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.releases:
        releases, source = args.releases, "--releases"
    else:
        releases, source = default_releases(args.since)
    print(f"{len(releases)} releases ({source}): {', '.join(releases)}", flush=True)
    if args.list:
        return 0
    started = time.monotonic()
    args.out = args.out.resolve()
    args.dir = args.dir.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    installed = venv_versions()
    constraints = write_constraints(args.out / "constraints.txt", installed)
    lock = threading.Lock()

    def one(release: str) -> Outcome:
        outcome = run_release(release, args, constraints, installed)
        with lock:
            note = f": {outcome.reason}" if outcome.reason else ""
            print(f"  {release}: {outcome.status} in {_duration(outcome.seconds)}{note}", flush=True)
        return outcome

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(one, releases))

    jsons = [o.json for o in sorted(outcomes, key=lambda o: version_key(o.release)) if o.json is not None]
    status = 1 if any(o.status == "failed" for o in outcomes) or not jsons else 0
    if jsons:
        cmd = [sys.executable, "-m", "kvcache.cli", "compare", *map(str, jsons), "--markdown"]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        (args.out / "compare.md").write_text(done.stdout, encoding="utf-8")
        (args.out / "counted.md").write_text(counted_table(jsons), encoding="utf-8")
        print()
        print(done.stdout, end="")
        print(done.stderr, end="", file=sys.stderr)
        status = max(status, done.returncode)
    print()
    for kind in ("ran", "failed", "skipped"):
        chosen = [o for o in outcomes if o.status == kind]
        if chosen:
            print(f"{kind} ({len(chosen)}): " + "; ".join(o.release + (f" ({o.reason})" if o.reason else "")
                                                       for o in chosen))
    print(f"{len(releases)} releases in {_duration(time.monotonic() - started)}; "
          f"results in {args.out}" + (" (compare.md, counted.md)" if jsons else " (nothing to compare)"))
    return status


if __name__ == "__main__":
    sys.exit(main())
