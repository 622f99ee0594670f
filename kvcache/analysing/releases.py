"""Transformers releases side by side: the one installer behind ``make versions``, ``kvcache bisect --releases`` and
A/B runs of two releases. Each release goes into ``<root>/<release>`` with its own :data:`FAMILY`, torch never
(:data:`NEVER`), marked finished only when whole; :func:`release_env` puts it first on ``PYTHONPATH``
(docs/releases.md). Standard library only: it runs pip, it imports neither torch nor transformers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import IO, Callable

# Released alongside transformers and pinned by it: these must come from each release's own resolution.
FAMILY = {"transformers", "huggingface-hub", "tokenizers", "safetensors", "hf-xet"}
NEVER = {"torch"}  # must come from the environment; transformers does not depend on it
BINARY_ONLY = "tokenizers,safetensors,hf-xet,numpy"  # no Rust/C builds from source
FINAL = re.compile(r"^\d+(\.\d+)+$")
INSTALLED_MARKER = ".kvcache-installed"


class ReleaseError(ValueError):
    """A release number that is not one, or one that is not published; the message is one line."""


def version_key(version: str) -> tuple[int, ...]:
    """Numeric sort key of a final release such as ``4.45.2``; ValueError for anything else."""
    if not FINAL.match(version):
        raise ValueError(f"not a final release number: {version!r}")
    return tuple(int(part) for part in version.split("."))


def newest_per_minor(versions: list[str], since: str) -> list[str]:
    """The newest patch of every ``major.minor`` at or after ``since``'s, oldest first (what ``make versions`` and
    ``kvcache sentinel --releases`` run)."""
    floor = version_key(since)[:2]
    newest: dict[tuple[int, ...], str] = {}
    for version in versions:
        key = version_key(version)
        minor = key[:2]
        if minor >= floor and (minor not in newest or key > version_key(newest[minor])):
            newest[minor] = version
    return [newest[minor] for minor in sorted(newest)]


def normalise(text: str) -> tuple[str, str | None]:
    """``(release, note)``: a release number as pip publishes it, one name per release (PEP 440 equality: ``5.23``,
    ``5.23.0.0`` and ``05.023.0`` are one release). ``4.45`` is read as ``4.45.0``, ``v5.23.0`` (a git tag) as
    ``5.23.0``, each part without leading zeros (``05.023.0``: ``5.23.0``) and without zero parts after the third
    (``5.23.0.0``: ``5.23.0``), with a note saying so (None when taken as given); anything else that is not a final
    release number is a :class:`ReleaseError`. (``pip install transformers==4.45`` installs 4.45.0, which then
    reports ``4.45.0``: a run asked for ``4.45`` would not recognise its own release, and a history stored
    ``5.23.0.0`` beside ``5.23.0`` as two releases: a step that is none.)"""
    given = text.strip()
    release = given[1:] if given[:1] in ("v", "V") else given
    if not FINAL.match(release):
        raise ReleaseError(f"not a final release number: {text!r} (e.g. 4.45.2)")
    parts = [int(part) for part in release.split(".")]
    while len(parts) > 3 and parts[-1] == 0:
        parts.pop()
    release = ".".join(map(str, parts + [0] * (3 - len(parts))))
    return release, (None if release == given else f"{given} is read as {release}")


def normalised(text: str, option: str, say: Callable[[str], None]) -> str:
    """``text`` as pip publishes it (:func:`normalise`), saying how it was read when given short (``OPTION: 4.45 is
    read as 4.45.0``); ReleaseError otherwise."""
    release, note = normalise(text)
    if note:
        say(f"{option}: {note}")
    return release


def parse_pip_index(text: str) -> list[str]:
    """Final releases listed by ``pip index versions PACKAGE`` (its ``Available versions:`` line), as listed."""
    for line in text.splitlines():
        if line.strip().startswith("Available versions:"):
            listed = line.split(":", 1)[1].split(",")
            return [v.strip() for v in listed if FINAL.match(v.strip())]
    raise ValueError("no 'Available versions:' line in pip index output")


def published(package: str = "transformers", timeout: float = 120) -> list[str]:
    """Every final release of ``package`` on the package index, oldest first (``pip index versions``: needs the
    network); :class:`ReleaseError` naming pip's complaint when it cannot be listed."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ReleaseError(f"cannot list the releases of {package}: {exc}") from None
    try:
        return sorted(set(parse_pip_index(done.stdout)), key=version_key)
    except ValueError:
        raise ReleaseError(f"cannot list the releases of {package} (pip index versions: "
                           f"{last_error(done.stderr or done.stdout)})") from None


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
    """Pin everything outside the transformers family (and this project) to the environment's version."""
    own = _norm("kvcache-passes")
    lines = [f"{name}=={version}" for name, version in sorted(installed.items()) if name not in FAMILY | {own}]
    path.write_text("\n".join(lines) + "\n")
    return path


def prune(target: Path, installed: dict[str, str]) -> list[str]:
    """Remove from ``target`` copies identical to the environment's and anything in NEVER; the names removed."""
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


def last_error(text: str) -> str:
    """The last ``ERROR:`` line of pip's output (else its last line), at most 300 characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["(no output)"])[-1][:300]


def installed_at(release: str, root: Path) -> Path | None:
    """``root/<release>`` when a finished install of ``release`` is there, else None."""
    target = Path(root) / release
    return target if (target / INSTALLED_MARKER).exists() else None


def install(release: str, root: Path, constraints: Path, installed: dict[str, str], log: IO[str]) -> str | None:
    """Install ``release`` into ``root/<release>`` unless already there; None on success, else the reason (one line).
    pip's command and output go to ``log``."""
    root = Path(root)
    target = root / release
    if installed_at(release, root):
        log.write(f"# {target} already installed\n")
        return None
    shutil.rmtree(target, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{release}-", dir=root))
    cmd = [sys.executable, "-m", "pip", "install", "--target", str(staging), "--no-input",
           "--disable-pip-version-check", "--only-binary", BINARY_ONLY, "-c", str(constraints),
           f"transformers=={release}"]
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.write(done.stdout + done.stderr)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        return f"pip install failed: {last_error(done.stderr or done.stdout)}"
    removed = prune(staging, installed)
    log.write(f"# removed (same as the environment, or never wanted here): {', '.join(removed) or 'nothing'}\n")
    staging.rename(target)
    (target / INSTALLED_MARKER).write_text(f"transformers=={release}\n")
    return None


#: Packages of this environment hidden from a release that brings its own huggingface_hub but not them: each was
#: made for a newer huggingface_hub than an older release brings (transformers 5.25 requires ``kernels``; an older
#: release's hub-kernels integration imports it when it is there, and fails at import). A checkout brings no
#: huggingface_hub of its own and sees them.
HIDDEN_UNLESS_INSTALLED = ("kernels",)
_HIDING = """\"\"\"Written by kvcache.analysing.releases: hides this environment's {names} from a transformers
release installed without them (they need a newer huggingface_hub than the release's).\"\"\"
import sys

for name in {names!r}:
    sys.modules.setdefault(name, None)  # import fails, importlib.util.find_spec says None: not available
"""


def _hiding(names: tuple[str, ...]) -> Path:
    """A folder holding only a ``sitecustomize`` that hides ``names`` (in the temporary folder, never in a release or
    a checkout; written whole, then renamed, so that runs at once never read half of it)."""
    shim = Path(tempfile.gettempdir()) / "kvcache-hide" / "-".join(names)
    text = _HIDING.format(names=names)
    path = shim / "sitecustomize.py"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        shim.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=shim, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(name, path)
    return shim


def release_env(target: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a run on the release installed in ``target``: it goes first on ``PYTHONPATH``, after a
    ``sitecustomize`` that hides the packages of :data:`HIDDEN_UNLESS_INSTALLED` where that applies."""
    env = dict(os.environ if env is None else env)
    env["COLUMNS"] = "300"  # pytest's short summary keeps more of a failure's message
    first = [str(target)]
    own_hub = (Path(target) / "huggingface_hub").is_dir()
    hidden = tuple(name for name in HIDDEN_UNLESS_INSTALLED if own_hub and not (Path(target) / name).exists())
    if hidden:
        first.insert(0, str(_hiding(hidden)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*first, env.get("PYTHONPATH", "")) if p)
    return env


def imported_release(target: Path, cwd: Path | None = None) -> tuple[str | None, str]:
    """``(version, output)``: the transformers version a Python started on ``target`` imports, or None with the
    output that says why (the import failed)."""
    probe = [sys.executable, "-c", "import transformers; print(transformers.__version__)"]
    done = subprocess.run(probe, capture_output=True, text=True, cwd=cwd, env=release_env(target))
    output = f"$ {' '.join(probe)}\n{done.stdout}{done.stderr}"
    return (done.stdout.strip() or None) if done.returncode == 0 else None, output


def ensure(release: str, root: Path, log: IO[str], cwd: Path | None = None, constraints: Path | None = None,
           installed: dict[str, str] | None = None) -> Path:
    """``root/<release>``, installed now unless it already is, and checked to import as ``release`` (a Python started
    in ``cwd``); :class:`ReleaseError` with the reason otherwise. Constraints: ``constraints`` with the packages
    ``installed`` when given (one file for many releases), else this interpreter's packages (written to a temporary
    file of its own in ``root``, removed after)."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if not installed_at(release, root):
        if constraints is not None:
            reason = install(release, root, constraints, installed if installed is not None else venv_versions(), log)
        else:
            installed = venv_versions()
            fd, name = tempfile.mkstemp(prefix=".constraints-", suffix=".txt", dir=root)
            os.close(fd)
            written = write_constraints(Path(name), installed)
            try:
                reason = install(release, root, written, installed, log)
            finally:
                written.unlink(missing_ok=True)
        if reason:
            raise ReleaseError(reason)
    target = root / release
    version, output = imported_release(target, cwd)
    log.write(output)
    if version is None:
        raise ReleaseError(f"import failed: {last_error(output)}")
    if version != release:
        raise ReleaseError(f"imported transformers {version} instead of {release}")
    return target
