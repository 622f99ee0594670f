"""Every ``kvcache`` command has one shape: its module (:data:`kvcache.cli.COMMANDS`) is ``kvcache.commands.<name>``,
with ``parser()`` (its ``argparse.ArgumentParser``, ``prog`` ``kvcache <name>``) and ``main(argv)``, which parses
through :func:`kvcache.analysing.arguments.parse`: ``--help`` returns 0 and a usage error 2, never a SystemExit."""

from __future__ import annotations

import argparse
import importlib
import inspect

import pytest

from kvcache import cli

COMMANDS = list(cli.COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_a_command_is_a_module_of_kvcache_commands_with_parser_and_main(name):
    module_name = cli.COMMANDS[name][0]
    assert module_name == f"kvcache.commands.{name}"
    module = importlib.import_module(module_name)
    made = module.parser()
    assert isinstance(made, argparse.ArgumentParser)
    assert made.prog == f"kvcache {name}"
    parameters = list(inspect.signature(module.main).parameters)
    assert parameters == ["argv"], f"{module_name}.main{inspect.signature(module.main)}"


@pytest.mark.parametrize("name", COMMANDS)
def test_help_returns_0_and_a_usage_error_2(name, capsys):
    module = importlib.import_module(cli.COMMANDS[name][0])
    assert module.main(["--help"]) == 0
    assert f"usage: kvcache {name}" in capsys.readouterr().out
    assert module.main(["--no-such-option"]) == 2
    assert "error:" in capsys.readouterr().err
