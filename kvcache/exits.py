"""The exit-status contract: one table of what each status means and which code it is, under pytest (the suite and
its session-end gate) and for every ``kvcache`` command. The commands return these constants, each command's
``--help`` ends with its lines (:func:`epilog`) and docs/exit-status.md holds :func:`markdown_table` and
:func:`markdown_meanings` (``tests/suite/test_exit_status.py`` keeps them equal and walks every command through every
status it can give). Standard library only."""

from __future__ import annotations

from dataclasses import dataclass

#: The codes every ``kvcache`` command exits with.
PASS, REGRESSION, USAGE_ERROR, NOT_MEASURED, INTERRUPTED = 0, 1, 2, 3, 130
#: An inconclusive verdict does not fail a command (``kvcache compare`` and ``ab`` judge; they do not gate noise).
INCONCLUSIVE = PASS
#: pytest's own codes (``pytest.ExitCode``), which the suite keeps: OK, TESTS_FAILED, INTERRUPTED, INTERNAL_ERROR,
#: USAGE_ERROR, NO_TESTS_COLLECTED.
SUITE_PASS, SUITE_FAILED, SUITE_INTERRUPTED, SUITE_INTERNAL_ERROR, SUITE_USAGE_ERROR, SUITE_NO_TESTS = 0, 1, 2, 3, 4, 5


@dataclass(frozen=True)
class Status:
    """One status of the contract: its name, the code every command gives it, what the suite (pytest) gives it,
    and what it means."""

    name: str
    code: int
    suite: str  # the suite's code(s), as the table shows them
    meaning: str


EXIT_STATUSES = (
    Status("pass", PASS, "0", "what was asked is done: no regression, the output written"),
    Status("regression", REGRESSION, "1", "a figure is worse than allowed (the gate is red)"),
    Status("inconclusive", INCONCLUSIVE, "0; 1 under `--kv-strict`",
           "a timed verdict could not tell (noise, drift, a poor fit): said aloud, not failed (the suite fails "
           "it under `--kv-strict`)"),
    Status("could not measure", NOT_MEASURED, "1; 5 (no test ran)",
           "the measurement did not happen or broke part-way (a skipped class is a skip: 0, and 1 under "
           "`--kv-strict` when the baseline holds its figures; a run that skipped every class measured nothing)"),
    Status("usage error", USAGE_ERROR, "4", "bad input, one line, before anything is measured or written"),
    Status("interrupted", INTERRUPTED, "2", "Ctrl-C or SIGTERM: what was finished is kept, one line"),
)

STATUS_BY_NAME = {status.name: status for status in EXIT_STATUSES}

#: What each ``kvcache`` command means by each status it can give (a status it never gives is absent). Where a
#: command's code means something of its own (bisect's 1: nothing to find; sentinel's 1: a change to report, an
#: improvement included), it says so.
COMMAND_STATUSES: dict[str, dict[str, str]] = {
    "traffic": {"pass": "a class counted, any other skipped with its reason",
                "could not measure": "every class skipped: nothing counted (each skip and its reason said)",
                "usage error": "a bad option, a model that does not fit"},
    "compare": {"pass": "no regression", "regression": "a regression (under --strict, what --kv-strict fails too)",
                "inconclusive": "an inconclusive verdict is shown, not failed (--strict fails it, whatever "
                                "--kv-strict its run was made with)",
                "usage error": "unreadable input, bad options, runs that are not comparable"},
    "report": {"pass": "the report written", "usage error": "unreadable input or output"},
    "baseline": {"pass": "the figures recorded",
                 "usage error": "bad input, or no figure could be recorded (the message says why)"},
    "ab": {"pass": "no regression", "inconclusive": "an inconclusive paired verdict is shown, not failed",
           "regression": "a regression: paired timed, intercept or ledger, or counted or overhead",
           "could not measure": "a side failed part-way", "usage error": "bad input, before anything is measured",
           "interrupted": "the pairs both sides finished are judged and written (a regression among them: 1)"},
    "bisect": {"pass": "the first bad commit (or release) is found",
               "regression": "bisect's own: the two ends show no change, nothing to find",
               "could not measure": "only skipped commits are left where the change is (the candidates listed)",
               "usage error": "bad input, or an end that cannot be measured",
               "interrupted": "finished probes stay cached, the worktree removed"},
    "sentinel": {"pass": "no counted figure changed (or no new commit)",
                 "regression": "sentinel's own: a figure changed or recovered (an improvement too): an issue to file",
                 "could not measure": "the head cannot be measured: nothing recorded, the next run tries again",
                 "usage error": "bad input, or the starting commit cannot be measured",
                 "interrupted": "the state is as it was, finished probes stay cached"},
    "comment": {"pass": "the body written, a regression included (kvcache compare is the gate)",
                "usage error": "unreadable input, bad options, runs that are not comparable"},
    "history": {"pass": "the entry added, or the trend drawn", "usage error": "bad input, an entry stored already"},
    "export": {"pass": "the figures written",
               "usage error": "unreadable input, bad options, no figure for the measures asked"},
    "architectures": {"pass": "the model types listed", "usage error": "a bad option"},
}
for _meanings in COMMAND_STATUSES.values():  # every command stops by the runner's signal rule (kvcache.cli.run)
    _meanings.setdefault("interrupted", "stopped by Ctrl-C or SIGTERM, one line")

#: What the suite (``pytest benchmarks``, the session-end gate) means by each status; its codes are
#: :attr:`Status.suite`.
SUITE_MEANINGS = {
    "pass": "every verdict passes (skips and no-baseline verdicts included)",
    "regression": "a verdict is a regression: the last line says `1 failed` (the `kv-cache gate`)",
    "inconclusive": "said aloud, not failed; `--kv-strict` fails it (1)",
    "could not measure": "1: a point failed, or the run file or the baseline could not be written; 5: no test ran",
    "usage error": "a bad `--kv-*` value, a model that does not fit, a baseline path that names no file",
    "interrupted": "the points measured so far analysed and written (`kv.session.interrupted`)",
}


def status_code(status: str) -> int:
    """A command's code for ``status``."""
    return STATUS_BY_NAME[status].code


def command_statuses(command: str) -> list[tuple[int, str, str]]:
    """``(code, status, meaning)`` of each status ``command`` can give, in the table's order."""
    meanings = COMMAND_STATUSES[command]
    return [(s.code, s.name, meanings[s.name]) for s in EXIT_STATUSES if s.name in meanings]


def epilog(command: str) -> str:
    """The end of ``kvcache COMMAND --help`` (:func:`kvcache.cli.run` sets it): the command's exit statuses, by
    code, in one paragraph (argparse reflows it)."""
    given = sorted(command_statuses(command), key=lambda row: row[0])
    return "Exit status: " + "; ".join(f"{number} {name}: {meaning}" for number, name, meaning in given) + \
        " (docs/exit-status.md)."


def markdown_table() -> str:
    """The contract as one Markdown table: a row per status, its meaning and its code under pytest and for each
    command (``-``: the command never gives it)."""
    names = list(COMMAND_STATUSES)
    head = ["status", "meaning", "pytest (the suite)", *(f"`{name}`" for name in names)]
    rows = [head, ["---"] * len(head)]
    for s in EXIT_STATUSES:
        rows.append([s.name, s.meaning, s.suite,
                     *(str(s.code) if s.name in COMMAND_STATUSES[name] else "-" for name in names)])
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def markdown_meanings() -> str:
    """What each face means by each status it gives: a row per face and status."""
    rows = [["face", "exit", "status", "meaning"], ["---"] * 4]
    rows += [["pytest", s.suite, s.name, SUITE_MEANINGS[s.name]] for s in EXIT_STATUSES]
    rows += [[f"`kvcache {command}`", str(number), name, meaning] for command in COMMAND_STATUSES
             for number, name, meaning in command_statuses(command)]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def regenerated(page: str) -> str:
    """``page`` (docs/exit-status.md's text) with each block between ``<!-- generated: kvcache.exits.NAME -->`` and
    ``<!-- end generated -->`` made again by ``NAME``: :func:`markdown_table` or :func:`markdown_meanings`."""
    import re

    makers = {"markdown_table": markdown_table, "markdown_meanings": markdown_meanings}
    return re.sub(r"(<!-- generated: kvcache\.exits\.(\w+) -->\n).*?(\n<!-- end generated -->)",
                  lambda m: m.group(1) + makers[m.group(2)]() + m.group(3), page, flags=re.S)


if __name__ == "__main__":  # python -m kvcache.exits docs/exit-status.md: the page's tables made again
    import sys
    from pathlib import Path

    for name in sys.argv[1:]:
        Path(name).write_text(regenerated(Path(name).read_text(encoding="utf-8")), encoding="utf-8")
