"""Every ``kvcache`` command has one shape: its module (:data:`kvcache.cli.COMMANDS`) is ``kvcache.commands.<name>``,
its ``parser()`` (an ``argparse.ArgumentParser``, ``prog`` ``kvcache <name>``) and its ``work(args)`` (or
``work(args, extra)``, the arguments after ``--``), and ``main(argv)`` is one call of the runner,
:func:`kvcache.cli.run`: the parse, ``--help`` 0, a usage error 2 (never a SystemExit), the signal rule."""

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
    work = list(inspect.signature(module.work).parameters)
    assert work in (["args"], ["args", "extra"], ["args", "common"]), f"{module_name}.work{work}"


@pytest.mark.parametrize("name", COMMANDS)
def test_main_is_one_call_of_the_runner(name):
    """The parse, the usage-error exit and the signal rule live in the runner, not in each command."""
    module = importlib.import_module(cli.COMMANDS[name][0])
    body = [line.strip() for line in inspect.getsource(module.main).splitlines()[1:]]
    code = [line for line in body if line and not line.startswith(("#", '"""', "``"))]
    assert code and code[0].startswith("return cli.run(parser, work, argv"), code
    source = inspect.getsource(module)
    for repeated in ("arguments.parse(", "arguments.split_extra(", "signals_stop("):
        assert repeated not in source, f"{name}: {repeated} is the runner's"


@pytest.mark.parametrize("name", COMMANDS)
def test_help_returns_0_and_a_usage_error_2(name, capsys):
    module = importlib.import_module(cli.COMMANDS[name][0])
    assert module.main(["--help"]) == 0
    assert f"usage: kvcache {name}" in capsys.readouterr().out
    assert module.main(["--no-such-option"]) == 2
    assert "error:" in capsys.readouterr().err


def default_folders() -> set[str]:
    """The folders the commands write into the current directory by default (``--out-dir``, ``--versions-dir``)."""
    found = set()
    for name in COMMANDS:
        for action in importlib.import_module(cli.COMMANDS[name][0]).parser()._actions:
            if action.dest in ("out_dir", "versions_dir") and isinstance(action.default, str):
                found.add(action.default)
    return found


def test_a_commands_default_folder_is_ignored_by_git():
    """``kvcache ab`` left ``.kvcache-ab/`` in the checkout as an untracked folder: every folder a command writes
    into the current directory by default is in .gitignore."""
    from pathlib import Path

    folders = default_folders()
    assert ".kvcache-ab" in folders and ".versions" in folders, folders
    ignored = {line.strip().strip("/") for line in (Path(__file__).resolve().parents[2] / ".gitignore").read_text(
        encoding="utf-8").splitlines()}
    assert sorted(folders - ignored) == []
