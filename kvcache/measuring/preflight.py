"""Checks made before anything is measured, so that what would fail only after the whole sweep (a path the
run cannot write) or part-way (a copy tensor larger than free memory) is a one-line SettingsError at
start-up. A model's config is checked where it is loaded (:func:`kvcache.measuring.models.load_config`)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from kvcache.settings import Settings, SettingsError


def check(config: Any, settings: Settings) -> None:
    """Every path the run will write, then the copy-bandwidth tensor against free memory."""
    check_outputs(config, settings)
    check_copy_memory(settings)


def check_outputs(config: Any, settings: Settings) -> None:
    """``--benchmark-json`` (its directory is created here when missing: nobody creates it later), the
    baseline with ``--kv-update-baseline``, and the file storage of ``--benchmark-save``/``-autosave``."""
    def opt(name: str) -> Any:
        return config.getoption(name, None)

    if opt("benchmark_json"):
        path = Path(opt("benchmark_json"))
        writable_file("--benchmark-json", path)
        if path.exists():
            try:  # written in place: the file itself must open for writing (append changes nothing)
                path.open("ab").close()
            except OSError as exc:
                raise SettingsError(f"--benchmark-json {path}: cannot be written ({exc.strerror})") from None
        path.parent.mkdir(parents=True, exist_ok=True)
    if settings.update_baseline:
        writable_file("--kv-baseline", Path(settings.baseline))  # replaced atomically: its directory matters
    if opt("benchmark_save") or opt("benchmark_autosave"):
        storage = str(opt("benchmark_storage") or "")
        storage = storage if "://" in storage else f"file://{storage}"
        if storage.startswith("file://"):
            writable_dir("--benchmark-storage", Path(storage[len("file://"):]))


def writable_file(option: str, path: Path) -> None:
    """``path`` is not a directory, and its directory exists or can be created, and takes new files."""
    if path.is_dir():
        raise SettingsError(f"{option} {path}: is a directory, expected a file")
    writable_dir(option, path.parent, shown=path)


def writable_dir(option: str, directory: Path, *, shown: Path | None = None) -> None:
    """``directory`` is one, or can be made one, where files can be created (tried with a nameless
    temporary file: nothing is left behind)."""
    shown = directory if shown is None else shown
    existing = directory
    while not _exists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise SettingsError(f"{option} {shown}: {existing} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise SettingsError(f"{option} {shown}: cannot write in {existing} ({exc.strerror or exc})") from None


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # e.g. no permission to look: the directory above is checked instead
        return False


def check_copy_memory(settings: Settings) -> None:
    """The copy-bandwidth tensor is allocated twice (source and destination): both must fit in free memory."""
    from kvcache.measuring import devices

    device = devices.resolve(settings.device)
    need, free = 2 * settings.copy_bytes, devices.free_bytes(device)
    if need > free:
        raise SettingsError(f"--kv-copy-mib {settings.copy_bytes >> 20}: the copy-bandwidth tensor needs "
                            f"{_gib(need)} (source and destination, {_gib(settings.copy_bytes)} each); "
                            f"{device.type} has {_gib(free)} free")


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
