"""The options table (kvcache/analysing/options.py) is the one home of every ``--kv-*`` default: the pytest options
the plugin registers, the defaults of Settings and of the judge's Rules, and docs/options.md all come from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.options import BY_FLAG, OPTIONS, RULE_DEFAULTS, options_page
from kvcache.analysing.settings import PARSERS, Settings, SettingsError, parse_options
from kvcache.plugin import options as plugin_options

ROOT = Path(__file__).resolve().parents[2]
BY_DEST = {o.dest: o for o in OPTIONS}


class Config:
    """Stands in for pytest's config: each option as given (by dest), else its default as pytest stores it."""

    def __init__(self, **given: Any) -> None:
        self.given = given
        self.rootpath = ROOT

    def getoption(self, dest: str) -> Any:
        option = BY_DEST[dest]
        return self.given[dest] if dest in self.given else (False if option.is_flag else option.default)


class Registered:
    """Stands in for pytest's parser and its option group: records what ``pytest_addoption`` adds."""

    def __init__(self) -> None:
        self.options: dict[str, dict[str, Any]] = {}

    def getgroup(self, *args: Any, **kwargs: Any) -> Registered:
        return self

    def addoption(self, *names: str, **kwargs: Any) -> None:
        for name in names:
            self.options[name] = kwargs


def defaults() -> dict[str, Any]:
    return {o.flag: False if o.is_flag else o.default for o in OPTIONS}


def test_settings_defaults_are_the_parsed_option_defaults():
    fields = parse_options(defaults())
    assert fields, "no option sets a field"
    assert {name: getattr(Settings(), name) for name in fields} == fields
    assert Settings().copy_bytes == 1024 << 20 and Settings().threads == 1 and Settings().gate is True
    assert Settings().contexts == (1024, 2048, 4096, 8192, 16384) and Settings().caches == ("dynamic", "static")


def test_the_plugin_reads_the_defaults_as_settings_holds_them():
    assert plugin_options.settings_from(Config()) == Settings(baseline=str(ROOT / "kv-baseline.json"))
    assert plugin_options.given_options(Config()) == []
    assert plugin_options.given_options(Config(kv_steps="5", kv_strict=True)) == ["--kv-steps", "--kv-strict"]


def test_every_setting_has_its_parser_and_field():
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert {o.flag for o in OPTIONS if o.setting} == set(PARSERS)
    assert {o.setting for o in OPTIONS if o.setting} <= fields
    assert len({o.setting for o in OPTIONS if o.setting}) == len([o for o in OPTIONS if o.setting])


def test_rules_defaults_are_the_table_and_the_settings():
    rules, settings = Rules(), Settings()
    assert RULE_DEFAULTS and set(RULE_DEFAULTS) <= set(Rules.SETTINGS)
    for name, default in RULE_DEFAULTS.items():
        assert getattr(rules, name) == default == getattr(settings, name), name
    for name in Rules.SETTINGS:
        assert getattr(rules, name) == getattr(settings, name), name


def test_the_plugin_registers_exactly_the_table():
    registered = Registered()
    plugin_options.pytest_addoption(registered)
    assert set(registered.options) == set(BY_FLAG)
    for flag, kwargs in registered.options.items():
        option = BY_FLAG[flag]
        assert kwargs["help"] == option.help
        if option.is_flag:
            assert kwargs["action"] == "store_true", flag
        else:
            assert kwargs["default"] == option.default, flag


def test_docs_options_page_is_generated_from_the_table():
    """Regenerate with ``python -m kvcache.analysing.options > docs/options.md``."""
    assert (ROOT / "docs" / "options.md").read_text(encoding="utf-8") == options_page()


@pytest.mark.parametrize(("flag", "text", "message"), [
    ("--kv-steps", "2", "--kv-steps 2 is out of range (accepted: a finite number, at least 3)"),
    ("--kv-copy-mib", "1.5", "--kv-copy-mib '1.5' is not a whole number"),
    ("--kv-min-r2", "nan", "--kv-min-r2 nan is out of range (accepted: from 0 to 1)"),
    ("--kv-fill", "magic", "--kv-fill 'magic' is not one of synthetic, prefill"),
    ("--kv-counted-contexts", "256", "--kv-counted-contexts '256': give two different contexts"),
    ("--kv-threads", "0", "--kv-threads 0 is out of range (accepted: auto, or a whole number at least 1)"),
    ("--kv-max-passes", "dynamic=0", "--kv-max-passes: 'dynamic=0' is not positive; expected cache=number,... "
                                     "(e.g. dynamic=4,static=1.5)"),
])
def test_a_bad_value_is_one_line_naming_it(flag, text, message):
    with pytest.raises(SettingsError) as exc:
        parse_options({**defaults(), flag: text})
    assert str(exc.value) == message


def test_parsed_values():
    fields = parse_options({**defaults(), "--kv-copy-mib": "2", "--kv-threads": "auto", "--kv-no-gate": True,
                            "--kv-counted-contexts": "1k,512", "--kv-max-passes": "dynamic=3.5"})
    assert fields["copy_bytes"] == 2 << 20 and fields["threads"] is None and fields["gate"] is False
    assert fields["counted_contexts"] == (512, 1024) and fields["max_passes"] == {"dynamic": 3.5}
