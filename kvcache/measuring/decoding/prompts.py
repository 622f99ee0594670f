"""The prompt of a speculative point (:mod:`kvcache.measuring.decoding.speculative`): a run of one token the model
greedily repeats after itself, found among its one-token fixed points (docs/decoding.md, "Assisted decoding")."""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import torch

FIXED_POINT_BATCH = 1024  # tokens tried per forward when looking for tokens the model repeats
TRIES = 16  # tokens the model repeats tried at a point's length before the prompt is given up
_FIXED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # {model: {id(draft): FixedPoints}}


class FixedPoints:
    """The tokens the model greedily predicts after themselves (and ``draft``, if any, does not: it must propose
    another token), smallest first, found :data:`FIXED_POINT_BATCH` tokens a forward as they are asked for, and
    memoised per model and draft (:func:`fixed_points`).

    One token is enough to try: after a run of one token every position's hidden state is the same whatever the
    run's length (attention averages identical values; rotary positions change only its weights), so what the model
    predicts after one ``token`` it predicts after a prompt of them. A model whose values depend on the position
    (learned absolute positions) breaks that; the point checks each token at its own length
    (:meth:`SpeculativePoint._prompt`) and takes the next one when it does not hold."""

    def __init__(self, model: Any, draft: Any) -> None:
        self.model, self.draft = model, draft
        self.found: list[int] = []
        self.scanned = 0

    def __iter__(self) -> Any:
        i, vocab = 0, self.model.config.vocab_size
        while True:
            while i >= len(self.found):
                if self.scanned >= vocab:
                    return
                self._scan(min(vocab, self.scanned + FIXED_POINT_BATCH))
            yield self.found[i]
            i += 1

    def _scan(self, end: int) -> None:
        device = next(self.model.parameters()).device
        tokens = torch.arange(self.scanned, end, device=device)
        with torch.inference_mode():
            hits = last_prediction(self.model, tokens.unsqueeze(1)) == tokens
            if self.draft is not None:
                hits &= last_prediction(self.draft, tokens.unsqueeze(1)) != tokens
        self.found += tokens[hits].tolist()
        self.scanned = end


def fixed_points(model: Any, draft: Any = None) -> FixedPoints:
    """The model's :class:`FixedPoints` (a ``draft`` other than the model: those it does not predict too)."""
    other = draft if draft is not None and draft is not model else None
    memo = _FIXED.setdefault(model, {})
    if id(other) not in memo:
        memo[id(other)] = FixedPoints(model, other)
    return memo[id(other)]


def last_prediction(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """The model's greedy prediction after each row of ``ids`` (argmax of the last position's logits; only those
    are computed where the model takes ``logits_to_keep``, 4.45's ``num_logits_to_keep``)."""
    keep = next((name for name in ("logits_to_keep", "num_logits_to_keep")
                 if name in inspect.signature(model.forward).parameters), None)
    return model(input_ids=ids, **({keep: 1} if keep else {})).logits[:, -1].argmax(-1)


def speculative_prompt(token: int, length: int, k: int, accepted: int | None = None, other: int | None = None
                       ) -> list[int]:
    """``length`` tokens, all ``token`` (see the module docstring): the model repeats it, so a self-draft's and a
    lookup's K candidates (``token`` again: every round's last two tokens are ``token, token``, whose first match is
    the prompt's start) are all accepted, and a random draft's (another token) none. With ``accepted`` < K
    (``prompt-lookup:K:P``) the token at ``2 + accepted`` is ``other``: the lookup's candidates, the K tokens after
    the prompt's first two, are ``accepted`` times ``token``, then ``other``, which the model rejects, every step."""
    if length < k + 4:
        raise ValueError(f"a speculative strategy of {k} tokens needs a context of at least {k + 4} tokens")
    ids = [token] * length
    if accepted is not None and accepted < k:
        ids[2 + accepted] = other
    return ids
