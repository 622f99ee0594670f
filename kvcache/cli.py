"""The ``kvcache`` command: ``kvcache COMMAND [ARGS...]`` runs the ``main`` of that command's module (:data:`COMMANDS`,
one module per command, imported only when it runs), and the text helpers the commands share."""

from __future__ import annotations

import sys

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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"kvcache: unknown command {name!r}; choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = __import__(COMMANDS[name][0], fromlist=["main"])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
