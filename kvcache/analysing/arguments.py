"""Command-line arguments of the analysing wing's commands (``kvcache compare``, ``comment``, ``history``,
``export``). Stdlib only."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """``parser.parse_args`` of ``argv`` (``sys.argv[1:]`` when None), with argparse's exit turned into the exit
    status to return: 0 after ``--help``, 2 after a usage error (which argparse has printed)."""
    try:
        return parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
