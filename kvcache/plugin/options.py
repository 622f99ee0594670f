"""The ``--kv-*`` pytest options, declared from the options table (:data:`kvcache.analysing.options.OPTIONS`), and
the session's :class:`~kvcache.analysing.settings.Settings` read from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcache.analysing import decoding
from kvcache.analysing.options import OPTIONS
from kvcache.analysing.settings import Settings, SettingsError, check_choice, check_decoding, parse_options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcache-passes", "KV-cache passes per decode step")
    for option in OPTIONS:
        if option.is_flag:
            group.addoption(option.flag, action="store_true", help=option.help)
        else:
            group.addoption(option.flag, default=option.default, help=option.help)


def given_options(config: pytest.Config) -> list[str]:
    """The ``--kv-*`` options set to something other than their default (command line, addopts or
    PYTEST_ADDOPTS)."""
    return [o.flag for o in OPTIONS
            if (config.getoption(o.dest) if o.is_flag else str(config.getoption(o.dest)) != str(o.default))]


def settings_from(config: pytest.Config) -> Settings:
    """Validated settings; any bad value is a one-line SettingsError. Each option is read by its parser
    (:data:`kvcache.analysing.settings.PARSERS`); then the cache classes are checked against the registry and crossed
    with ``--kv-attn`` and ``--kv-decoding`` (``<cache>@<attention>#<strategy>`` keys), the bounds of
    ``--kv-max-passes`` against the classes, the dtype against the model presets' names, and the options that
    cannot go together. Imports no torch: the registry and the model presets are plain Python until something is
    built."""
    from kvcache.analysing import presets
    from kvcache.analysing.drafts import DraftError, check_drafts
    from kvcache.analysing.judge.baseline import NO_BASELINE
    from kvcache.measuring import caches

    given = {o.flag: config.getoption(o.dest) for o in OPTIONS}
    values = parse_options(given)
    try:
        caches_ = tuple(caches.parse_caches(given["--kv-caches"]))
    except caches.CacheError as exc:
        raise SettingsError(str(exc)) from None
    values["caches"] = _crossed_with_attention(caches_, str(given["--kv-attn"]))
    check_decoding(values["decoding"], (*values["counted_contexts"], *values["contexts"]))
    values["caches"] = tuple(decoding.cross_strategies(values["caches"], values["decoding"]))
    try:  # assisted:MODEL:K: a draft the suite loads, with the model's vocabulary
        check_drafts(str(values["model"]), [decoding.split_strategy(key)[1] for key in values["caches"]])
    except DraftError as exc:
        raise SettingsError(str(exc)) from None
    for name in values["max_passes"]:
        if name not in caches.registry() and name not in values["caches"]:
            raise SettingsError(f"--kv-max-passes: unknown cache class {name!r}; known: "
                                f"{', '.join(caches.registry())}")
    check_choice("--kv-dtype", values["dtype"], presets.DTYPES)  # the same words as geometry.torch_dtype, no torch
    if values["baseline"] != NO_BASELINE:
        values["baseline"] = str(Path(config.rootpath, values["baseline"]))
    settings = Settings(**values)
    if settings.ragged and settings.batch == 1:
        raise SettingsError("--kv-ragged needs --kv-batch of at least 2 (one sequence has nothing to pad)")
    if settings.driver == "generate" and settings.compile != "off":
        raise SettingsError(f"--kv-driver generate with --kv-compile {settings.compile}: not supported (accepted: "
                            "--kv-compile off with the generate driver, or --kv-driver loop)")
    if settings.compile != "off" and settings.decoding != ("greedy",):
        raise SettingsError(f"--kv-decoding {','.join(settings.decoding)} with --kv-compile {settings.compile}: not "
                            "supported (accepted: --kv-decoding greedy with --kv-compile, or --kv-compile off: a "
                            "strategy's reorder or crop runs outside the compiled forward the fused count covers)")
    return settings


def _crossed_with_attention(caches_: tuple[str, ...], text: str) -> tuple[str, ...]:
    """``--kv-attn``: the classes crossed with the implementations (:mod:`kvcache.measuring.attention`). The default
    (``sdpa`` alone) keeps the classes as they are and imports nothing; any other value imports Transformers to check
    each name against the release (one-line SettingsError)."""
    if text.strip() == "sdpa":
        return caches_
    from kvcache.measuring import attention

    try:
        return tuple(attention.cross(caches_, attention.parse_attentions(text)))
    except attention.AttentionError as exc:
        raise SettingsError(str(exc)) from None
