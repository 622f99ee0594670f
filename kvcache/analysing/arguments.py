"""Command-line arguments of the analysing wing's commands (``kvcache compare``, ``comment``, ``history``,
``export``): parsing with argparse's exit turned into a status, and the judge's rule options, made from the options
table (:data:`kvcache.analysing.options.OPTIONS`, the one home of every rule and its help). Stdlib only."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from kvcache.analysing.options import OPTIONS, Option
from kvcache.analysing.rules import Rules

#: The judge's rules, in the table's order: each is an option of the commands that judge (``--tolerance``, ...).
RULE_OPTIONS: tuple[Option, ...] = tuple(o for o in OPTIONS if o.rule)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """``parser.parse_args`` of ``argv`` (``sys.argv[1:]`` when None), with argparse's exit turned into the exit
    status to return: 0 after ``--help``, 2 after a usage error (which argparse has printed)."""
    try:
        return parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2


def rule_help(option: Option) -> str:
    """The help of a rule option: the table's help, with its default replaced by each run's own setting (the rule
    a run's gate judged it with, which the option replaces for every run)."""
    own = f"(default: each run's own {option.flag} setting, as its gate judged it)"
    text, replaced = re.subn(r"\(default[^)]*\)", lambda _: own, option.help)
    return text if replaced else f"{text} {own}"


def add_rule_options(parser: argparse.ArgumentParser) -> None:
    """One option per rule of the table (:data:`RULE_OPTIONS`: ``--tolerance``, ..., ``--min-r2``, ``--max-drift``),
    a number stored under the :class:`~kvcache.analysing.rules.Rules` field it sets; None when not given."""
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
