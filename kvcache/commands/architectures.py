"""``kvcache architectures --list``: the model types ``--kv-model arch:<model_type>`` accepts in the installed
Transformers release (every decoder-only type it maps to a causal-LM class); ``--all`` adds the other causal-LM types
with why each is refused. docs/architectures.md."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from kvcache import cli, exits


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="kvcache architectures",
        description="List the model types --kv-model arch:<model_type> accepts in the installed Transformers "
                    "release: each decoder-only type it maps to a causal-LM class, one a line.")
    made.add_argument("--list", action="store_true", help="list the accepted model types (the default)")
    made.add_argument("--all", action="store_true", help="also the causal-LM types refused, each with why")
    made.add_argument("--json", action="store_true", help="as one JSON object: {model_type: reason or null}")
    made.add_argument("--kv-at", metavar="TOKENS",
                      help="with --json: also each accepted type's KV bytes at TOKENS tokens of its default (real) "
                           "config in bfloat16 (kv_bytes)")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(parser, work, argv)


def work(args: argparse.Namespace) -> int:
    """The accepted types (and with ``--all`` the refused ones and why) on stdout."""
    from transformers import __version__

    from kvcache.measuring.architectures import causal_lm_types

    tokens = kv_at(args.kv_at)
    types = causal_lm_types()
    shown = {k: v for k, v in types.items() if args.all or v is None}
    if args.json:
        doc: dict = {"transformers": __version__, "types": shown}
        if tokens:
            from kvcache.measuring.architectures import default_kv_bytes

            doc["kv_bytes"] = {k: default_kv_bytes(k, tokens) for k, v in shown.items() if v is None}
            doc["kv_at"] = tokens
        print(json.dumps(doc, indent=1))
        return exits.status_code("pass")
    for kind, reason in shown.items():
        print(kind if reason is None else f"{kind}  (refused: {reason})")
    return exits.status_code("pass")


def kv_at(text: str | None) -> int | None:
    """``--kv-at``'s tokens, or a one-line usage error naming the value and what is accepted."""
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise cli.UsageError(f"--kv-at {text!r} is not accepted; give a whole number of tokens above 0, e.g. 32768")
    return int(text)
