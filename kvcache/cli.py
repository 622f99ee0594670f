"""The ``kvcache`` command: ``kvcache COMMAND [ARGS...]`` runs the ``main`` of that command's module (:data:`COMMANDS`,
one module per command, imported only when it runs); :func:`run`, the runner every command's ``main`` is, and the
text helpers the commands share."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from kvcache import exits

COMMANDS = {
    "traffic": ("kvcache.commands.traffic", "count the bytes one decode step moves, per op, and probe attention"),
    "compare": ("kvcache.commands.compare", "compare benchmark JSON runs; exit 1 on a regression"),
    "report": ("kvcache.commands.report", "write latency.png, traffic.png, report.md and report.html"),
    "baseline": ("kvcache.commands.baseline", "record a finished run's passes in the baseline file"),
    "ab": ("kvcache.commands.ab",
           "two environments side by side, interleaved: B judged against A; exit 1 on a regression"),
    "bisect": ("kvcache.commands.bisect", "find the Transformers commit or release that changed a counted figure"),
    "sentinel": ("kvcache.commands.sentinel",
                 "watch a Transformers branch: each counted figure that changed, bisected to its commit"),
    "comment": ("kvcache.commands.comment",
                "a pull request's comment (Markdown): HEAD against BASE, verdict first"),
    "history": ("kvcache.commands.history", "add a run to a history across commits; plot its trend with steps"),
    "export": ("kvcache.commands.export", "a run's figures for github-action-benchmark (customSmallerIsBetter)"),
    "architectures": ("kvcache.commands.architectures", "the model types --kv-model arch:<model_type> accepts"),
}


def usage() -> str:
    lines = ["usage: kvcache COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "kvcache COMMAND --help describes a command's arguments. The benchmark suite itself runs under",
              "pytest: pytest benchmarks in this repository, pytest --pyargs kvcache.benchmarks anywhere else",
              "(options --kv-*, listed by pytest --help)."]
    return "\n".join(lines)


def description(doc: str) -> str:
    """A command's ``--help`` description: its module docstring, every paragraph, without reST markup."""
    return " ".join(doc.replace("``", "").split())


def last_line(text: str, limit: int = 300) -> str:
    """The last non-blank line of a command's output, at most ``limit`` characters (``(no output)`` when blank): what
    a command quotes of a subprocess that failed."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else "(no output)")[:limit]


def say(*lines: object, err: bool = False) -> None:
    """Print each of ``lines`` as one line of the terminal (stderr when ``err``), every control character shown as
    its code (:func:`kvcache.analysing.tables.terminal_text`): how a command prints a string a run, a file or a probe
    gave it."""
    from kvcache.analysing.tables import terminal_text

    for line in lines:
        print(terminal_text(line), file=sys.stderr if err else sys.stdout, flush=True)


class UsageError(Exception):
    """Bad input a command's work finds after parsing (a value, a file, runs that are not comparable): one line,
    ``PROG: message``, exit 2 (:func:`run`)."""


def run(parser: Callable[[], argparse.ArgumentParser], work: Callable[..., int], argv: Sequence[str] | None, *,
        extra: bool = False, errors: tuple[type[BaseException], ...] = (),
        stop: type[BaseException] = KeyboardInterrupt) -> int:
    """Run one command: what every ``kvcache`` command's ``main(argv)`` is, its module being its ``parser()`` and
    its ``work``.

    ``argv`` (``sys.argv[1:]`` when None), cut at its first ``--`` when ``extra`` (the rest is passed on as
    ``work``'s second argument), is parsed by ``parser()`` (:func:`kvcache.analysing.arguments.parse`: ``--help``
    returns 0, a usage error 2). Then ``work(args)`` (or ``work(args, extra)``) returns the exit status. Bad input
    the work finds (:class:`UsageError`, or an exception of ``errors``) and an output it could not write
    (:class:`kvcache.analysing.files.OutputError`) are one line, ``PROG: message``, and exit 2. Every command keeps
    the signal rule (:func:`kvcache.analysing.files.signals_stop`): the first SIGINT or SIGTERM raises ``stop(signal
    name)`` (KeyboardInterrupt unless the command names its own) in the work, every later one only prints, and they
    are ignored as the process exits, so the status is the command's; a ``stop`` the work lets out is ``PROG:
    interrupted by SIGTERM``, exit 130. The codes are :mod:`kvcache.exits`'s, and so is the end of the command's
    ``--help`` (:func:`kvcache.exits.epilog`)."""
    from kvcache.analysing import arguments, files

    made = parser()
    name = made.prog.removeprefix("kvcache ")
    if made.epilog is None and name in exits.COMMAND_STATUSES:
        made.epilog = exits.epilog(name)
    own, passed_on = arguments.split_extra(argv) if extra else (argv, [])
    args = arguments.parse(made, own)
    if isinstance(args, int):  # --help (0) or a usage error (2), printed by argparse
        return args
    given: list[Any] = [args, passed_on] if extra else [args]
    try:
        try:
            with files.signals_stop(made.prog, stop):
                return int(work(*given) or exits.PASS)
        except stop as exc:
            print(f"{made.prog}: interrupted by {exc}", file=sys.stderr)
            return exits.INTERRUPTED
    except (UsageError, files.OutputError, *errors) as exc:
        say(f"{made.prog}: {exc}", err=True)
        return exits.USAGE_ERROR


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return exits.PASS
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"kvcache: unknown command {name!r}; choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return exits.USAGE_ERROR
    module = __import__(COMMANDS[name][0], fromlist=["main"])
    return int(module.main(rest) or exits.PASS)


if __name__ == "__main__":
    sys.exit(main())
