"""The ``kvcache`` command's faces: every command's ``--help`` says in full what it does, and ``kvcache traffic``
names what its counts hold for (model, dtype, device, Transformers and torch versions) before them."""

from __future__ import annotations

import pytest

from kvcache import cli


def help_text(capsys, *argv: str) -> str:
    """``kvcache ARGV --help``'s output; it succeeds (argparse's exit, or a command's own return code)."""
    try:
        code = cli.main([*argv, "--help"])
    except SystemExit as exc:
        code = exc.code
    assert code == 0
    return capsys.readouterr().out


def description(help_: str) -> str:
    """The paragraph after argparse's usage lines, on one line."""
    paragraphs = [" ".join(p.split()) for p in help_.split("\n\n")]
    return next(p for p in paragraphs[1:] if p and not p.startswith(("positional arguments", "options")))


def test_usage_lists_every_command_and_where_the_suite_runs(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert f"\n  {name} " in out, out
    assert "pytest --pyargs kvcache.benchmarks" in out


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_command_help_is_a_whole_description(capsys, command):
    text = description(help_text(capsys, command))
    assert text.endswith((".", ")")), f"kvcache {command} --help stops mid-sentence: {text!r}"


def test_traffic_help_has_its_whole_docstring(capsys):
    from kvcache.commands import traffic as traffic_cli

    assert description(help_text(capsys, "traffic")) == cli.description(traffic_cli.__doc__)
    assert cli.description(traffic_cli.__doc__).endswith("the Transformers and torch versions the counts hold for.")


def test_traffic_prints_what_the_counts_hold_for_first(capsys):
    torch = pytest.importorskip("torch")
    import transformers

    assert cli.main(["traffic", "--cache", "dynamic", "--model", "tiny", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0]
    for part in ("model tiny (", "KV bytes per token", "dtype bfloat16", "device cpu: ",
                 f"transformers {transformers.__version__}", f"torch {torch.__version__}"):
        assert part in header, f"{part!r} not in {header!r}"
    assert lines[1].startswith("dynamic: 3.000 counted passes"), lines[:3]
