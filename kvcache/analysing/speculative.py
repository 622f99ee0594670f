"""The speculative strategies of ``--kv-decoding`` (docs/decoding.md, "Assisted decoding" and "Prompt lookup"): their
names and parsing. Standard library only.

- ``assisted:self:K``: ``generate(assistant_model=<the model itself>)`` with K draft tokens per round (acceptance 100%:
  the draft is the model).
- ``assisted:MODEL:K``: a preset name or config directory as the draft, random weights (acceptance near 0%); its
  vocabulary must be the main model's.
- ``prompt-lookup:K`` / ``prompt-lookup:K:P``: ``generate(prompt_lookup_num_tokens=K)`` on a prompt built so that P%
  (default 100) of each round's K looked-up tokens are accepted."""

from __future__ import annotations

from dataclasses import dataclass

FORMS = "assisted:self:K, assisted:MODEL:K, prompt-lookup:K or prompt-lookup:K:P (K >= 1, 0 <= P <= 100)"
SELF = "self"


class StrategyError(ValueError):
    """A speculative strategy that is not one; the message is one line naming the value and the accepted forms."""


@dataclass(frozen=True)
class Speculative:
    """One speculative strategy: ``kind`` (``assisted`` or ``prompt-lookup``), ``k`` (tokens drafted per round),
    ``draft`` (``self``, a preset or a config directory; None for prompt lookup), ``share`` (prompt lookup: the percent
    of the K looked-up tokens the prompt makes acceptable)."""

    kind: str
    k: int
    draft: str | None = None
    share: int = 100

    @property
    def name(self) -> str:
        """The strategy as written in a record key (``dynamic#<name>``)."""
        if self.kind == "assisted":
            return f"assisted:{self.draft}:{self.k}"
        return f"prompt-lookup:{self.k}" + (f":{self.share}" if self.share != 100 else "")

    @property
    def accepted_per_round(self) -> int | None:
        """Prompt lookup: the looked-up tokens the prompt makes acceptable per round (``round(K × P / 100)``)."""
        return round(self.k * self.share / 100) if self.kind == "prompt-lookup" else None


def _int(text: str, what: str, value: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise StrategyError(f"--kv-decoding: {what} of {value!r} is not an integer (accepted: {FORMS})") from None


def is_speculative(text: str) -> bool:
    """Whether ``text`` names a speculative strategy (one this module parses)."""
    return text.strip().startswith(("assisted:", "prompt-lookup:"))


def parse_speculative(text: str) -> Speculative:
    """``assisted:self:4`` -> Speculative('assisted', 4, 'self'); StrategyError (one line) for anything else."""
    value = text.strip()
    if value.startswith("assisted:"):
        draft, sep, k_text = value[len("assisted:"):].rpartition(":")
        if not sep or not draft:
            raise StrategyError(f"--kv-decoding: {value!r} names no draft and K (accepted: {FORMS})")
        k = _int(k_text, "K", value)
        if k < 1:
            raise StrategyError(f"--kv-decoding: K must be at least 1 in {value!r} (accepted: {FORMS})")
        return Speculative("assisted", k, draft)
    if value.startswith("prompt-lookup:"):
        parts = value[len("prompt-lookup:"):].split(":")
        if len(parts) > 2:
            raise StrategyError(f"--kv-decoding: {value!r} has too many parts (accepted: {FORMS})")
        k = _int(parts[0], "K", value)
        share = _int(parts[1], "P", value) if len(parts) == 2 else 100
        if k < 1:
            raise StrategyError(f"--kv-decoding: K must be at least 1 in {value!r} (accepted: {FORMS})")
        if not 0 <= share <= 100:
            raise StrategyError(f"--kv-decoding: P must be 0 to 100 in {value!r} (accepted: {FORMS})")
        return Speculative("prompt-lookup", k, None, share)
    raise StrategyError(f"--kv-decoding: unknown strategy {value!r} (accepted: {FORMS})")
