"""The suite's settings (the ``--kv-*`` options), validated: bad values raise SettingsError, one line naming the
value and the accepted ones.

Each option's text becomes its :class:`Settings` field through the option's parser (:data:`PARSERS`), and each field
set by an option defaults to the options table's default (:mod:`kvcache.analysing.options`) read by that parser, so
``Settings()`` is what ``pytest benchmarks`` runs with when no option is given. What needs the cache registry or the
model presets (the class names, ``--kv-attn``, the dtype's names) is checked by the plugin
(:func:`kvcache.plugin.options.settings_from`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from kvcache.analysing import decoding
from kvcache.analysing.options import BY_FLAG, CONFIDENCE, OPTIONS, RESAMPLES

ORDERS = ("interleaved", "ascending")
FILLS = ("synthetic", "prefill")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")  # kvcache.measuring.compiled.forward.MODES
DRIVERS = ("loop", "generate")  # --kv-driver: the suite's own decode loop, or model.generate()


class SettingsError(ValueError):
    """A bad ``--kv-*`` value; the message is one line."""


# --- parsers: (flag, value as given) -> the Settings value; a bad value is a one-line SettingsError ------------

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


Parser = Callable[[str, Any], Any]


def _text(option: str, text: Any) -> str:
    return str(text)


def _names(option: str, text: Any) -> tuple[str, ...]:
    """Comma-separated names as given (the plugin checks cache classes against the registry)."""
    return tuple(name.strip() for name in str(text).split(",") if name.strip())


def _given(option: str, given: Any) -> bool:
    return bool(given)


def _not_given(option: str, given: Any) -> bool:
    return not given


def _choice(choices: tuple[str, ...]) -> Parser:
    return lambda option, text: check_choice(option, str(text), choices)


def _whole(low: int) -> Parser:
    return lambda option, text: int(number(option, text, low=low, whole=True))


def _real(low: float, high: float | None = None) -> Parser:
    return lambda option, text: number(option, text, low=low, high=high)


def _mib_as_bytes(option: str, text: Any) -> int:
    return int(number(option, text, low=1, whole=True)) << 20


def _two_contexts(option: str, text: Any) -> tuple[int, ...]:
    counted = parse_ints(option, text)
    if len(counted) != 2:
        raise SettingsError(f"{option} {text!r}: give two different contexts")
    return tuple(sorted(counted))


def _threads(option: str, text: Any) -> int | None:
    return parse_threads(text)


def parse_max_passes(text: str) -> dict[str, float]:
    """Parse ``--kv-max-passes cache=number,...`` into cache -> maximum passes (positive)."""
    form = "expected cache=number,... (e.g. dynamic=4,static=1.5)"
    limits: dict[str, float] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        cache, sep, value = (part.strip() for part in item.partition("="))
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not cache or not math.isfinite(number):
            raise ValueError(f"--kv-max-passes: bad item {item!r}; {form}")
        if number <= 0:
            raise ValueError(f"--kv-max-passes: {item!r} is not positive; {form}")
        if cache in limits:
            raise ValueError(f"--kv-max-passes: {cache!r} given twice; {form}")
        limits[cache] = number
    return limits


def _max_passes(option: str, text: Any) -> dict[str, float]:
    """``cache=passes,...`` (:func:`parse_max_passes`)."""
    try:
        return parse_max_passes(str(text))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _decoding(option: str, text: Any) -> tuple[str, ...]:
    """``greedy,beam:4`` -> canonical strategy names (:mod:`kvcache.analysing.decoding`); an unknown form or a bad
    number is a one-line SettingsError. (A chunk larger than the contexts: :func:`check_decoding`.)"""
    try:
        return decoding.parse_decoding(str(text))
    except decoding.DecodingError as exc:
        raise SettingsError(str(exc)) from None


def check_decoding(strategies: tuple[str, ...], contexts: tuple[int, ...]) -> None:
    """A ``chunked-prefill:C`` whose chunk is larger than the smallest context measured (``contexts``, tokens): a
    one-line SettingsError."""
    try:
        for name in strategies:
            decoding.parse_strategy(name, contexts)
    except decoding.DecodingError as exc:
        raise SettingsError(str(exc)) from None


def _gpus(option: str, text: Any) -> tuple[str, ...]:
    """``t4,a100,t4@2.12`` -> GPU class names (:mod:`kvcache.analysing.sdpa.selection`, pure Python; ``@release``: under
    that torch release's rules); none (the default) imports nothing. An unknown name or release, or (for a name
    without ``@``) an installed torch release whose rules are not transcribed, is a one-line SettingsError."""
    if not str(text).strip():
        return ()
    import importlib.metadata

    from kvcache.analysing.sdpa import selection as sdpa_rules

    try:
        names = sdpa_rules.gpu_names(str(text))
        if any("@" not in name for name in names):
            sdpa_rules.check_release(importlib.metadata.version("torch"))
    except (sdpa_rules.RulesError, importlib.metadata.PackageNotFoundError) as exc:
        raise SettingsError(str(exc)) from None
    return tuple(names)


#: How each option that sets a :class:`Settings` field (``Option.setting``) reads its value, by flag.
PARSERS: dict[str, Parser] = {
    "--kv-model": _text,
    "--kv-device": _text,
    "--kv-dtype": _text,
    "--kv-caches": _names,
    "--kv-contexts": parse_ints,
    "--kv-counted-contexts": _two_contexts,
    "--kv-fill": _choice(FILLS),
    "--kv-warmup": _whole(0),
    "--kv-steps": _whole(3),
    "--kv-rounds": _whole(1),
    "--kv-order": _choice(ORDERS),
    "--kv-seed": _whole(0),
    "--kv-copy-mib": _mib_as_bytes,
    "--kv-threads": _threads,
    "--kv-compile": _choice(COMPILE_MODES),
    "--kv-driver": _choice(DRIVERS),
    "--kv-gpus": _gpus,
    "--kv-decoding": _decoding,
    "--kv-batch": _whole(1),
    "--kv-ragged": _given,
    "--kv-ledger-steps": _whole(0),
    "--kv-remeasure": _whole(0),
    "--kv-remeasure-seconds": _real(0),
    "--kv-baseline": _text,
    "--kv-update-baseline": _given,
    "--kv-no-gate": _not_given,
    "--kv-strict": _given,
    "--kv-tolerance": _real(0),
    "--kv-counted-tolerance": _real(0),
    "--kv-memory-tolerance": _real(0),
    "--kv-ops-tolerance": _real(0),
    "--kv-weight-passes-tolerance": _real(0),
    "--kv-ledger-tolerance": _real(0),
    "--kv-min-r2": _real(0, 1),
    "--kv-max-drift": _real(0),
    "--kv-max-passes": _max_passes,
}


def parse_options(given: dict[str, Any]) -> dict[str, Any]:
    """The :class:`Settings` fields the options set, from their values as given (flag -> text, or True/False for a
    flag), each read by its parser in the table's order; the first bad value raises a one-line SettingsError."""
    return {o.setting: PARSERS[o.flag](o.flag, given[o.flag]) for o in OPTIONS if o.setting}


def _default(flag: str) -> Any:
    """The table's default of ``flag``, read by its parser: the field's value when the option is not given."""
    option = BY_FLAG[flag]
    return PARSERS[flag](flag, False if option.is_flag else option.default)


@dataclass(frozen=True)
class Settings:
    """A session's settings; every field an option sets defaults to that option's default. Sizes in bytes, times in
    seconds, tolerances in passes (relative where the option says so)."""

    model: str = _default("--kv-model")
    device: str = _default("--kv-device")
    dtype: str = _default("--kv-dtype")
    caches: tuple[str, ...] = _default("--kv-caches")
    contexts: tuple[int, ...] = _default("--kv-contexts")  # tokens
    counted_contexts: tuple[int, int] = _default("--kv-counted-contexts")  # tokens, ascending
    fill: str = _default("--kv-fill")
    warmup: int = _default("--kv-warmup")  # decode steps
    steps: int = _default("--kv-steps")  # decode steps
    rounds: int = _default("--kv-rounds")
    order: str = _default("--kv-order")
    seed: int = _default("--kv-seed")
    copy_bytes: int = _default("--kv-copy-mib")  # bytes of the copy-bandwidth tensor (--kv-copy-mib MiB)
    copy_repeats: int = 20  # copies timed per copy-bandwidth measurement
    max_drift: float = _default("--kv-max-drift")  # fraction
    baseline: str = _default("--kv-baseline")
    update_baseline: bool = _default("--kv-update-baseline")
    tolerance: float = _default("--kv-tolerance")  # fraction of the baseline's timed passes
    counted_tolerance: float = _default("--kv-counted-tolerance")  # passes
    memory_tolerance: float = _default("--kv-memory-tolerance")  # passes: allocated, peak and held, each
    ops_tolerance: float = _default("--kv-ops-tolerance")  # ATen ops per step, per layer
    weight_passes_tolerance: float = _default("--kv-weight-passes-tolerance")  # passes
    ledger_tolerance: float = _default("--kv-ledger-tolerance")  # timed passes per op, besides tolerance
    max_passes: dict[str, float] = field(default_factory=lambda: _default("--kv-max-passes"))  # cache -> passes
    min_r2: float = _default("--kv-min-r2")
    confidence: float = CONFIDENCE  # of the bootstrap intervals
    resamples: int = RESAMPLES  # bootstrap resamples
    gate: bool = _default("--kv-no-gate")
    strict: bool = _default("--kv-strict")
    remeasure: int = _default("--kv-remeasure")  # points
    remeasure_seconds: float = _default("--kv-remeasure-seconds")
    ledger_steps: int = _default("--kv-ledger-steps")  # profiled decode steps per (class, context)
    threads: int | None = _default("--kv-threads")  # torch's CPU threads for the whole session; None: torch's default
    compile: str = _default("--kv-compile")
    driver: str = _default("--kv-driver")
    gpus: tuple[str, ...] = _default("--kv-gpus")  # GPU classes predicted (kvcache.analysing.sdpa.selection.GPUS)
    batch: int = _default("--kv-batch")  # sequences per decode step
    ragged: bool = _default("--kv-ragged")
    decoding: tuple[str, ...] = _default("--kv-decoding")  # strategies (kvcache.analysing.decoding), crossed in caches

    @property
    def profiles_ledger(self) -> bool:
        """Whether ledger points are profiled: not with ``--kv-ledger-steps 0``, nor under ``--kv-compile`` (the
        ledger times eager ATen ops, a compiled step runs fused kernels; the analysis says so per class)."""
        return self.ledger_steps > 0 and self.compile == "off"
