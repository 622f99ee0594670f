"""Checks made before anything is measured, so that what would fail only after the whole sweep (a path the
run cannot write) or part-way (a copy tensor, or a model's weights, larger than free memory) is a one-line
SettingsError at start-up. A model's config is checked where it is loaded
(:func:`kvcache.measuring.configs.load_config`)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcache.analysing import files
from kvcache.analysing.settings import Settings, SettingsError


def check(config: Any, settings: Settings) -> None:
    """Every path the run will write, then the copy-bandwidth tensor against free memory, then the model's
    weights and its smallest point's cache (:func:`check_model_memory`)."""
    check_outputs(config, settings)
    check_copy_memory(settings)
    check_model_memory(settings)


def check_outputs(config: Any, settings: Settings) -> None:
    """The folder of ``--benchmark-json`` (created here when missing) and the file storage of
    ``--benchmark-save``/``-autosave``. The files a run writes (``--benchmark-json``, the baseline) are probed
    before this by the plugin (:func:`kvcache.analysing.files.write_problem`)."""
    def opt(name: str) -> Any:
        return config.getoption(name, None)

    if opt("benchmark_json"):
        folder = files.target(opt("benchmark_json")).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SettingsError(f"--benchmark-json {opt('benchmark_json')}: cannot create {folder} "
                                f"({exc.strerror or exc})") from None
    if opt("benchmark_save") or opt("benchmark_autosave"):
        storage = str(opt("benchmark_storage") or "")
        storage = storage if "://" in storage else f"file://{storage}"
        if storage.startswith("file://"):
            writable_dir("--benchmark-storage", Path(storage[len("file://"):]))


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

    device = devices.resolve_device(settings.device)
    need, free = 2 * settings.copy_bytes, devices.free_bytes(device)
    if need > free:
        raise SettingsError(f"--kv-copy-mib {settings.copy_bytes >> 20}: the copy-bandwidth tensor needs "
                            f"{_gib(need)} (source and destination, {_gib(settings.copy_bytes)} each); "
                            f"{device.type} has {_gib(free)} free")


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


#: The share of free memory a check lets the run use (as :func:`kvcache.measuring.decode.check_memory` does).
USABLE_FREE = 0.9
FLOAT32_BYTES = 4


@dataclass(frozen=True)
class ModelMemory:
    """What a run's model needs, in bytes, from its config and dtype alone (nothing built): ``parameters`` and
    ``dtype_bytes`` (the weights the run holds), ``build_bytes`` per parameter while the model is built (4: a preset
    with random weights is built in float32, then cast), and ``smallest``: the KV cache (× the class's
    ``memory_factor`` × the batch's sequences) of the smallest point the run may open, with a label naming it."""

    model: str
    dtype: str
    parameters: int
    dtype_bytes: int
    build_bytes: int
    smallest: tuple[float, str]

    @property
    def weight_bytes(self) -> int:
        return self.parameters * self.dtype_bytes

    @property
    def built_bytes(self) -> int:
        """Bytes of the weights at the peak of building them (the float32 copy of a preset built then cast)."""
        return self.parameters * max(self.build_bytes, self.dtype_bytes)


def check_model_memory(settings: Settings, *, free: dict[str, int] | None = None) -> None:
    """The model's weights (from its config and dtype: :func:`kvcache.measuring.geometry.count_parameters`, nothing
    built) plus the KV cache of the smallest point the run opens, against free memory (90%), before anything is
    built: over it, nothing could run, and a one-line SettingsError names the numbers. A point that does not fit
    beside the weights is skipped with its numbers when it opens (:func:`kvcache.measuring.decode.check_memory`).
    On a GPU the weights are first built in host memory: that is checked against the host's free memory too.
    ``free``: {device type: free bytes}, for tests; else asked of the device and the host."""
    import torch

    from kvcache.measuring import devices

    device = devices.resolve_device(settings.device)
    need = model_memory(settings)
    free = dict(free or {})
    for where in (device, torch.device("cpu")):
        if where.type not in free:
            free[where.type] = devices.free_bytes(where)
    problem = memory_problem(need, device.type, free)
    if problem:
        raise SettingsError(problem)


def model_memory(settings: Settings) -> ModelMemory:
    """:class:`ModelMemory` of the run ``settings`` describe: its model's config (a one-line ModelError when it
    cannot be used) and its points (timed: each of ``contexts`` with warm-up and timed steps; counted: each of
    ``counted_contexts`` with a counted step), for each cache class of the run."""
    from kvcache.analysing.presets import FAMILY_PRESETS, split_layers
    from kvcache.measuring import caches, decode
    from kvcache.measuring.configs import load_config
    from kvcache.measuring.counting.class_count import COUNT_WARMUP
    from kvcache.measuring.geometry import spec_from_config

    config, weights = load_config(settings.model)
    spec = spec_from_config(settings.model, config, settings.dtype)
    built_in_dtype = weights is not None or split_layers(settings.model)[0] in FAMILY_PRESETS
    tokens = {decode.tokens_needed(c, settings.warmup, settings.steps) for c in settings.contexts}
    tokens |= {decode.tokens_needed(c, min(settings.warmup, COUNT_WARMUP), 1) for c in settings.counted_contexts}
    points = []
    for name in settings.caches:
        factor = caches.get(name).memory_factor
        for n in tokens:
            label = f"{name} at {n} tokens" + (f" x {settings.batch} sequences" if settings.batch > 1 else "")
            points.append((spec.kv_bytes(n) * settings.batch * factor, label))
    points = points or [(0.0, "no point")]
    return ModelMemory(settings.model, settings.dtype, spec.parameters, spec.dtype_bytes,
                       spec.dtype_bytes if built_in_dtype else FLOAT32_BYTES, min(points))


def memory_problem(need: ModelMemory, device_type: str, free: dict[str, int]) -> str | None:
    """Why the model cannot run on ``device_type`` with ``free`` bytes ({device type: free bytes}), or None. On the
    CPU: the weights while built, and the weights beside the smallest point's cache. On another device: the same on
    it, and the weights while built (in host memory) against the CPU's free memory."""
    cache, label = need.smallest
    while_built = "" if need.build_bytes <= need.dtype_bytes else (
        f", {_gib(need.parameters * need.build_bytes)} while built in float32 and cast")
    weights = (f"its weights need {_gib(need.weight_bytes)} ({need.parameters:,} parameters x {need.dtype_bytes} B, "
               f"{need.dtype}{while_built})")
    running = need.weight_bytes + cache
    checks = [(device_type, max(running, need.built_bytes if device_type == "cpu" else 0))]
    if device_type != "cpu":
        checks.append(("cpu", need.built_bytes))
    for where, bytes_ in checks:
        if bytes_ > USABLE_FREE * free[where]:
            point = f" and its smallest point's cache {_gib(cache)} ({label})" if cache and where == device_type else ""
            host = " (built in host memory first)" if where != device_type else ""
            return (f"--kv-model {need.model!r}: {weights}{point}{host}; {where} has {_gib(free[where])} free "
                    f"({USABLE_FREE:.0%} of it usable)")
    return None
