"""The probes of ``kvcache bisect``: what is probed (:class:`Revision`, a commit or a release), what a probe gave
(:class:`ProbeResult`), how a probe runs the counted suite (:class:`Suite`: one pytest run per commit or release,
forked from the :mod:`kvcache.bisect.server` or a new interpreter) and the probe cache (:class:`ProbeCache`) with the
identity it is keyed by. Standard library only: a probe's figures come back as its run JSON's ``kv`` section.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import machinery, metadata, util
from pathlib import Path
from typing import Any, Callable

from kvcache import exits
from kvcache.analysing import releases as installer
from kvcache.analysing.records import KV, RecordError, Skip, jsonfile, load_run
from kvcache.analysing.records.file_formats import ProbeEntry
from kvcache.bisect.server import ForkServer, ServerRefused

#: bisect's codes (kvcache.exits): found is a pass, no change between the ends its own 1, only skipped commits left
#: could not measure
EXIT_FOUND, EXIT_SAME, EXIT_USAGE, EXIT_AMBIGUOUS, EXIT_INTERRUPTED = (
    exits.PASS, exits.REGRESSION, exits.USAGE_ERROR, exits.NOT_MEASURED, exits.INTERRUPTED)
DEFAULT_CACHES = "dynamic,static"
DEFAULT_DEVICE = "cpu"  # --kv-device of every probe unless one is given after --: counted figures need no GPU
PROBE_TIMEOUT = 900  # seconds: a commit whose counted run takes longer is skipped (a hang, not a figure)
PROBE_CACHE_FORMAT = 1


class BisectError(Exception):
    """Bad input, or an end of the range that cannot be measured; the message is one line."""


@dataclass
class Revision:
    """A commit (``key`` its full sha) or a published release (``key`` ``release-<version>``)."""

    key: str
    name: str  # the full sha, or the release number
    subject: str = ""
    date: str = ""

    @property
    def short(self) -> str:
        return self.name[:12] if re.fullmatch(r"[0-9a-f]{40,64}", self.name) else self.name


@dataclass
class ProbeResult:
    """What one probe of one item gave: the run's ``kv`` section as records, or the reason it has none."""

    item: Revision
    kv: KV | None = None
    reason: str | None = None
    transformers: str | None = None
    untrusted: list[str] = field(default_factory=list)
    cached: bool = False
    seconds: float = 0.0
    cacheable: bool = True


# --- the identity a probe is cached under ---------------------------------------------------------------------------


#: Packages of this environment a probe imports besides Transformers' source (a commit that failed to import against
#: one version may import against another): part of the identity.
IDENTITY_PACKAGES = ("huggingface-hub", "tokenizers", "safetensors", "numpy", "pytest", "pytest-benchmark")


def suite_files() -> list[tuple[Path, Path]]:
    """``(root, file)`` of every source file whose change can change a probe's figures: the whole kvcache package
    (what measures, and what builds ``kv.traffic`` from it: analysing/analysis.py, records.py, ...) and the
    benchmarks the probes run; ``__pycache__`` left out."""
    package = Path(__file__).resolve().parents[1]
    folders = [(package.parent, package)]
    spec = util.find_spec("kvcache.benchmarks")
    if spec is not None and spec.submodule_search_locations:
        folders += [(Path(p).parent, Path(p)) for p in spec.submodule_search_locations]
    else:
        folders.append((package.parent, package.parent / "benchmarks"))
    found = []
    for root, folder in folders:
        if folder.is_dir():
            found += [(root, f) for f in sorted(folder.rglob("*")) if f.is_file() and "__pycache__" not in f.parts]
    return list(dict.fromkeys(found))


def suite_hash() -> str:
    """SHA-256 (16 hex digits) of :func:`suite_files`, so that cached probes of another suite are never reused."""
    digest = hashlib.sha256()
    for root, file in suite_files():
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def module_files(name: str, path: list[str] | None = None) -> list[Path]:
    """The source files of module ``name`` (a package: every ``.py`` under it) as the probes would find it on
    ``path`` (default: ``PYTHONPATH``, then this interpreter's ``sys.path``), found without importing anything; []
    when it is not found (a name a probe resolves some other way)."""
    search = path if path is not None else [*os.environ.get("PYTHONPATH", "").split(os.pathsep), *sys.path]
    spec = None
    for part in name.split("."):
        spec = machinery.PathFinder.find_spec(part, [p or "." for p in search])
        if spec is None:
            return []
        search = list(spec.submodule_search_locations or [])
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return sorted(f for p in spec.submodule_search_locations for f in Path(p).rglob("*.py"))
    return [Path(spec.origin)] if spec.origin and Path(spec.origin).is_file() else []


def extra_identity(extra: list[str]) -> list[str]:
    """The pytest arguments after ``--`` as they key the cache: a plugin module (``-p NAME``) and any argument that
    names a file keep their name and gain ``@sha256:`` of their content, so that editing one is a new identity."""
    keyed, module_next = [], False
    for arg in extra:
        name = None
        if module_next:
            name, module_next = arg, False
        elif arg == "-p":
            module_next = True
        elif arg.startswith("-p") and len(arg) > 2:
            name = arg[2:].lstrip("=")
        content = module_files(name) if name and not name.startswith("no:") else []
        value = arg.split("=", 1)[-1]
        if not content and os.path.isfile(value):
            content = [Path(value)]
        if content:
            digest = hashlib.sha256(b"".join(f.read_bytes() for f in content)).hexdigest()[:16]
            arg += f"@sha256:{digest}"
        keyed.append(arg)
    return keyed


def version_of(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvcache-passes" / "bisect"


class ProbeCache:
    """ProbeResult results on disk: ``<dir>/<identity hash>/<item key>.json`` (and ``identity.json`` beside them)."""

    def __init__(self, root: Path | None, identity: dict[str, Any]):
        text = json.dumps(identity, sort_keys=True)
        self.identity_hash = hashlib.sha256(text.encode()).hexdigest()[:16]
        self.folder = None if root is None else Path(root) / self.identity_hash
        self.identity = identity

    def get(self, item: Revision) -> ProbeResult | None:
        """The probe of ``item`` measured under this identity; None when there is none (a file that is not a probe
        :meth:`put` wrote, or one of another identity, is measured again)."""
        if self.folder is None:
            return None
        try:
            entry = ProbeEntry.load(self.folder / f"{item.key}.json")
        except (OSError, RecordError):
            return None
        if entry.identity != self.identity_hash:
            return None
        return ProbeResult(item, kv=entry.kv, reason=entry.reason, transformers=entry.transformers,
                           untrusted=list(entry.untrusted), cached=True, seconds=float(entry.seconds))

    def put(self, probe: ProbeResult) -> None:
        if self.folder is None or not probe.cacheable:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        identity = self.folder / "identity.json"
        if not identity.exists():
            jsonfile.write_json(identity, self.identity, sort_keys=True, newline=False, error=None)
        entry = ProbeEntry(identity=self.identity_hash, item=probe.item.name, kv=probe.kv, reason=probe.reason,
                           transformers=probe.transformers, untrusted=probe.untrusted,
                           seconds=round(probe.seconds, 1))
        jsonfile.write_json(self.folder / f"{probe.item.key}.json", entry.to_json(), indent=None, newline=False,
                            error=None)


# --- one probe: the counted suite against one commit's source or one release ------------------------------------


FAILED_COUNT = re.compile(r"^FAILED \S*test_traffic\.py::test_traffic\[(?P<cache>[^\]]+)\] - (?P<why>.*)$")
ERROR_LINE = re.compile(r"^(?:E\s+|INTERNALERROR>\s*)?(?P<what>[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b:.*)$")


def failed_counts(log: str) -> dict[str, str]:
    """``{class: message}`` of the counted tests that failed, from the short summary of a pytest log
    (``FAILED ...test_traffic.py::test_traffic[static] - RuntimeError: ...``)."""
    return {m["cache"]: m["why"].strip() for m in map(FAILED_COUNT.match, log.splitlines()) if m}


def failure_reason(log: str, returncode: int) -> str:
    """One line saying why a counted run left no figure: the last exception pytest showed (``E   ImportError: ...``),
    else its last ``ERROR``/``FAILED`` line, else its last line."""
    lines = [line.rstrip() for line in log.splitlines() if line.strip()]
    found = [m["what"] for m in map(ERROR_LINE.match, lines) if m]
    if found:
        return found[-1].strip()[:300]
    marked = [line for line in lines if line.startswith(("ERROR", "FAILED", "INTERNALERROR"))]
    what = (marked or lines or ["(no output)"])[-1].strip()
    return f"pytest exited {returncode}: {what[:280]}"


def gives_device(extra: list[str]) -> bool:
    return any(a == "--kv-device" or a.startswith("--kv-device=") for a in extra)


@dataclass
class Suite:
    """How a probe runs the counted suite: its options (the identity) and where the probes work."""

    model: str
    caches: str
    attention: str | None
    driver: str | None
    batch: int | None
    extra: list[str]
    workdir: Path
    timeout: float = PROBE_TIMEOUT
    preload: tuple[str, ...] | None = None  # what a fork server imports once (None: every probe a new process)
    server: ForkServer | None = field(default=None, repr=False)
    say: Callable[[str], None] | None = field(default=None, repr=False)

    def options(self) -> list[str]:
        """The suite options of every probe: ``--kv-device cpu`` unless the pytest arguments give a device."""
        opts = ["--kv-model", self.model, "--kv-caches", self.caches]
        if self.attention:
            opts += ["--kv-attn", self.attention]
        if self.driver:
            opts += ["--kv-driver", self.driver]
        if self.batch is not None:
            opts += ["--kv-batch", str(self.batch)]
        if not gives_device(self.extra):
            opts += ["--kv-device", DEFAULT_DEVICE]
        return opts + list(self.extra)

    def identity(self) -> dict[str, Any]:
        from kvcache.analysing.records.identity import model_key  # standard library only

        opts = self.options()
        opts = [*opts[:1], model_key(self.model), *opts[2:len(opts) - len(self.extra)], *extra_identity(self.extra)]
        return {"suite": suite_hash(), "options": opts, "torch": version_of("torch"),
                "python": platform.python_version(), "machine": platform.machine(),
                "packages": {name: version_of(name) for name in IDENTITY_PACKAGES}, "format": PROBE_CACHE_FORMAT}

    def run(self, item: Revision, first_on_path: Path, number: int) -> ProbeResult:
        """Run the counted suite with ``first_on_path`` first on ``PYTHONPATH``; the probe (never raises for a run
        that fails: its reason says why)."""
        folder = self.workdir / f"probe-{number}"
        folder.mkdir(parents=True, exist_ok=True)
        out, gates, log_path = folder / "run.json", folder / "gates.json", folder / "log.txt"
        cmd = [sys.executable, "-m", "pytest", *suite_location(), "-m", "counted", *self.options(),
               "--kv-no-gate", "--kv-baseline", "none", "--benchmark-json", str(out),
               "-p", "no:cacheprovider", "-p", "kvcache.plugin", "-p", "kvcache.bisect.gates_plugin",
               "--kvbisect-gates", str(gates), "-q"]
        env = probe_env(first_on_path)
        start = time.monotonic()
        probe = ProbeResult(item)
        with open(log_path, "w+", encoding="utf-8") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            returncode = self.run_forked(cmd[3:], folder, env, first_on_path, log_path)
            if returncode is False:  # no fork server: a new interpreter
                try:
                    done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=folder, env=env,
                                          timeout=self.timeout)
                    returncode = done.returncode
                except subprocess.TimeoutExpired:
                    returncode = None
            log.seek(0)
            text = log.read()
        probe.seconds = time.monotonic() - start
        try:
            probe.kv = load_run(out).record
        except RecordError:
            probe.kv = None
        try:
            found = json.loads(gates.read_text(encoding="utf-8"))
            probe.transformers, probe.untrusted = found["transformers"], list(found["ambiguous"])
        except (OSError, ValueError, KeyError, TypeError):  # no gates file: the run stopped early
            pass
        if probe.kv is not None:
            probe.transformers = probe.kv.environment.transformers or probe.transformers
            # a class whose count failed: its message (the run's record of it, else pytest's log) stands in for a figure
            session = probe.kv.session
            failed = session.reasons if session is not None and session.reasons else failed_counts(text)
            probe.kv.skipped += [Skip(cache=c, reason=f"failed: {why[:240]}") for c, why in failed.items()]
        if returncode is None:
            probe.kv, probe.cacheable = None, False
            probe.reason = f"the counted run took longer than {self.timeout:g} s (--probe-timeout)"
        elif returncode < 0:
            probe.kv, probe.cacheable = None, False
            probe.reason = f"the counted run was killed by signal {-returncode}"
        elif probe.kv is None:
            probe.reason = failure_reason(text, returncode)
        if probe.reason:  # the probe's temporary folders mean nothing once it is cached
            probe.reason = probe.reason.replace(str(first_on_path.parent) + os.sep, "").replace(str(folder), "")
        return probe

    def run_forked(self, args: list[str], cwd: Path, env: dict[str, str], first_on_path: Path,
                   log_path: Path) -> int | None | bool:
        """pytest's exit status of ``args`` run by the fork server (None: timed out, and killed by the server), or
        False when there is no server (it is started on first use; one that refuses to fork, fails to start or
        dies is not used again, and every probe is a new interpreter)."""
        if self.preload is None:
            return False
        if self.server is None:
            try:
                self.server = ForkServer(list(self.preload), self.workdir, probe_env(self.workdir))
            except ServerRefused as exc:
                self.preload = None
                if self.say:
                    self.say(f"  (no fork server: {exc}; every probe is a new interpreter)")
                return False
            except OSError:
                self.preload = None
                return False
        path = [str(first_on_path), *env["PYTHONPATH"].split(os.pathsep)[1:]]
        try:
            return self.server.run(args, cwd, env, path, log_path, self.timeout)
        except OSError:
            self.server.close()
            self.server, self.preload = None, None
            return False

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def probe_env(first_on_path: Path) -> dict[str, str]:
    """The environment of a probe: ``first_on_path`` first on ``PYTHONPATH``, then this kvcache's folder when it is
    not installed in site-packages; no ``PYTEST_ADDOPTS``."""
    env = installer.release_env(first_on_path)
    own = Path(__file__).resolve().parents[2]  # this kvcache, importable there even when not installed
    if own.name not in ("site-packages", "dist-packages"):
        env["PYTHONPATH"] += os.pathsep + str(own)
    env.pop("PYTEST_ADDOPTS", None)
    return env


#: What the fork server imports once: torch, pytest, the suite's plugins and what Transformers imports besides
#: itself. Transformers' own family (huggingface_hub, tokenizers, safetensors) only when every probe uses this
#: environment's (commits, not releases, which bring their own).
PRELOAD = ("torch", "torch._dynamo", "torch._inductor", "numpy", "sympy", "PIL.Image", "jinja2", "yaml", "regex",
           "filelock", "packaging.version", "tqdm.auto", "pytest", "pytest_benchmark.plugin", "kvcache.plugin",
           "kvcache.bisect.gates_plugin", "kvcache.analysing.settings")
PRELOAD_FAMILY = ("huggingface_hub", "safetensors.torch", "tokenizers")


def suite_location() -> list[str]:
    """pytest's arguments for the counted suite: the installed ``kvcache.benchmarks``, else this checkout's
    ``benchmarks`` folder."""
    spec = util.find_spec("kvcache.benchmarks")
    if spec is not None and spec.submodule_search_locations:
        return ["--pyargs", "kvcache.benchmarks"]
    return [str(Path(__file__).resolve().parents[2] / "benchmarks")]
