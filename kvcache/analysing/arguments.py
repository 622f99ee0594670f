"""Command-line arguments of the ``kvcache`` commands: parsing with argparse's exit turned into a status, the
judge's rule options, made from the options table (:data:`kvcache.analysing.options.OPTIONS`, the one home of
every rule and its help), and the checks every command makes of its arguments before any work: the files it reads
and writes (:func:`paths_refused`, the rules of :func:`kvcache.analysing.files.paths_problem`), a URL
(:func:`http_url`), a release name (:func:`release`, the installer's rule). Stdlib only."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from kvcache.analysing import files
from kvcache.analysing.judge.rules import Rules
from kvcache.analysing.options import OPTIONS, Option

#: The judge's rules, in the table's order: each is an option of the commands that judge (``--tolerance``, ...).
RULE_OPTIONS: tuple[Option, ...] = tuple(o for o in OPTIONS if o.rule)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """``parser.parse_args`` of ``argv`` (``sys.argv[1:]`` when None), with argparse's exit turned into the exit
    status to return: 0 after ``--help``, 2 after a usage error (which argparse has printed)."""
    try:
        return parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2


def split_extra(argv: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """``argv`` (``sys.argv[1:]`` when None) cut at its first ``--``: the command's own arguments, and the ones after
    it that the command passes on (pytest's, for the commands that run the suite); no ``--``: nothing passed on."""
    given = list(sys.argv[1:] if argv is None else argv)
    if "--" not in given:
        return given, []
    cut = given.index("--")
    return given[:cut], given[cut + 1:]


def rule_help(option: Option) -> str:
    """The help of a rule option: the table's help, with its default replaced by each run's own setting (the rule
    a run's gate judged it with, which the option replaces for every run)."""
    own = f"(default: each run's own {option.flag} setting, as its gate judged it)"
    text, replaced = re.subn(r"\(default[^)]*\)", lambda _: own, option.help)
    return text if replaced else f"{text} {own}"


def add_rule_options(parser: argparse.ArgumentParser) -> None:
    """One option per rule of the table (:data:`RULE_OPTIONS`: ``--tolerance``, ..., ``--min-r2``, ``--max-drift``),
    a number stored under the :class:`~kvcache.analysing.judge.rules.Rules` field it sets; None when not given."""
    for option in RULE_OPTIONS:
        parser.add_argument(option.compare_flag, dest=option.setting, type=float,
                            help=rule_help(option))


def rules_given(args: argparse.Namespace) -> dict[str, float]:
    """The rule options given, ``{Rules field: value}``; ValueError (one line naming the option and the value) when
    a value cannot judge (NaN, negative, an R² above 1)."""
    given = {o.setting: getattr(args, o.setting) for o in RULE_OPTIONS if getattr(args, o.setting) is not None}
    try:
        Rules(**given)
    except ValueError as exc:
        raise ValueError(f"--{str(exc).replace('_', '-')}") from None
    return given


def paths_refused(prog: str, reads: Iterable[tuple[str, str | Path | None]] = (),
                  writes: Iterable[tuple[str, str | Path | None]] = (),
                  folders: Iterable[tuple[str, str | Path | None, Iterable[str]]] = ()) -> bool:
    """Before any work: whether the files and folders a command reads and writes break a rule of
    :func:`kvcache.analysing.files.paths_problem` (an output on an input, two outputs on one file, an output that
    cannot be written); the problem is printed as ``PROG: problem``, one line, and the command exits 2."""
    problem = files.paths_problem(reads, writes, folders)
    if problem:
        print(f"{prog}: {problem}", file=sys.stderr)
    return problem is not None


def http_url(option: str, text: str) -> str:
    """``text`` when it is an http(s) URL with a host; ValueError (one line naming ``option`` and the value)
    otherwise, a URL ``urlsplit`` itself refuses (``http://[evil]/``) included."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:
        raise ValueError(f"{option} {text!r} is not a URL ({exc}); give an http(s) URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{option} {text!r} is not an http(s) URL")
    return text


def release(option: str, text: str) -> str:
    """A Transformers release named on the command line, normalised by the installer's rule
    (:func:`kvcache.analysing.releases.normalise`: ``v5.23.0``, ``5.23``, ``5.23.0.0`` and ``05.023.0`` are
    ``5.23.0``), so that one release has one name wherever it is stored; a pre-release keeps its suffix (``v5.0rc1``
    is ``5.0.0rc1``, ``5.0rc01`` too). ValueError (one line naming ``option``) for a name that is not a release
    number."""
    from kvcache.analysing.releases import ReleaseError, normalise

    given = text.strip()
    found = re.fullmatch(r"[vV]?(\d+(?:\.\d+)+)(?:(a|b|rc)(\d+))?(?:\.dev(\d+))?", given)
    try:
        if found is None:
            raise ReleaseError(f"not a release number: {text!r} (e.g. 5.24.0, v5.24.0, 5.24 or 5.0.0rc1)")
        final, kind, number, dev = found.groups()  # suffix numbers without leading zeros too: rc01 is rc1
        return (normalise(final)[0] + (f"{kind}{int(number)}" if kind else "") +
                (f".dev{int(dev)}" if dev is not None else ""))
    except ReleaseError as exc:
        raise ValueError(f"{option}: {exc}") from None
