"""Draft models of ``assisted:MODEL:K`` (``--kv-decoding``) checked before anything is built: a name the suite cannot
load, or a draft whose vocabulary is not the model's, is a one-line usage error (docs/decoding.md, "Assisted
decoding"). Standard library only: the vocabularies come from the presets and from a directory's config.json."""

from __future__ import annotations

import json
from pathlib import Path

from kvcache.analysing import presets
from kvcache.analysing.decoding import parse_strategy


class DraftError(ValueError):
    """A draft model that cannot draft for the model; the message is one line naming the value and what is
    accepted."""


def vocab_of(name: str) -> int | None:
    """The vocabulary size of a preset (``@layers=N`` included) or a config directory; None where it is not known
    without downloading (a hub id) or not stated."""
    base, _ = presets.split_layers(name)
    if base in presets.PRESETS:
        return presets.PRESETS[base].get("vocab_size")
    if base in presets.FAMILY_PRESETS:
        return presets.FAMILY_PRESETS[base].config.get("vocab_size")
    path = Path(name).expanduser() / "config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        return config.get("vocab_size", text.get("vocab_size"))
    return None


def check_drafts(model: str, strategies: tuple[str, ...] | list[str]) -> None:
    """Every ``assisted:MODEL:K`` of ``strategies`` names a model the suite loads (a preset, a directory with a
    config.json or a hub id) with ``model``'s vocabulary, where both are known here; DraftError otherwise."""
    for text in strategies:
        strategy = parse_strategy(text)
        if strategy.family != "assisted" or strategy.draft == "self":
            continue
        try:
            presets.check_name(strategy.draft)
        except presets.ModelError as exc:
            why = str(exc).replace(f"--kv-model {strategy.draft!r}", "", 1).lstrip(": ")
            raise DraftError(f"--kv-decoding {strategy.name}: the draft {strategy.draft!r} {why}") from None
        draft, main = vocab_of(strategy.draft), vocab_of(model)
        if draft is not None and main is not None and draft != main:
            raise DraftError(f"--kv-decoding {strategy.name}: the draft {strategy.draft!r} has a vocabulary of "
                             f"{draft} tokens, the model {model!r} {main} (accepted: a draft with the model's "
                             "vocabulary, or self)")
