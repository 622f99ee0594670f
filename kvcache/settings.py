"""The suite's settings (the ``--kv-*`` options), validated: bad values raise SettingsError, one line
naming the value and the accepted ones."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_CONTEXTS = (1024, 2048, 4096, 8192, 16384)
ORDERS = ("interleaved", "ascending")
FILLS = ("synthetic", "prefill")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")  # kvcache.measuring.compiled.MODES
DRIVERS = ("loop", "generate")  # --kv-driver: the suite's own decode loop, or model.generate()


class SettingsError(ValueError):
    """A bad ``--kv-*`` value; the message is one line."""


@dataclass(frozen=True)
class Settings:
    model: str = "smollm2-135m"
    device: str = "auto"
    dtype: str = "bfloat16"
    caches: tuple[str, ...] = ("dynamic", "static")
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    counted_contexts: tuple[int, int] = (256, 512)
    fill: str = "synthetic"
    warmup: int = 3
    steps: int = 12
    rounds: int = 3
    order: str = "interleaved"
    seed: int = 0
    copy_bytes: int = 1 << 30
    copy_repeats: int = 20
    max_drift: float = 0.10
    baseline: str = "kv-baseline.json"
    update_baseline: bool = False
    tolerance: float = 0.10
    counted_tolerance: float = 0.05
    memory_tolerance: float = 0.05  # counted memory: allocated, peak and held passes may each rise by this much
    ops_tolerance: float = 0.5
    weight_passes_tolerance: float = 0.05
    ledger_tolerance: float = 0.5
    max_passes: dict[str, float] = field(default_factory=dict)
    min_r2: float = 0.90
    confidence: float = 0.95
    resamples: int = 2000
    gate: bool = True
    strict: bool = False
    remeasure: int = 0
    remeasure_seconds: float = 120.0
    ledger_steps: int = 8
    threads: int | None = 1  # torch's CPU threads for the whole session; None: torch's default (auto)
    compile: str = "off"
    driver: str = "loop"
    batch: int = 1
    ragged: bool = False

    @property
    def profiles_ledger(self) -> bool:
        """Whether ledger points are profiled: not with ``--kv-ledger-steps 0``, nor under ``--kv-compile`` (the
        ledger times eager ATen ops, a compiled step runs fused kernels; the analysis says so per class)."""
        return self.ledger_steps > 0 and self.compile == "off"

    def to_dict(self) -> dict[str, Any]:
        """The settings as a run records them (``kv.settings``). ``model`` is the model's identity
        (:func:`kvcache.measuring.models.model_key`: a local directory as ``name@confighash``), and a directory's
        path as given is kept beside it as ``model_path``."""
        from kvcache.measuring.models import model_key  # stdlib only at import: no torch

        d = asdict(self)
        d["caches"], d["contexts"], d["counted_contexts"] = list(self.caches), list(self.contexts), list(
            self.counted_contexts)
        d["model"] = model_key(self.model)
        if d["model"] != self.model:
            d["model_path"] = self.model
        return d


def parse_ints(option: str, text: str, *, minimum: int = 1) -> tuple[int, ...]:
    """``"512,1024"`` -> ``(512, 1024)``; an empty item, a repeated value (``1k`` and ``1024`` are one value) or
    anything else that is not a whole number is a one-line SettingsError."""
    expected = "expected e.g. 512,1024,4k, each value once"
    if not str(text).strip():
        raise SettingsError(f"{option} {text!r} names no value ({expected})")
    values: dict[int, str] = {}
    for part in str(text).split(","):
        part = part.strip().lower().replace("_", "")
        if not part:
            raise SettingsError(f"{option} {text!r}: empty item ({expected})")
        scale = 1024 if part.endswith("k") else 1
        try:
            value = int(part[:-1] if scale > 1 else part) * scale
        except ValueError:
            raise SettingsError(f"{option} {text!r}: {part!r} is not a whole number ({expected})") from None
        if value < minimum:
            raise SettingsError(f"{option} {text!r}: {value} is below the minimum {minimum}")
        if value in values:
            spelled = f" ({values[value]!r} and {part!r})" if values[value] != part else ""
            raise SettingsError(f"{option} {text!r}: {value} is given twice{spelled} ({expected})")
        values[value] = part
    return tuple(values)


def parse_threads(text: object) -> int | None:
    """``--kv-threads``: ``auto`` (torch's default, None) or a whole number of threads, at least 1."""
    if str(text).strip().lower() == "auto":
        return None
    try:
        value = int(str(text))
    except ValueError:
        raise SettingsError(f"--kv-threads {text!r} is not auto nor a whole number of threads (at least 1)") from None
    if value < 1:
        raise SettingsError(f"--kv-threads {value} is out of range (accepted: auto, or a whole number at least 1)")
    return value


def check_choice(option: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise SettingsError(f"{option} {value!r} is not one of {', '.join(choices)}")
    return value


def number(option: str, text: object, *, low: float, high: float | None = None, whole: bool = False) -> float:
    """A number option given as text (pytest's own int/float conversion prints a multi-line usage error)."""
    try:
        value = int(str(text)) if whole else float(str(text))
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise SettingsError(f"{option} {text!r} is not {kind}") from None
    return check_number(option, value, low=low, high=high)


def check_number(option: str, value: float, *, low: float, high: float | None = None) -> float:
    # NaN fails every comparison: without the isfinite test it would pass any range check (argparse's
    # float() accepts "nan" and "inf") and silently make the gate inconclusive, always failing or never.
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"a finite number, at least {low}"
        raise SettingsError(f"{option} {value} is out of range (accepted: {bound})")
    return value
