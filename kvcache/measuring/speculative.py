"""Assisted decoding and prompt lookup, counted (docs/decoding.md, "Assisted decoding" and "Prompt lookup"): one
verification round of ``model.generate(assistant_model=...)`` or ``generate(prompt_lookup_num_tokens=K)``, every ATen
op of it charged by the suite's counter (:class:`~kvcache.measuring.counting.traffic.TrafficCounter`), split by phase:

- ``draft``: the candidate generator's ``get_candidates`` (the draft model's own generate, its forwards and its
  cache's ``crop``; for prompt lookup, the n-gram search over the token ids);
- ``verify``: the main model's forward over the last accepted token and the K candidates;
- ``crop``: the main cache's ``crop`` of the rejected candidates;
- the rest of the round is generate's own bookkeeping (logits, argmax, the token ids).

A round is the span between two calls of ``get_candidates``; the first round (it holds the prefill) is never counted.
Passes are slopes between two contexts, as everywhere in the suite: Δ(bytes) / Δ(KV bytes held), the main model's
phases per byte of the main cache, the draft phase per byte of the draft's cache (never mixed)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from kvcache.analysing.speculative import SELF, Speculative, StrategyError
from kvcache.measuring import compat
from kvcache.measuring.counting.traffic import TrafficCount, TrafficCounter, op_passes
from kvcache.measuring.generate import PAD_TOKEN, _without_eos

DRAFT, VERIFY, CROP = "draft", "verify", "crop"
PHASES = (VERIFY, CROP, DRAFT)
WARM_ROUNDS = 1  # rounds run before the counted one (the first holds the prefill)
DRAFT_SEED = 1  # a random draft's weights: not the main model's (seed 0)
FIXED_POINT_BATCH = 256  # token runs tried per forward when looking for a token the model repeats


@dataclass
class Round:
    """One counted verification round: ``count`` (bytes by op, with scopes ``draft``/``verify``/``crop``),
    ``tokens`` the round added to the sequence (accepted candidates + 1), ``drafted`` candidates it verified,
    ``draft_cache`` the class name of the draft's cache (None for prompt lookup)."""

    count: TrafficCount
    tokens: int
    drafted: int
    draft_cache: str | None


def draft_for(strategy: Speculative, model: Any, device: Any, dtype: str) -> tuple[Any, Any] | tuple[None, None]:
    """``(draft model, its ModelSpec)``: the model itself for ``self``, a random-weight build of the named preset or
    config directory otherwise (StrategyError when its vocabulary is not the main model's); (None, None) for prompt
    lookup."""
    if strategy.kind != "assisted":
        return None, None
    if strategy.draft == SELF:
        from kvcache.measuring.geometry import spec_from_config

        return model, spec_from_config(SELF, model.config, dtype)
    from kvcache.measuring.models import build_model

    draft, spec = build_model(strategy.draft, device, dtype, seed=DRAFT_SEED)
    main_vocab, draft_vocab = model.config.vocab_size, draft.config.vocab_size
    if draft_vocab != main_vocab:
        raise StrategyError(f"--kv-decoding: the draft {strategy.draft!r} of {strategy.name!r} has a vocabulary of "
                            f"{draft_vocab} tokens, the model {main_vocab} (accepted: a draft with the same vocabulary)")
    return draft, spec


def repeated_token(model: Any, device: Any) -> int:
    """A token the model greedily repeats after a run of itself (a fixed point of its random weights), smallest
    first; the prompt lookup prompt is built of it. RuntimeError when the vocabulary has none."""
    vocab = model.config.vocab_size
    with torch.inference_mode():
        for start in range(0, vocab, FIXED_POINT_BATCH):
            tokens = torch.arange(start, min(vocab, start + FIXED_POINT_BATCH), device=device)
            runs = tokens.unsqueeze(1).repeat(1, 16)
            picked = model(input_ids=runs).logits[:, -1].argmax(-1)
            hits = (picked == tokens).nonzero().flatten()
            if hits.numel():
                return int(tokens[hits[0]])
    raise RuntimeError("no token the model repeats after a run of itself: prompt lookup's prompt cannot be built")


def lookup_prompt(token: int, vocab: int, context: int, strategy: Speculative) -> list[int]:
    """``context`` tokens: ``token`` twice, then the K tokens a lookup of that pair proposes (the first
    ``accepted_per_round`` are ``token``, which the model repeats, the rest another token, which it rejects), then
    ``token`` to the end. Every round's last two tokens are ``token, token``, whose first match is the prompt's start,
    so every round proposes those K tokens and accepts the same share."""
    accepted = strategy.accepted_per_round or 0
    other = (token + 1) % vocab
    bait = [token, token] + [token] * accepted + [other] * (strategy.k - accepted)
    if context < len(bait) + 2:
        raise StrategyError(f"--kv-decoding: {strategy.name!r} needs a context of at least {len(bait) + 2} tokens")
    return bait + [token] * (context - len(bait))


def _config(model: Any, strategy: Speculative, new_tokens: int) -> Any:
    from kvcache.measuring.generate import generation_config

    config = generation_config(model, new_tokens)
    if strategy.kind == "prompt-lookup":
        config.prompt_lookup_num_tokens = strategy.k
    return config


def _set_draft(draft: Any, k: int) -> dict[str, Any]:
    """K draft tokens every round, never fewer (no schedule, no confidence stop); the settings it replaced."""
    own = draft.generation_config
    wanted = {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
              "assistant_confidence_threshold": 0.0}
    before = {name: getattr(own, name, None) for name in wanted}
    for name, value in wanted.items():
        setattr(own, name, value)
    return before


def count_round(model: Any, cache: Any, input_ids: torch.Tensor, strategy: Speculative, draft: Any = None,
                warm_rounds: int = WARM_ROUNDS) -> Round:
    """The counted round after ``warm_rounds`` rounds of one generate call on ``input_ids`` (batch 1) with ``cache``
    (see the module docstring). ValueError with the release's reason when it cannot run (a cache that cannot
    ``crop``)."""
    counter = TrafficCounter()
    state: dict[str, Any] = {"calls": 0, "inside": False, "lengths": [], "drafted": 0, "generator": None}

    def wrap_generator(original: Any) -> Any:
        def get_candidate_generator(*args: Any, **kwargs: Any) -> Any:
            generator = original(*args, **kwargs)
            state["generator"] = generator
            candidates = generator.get_candidates

            def get_candidates(ids: torch.Tensor, **more: Any) -> Any:
                state["calls"] += 1
                if state["calls"] == warm_rounds + 1:
                    counter.__enter__()
                    state["inside"] = True
                    state["lengths"].append(ids.shape[1])
                elif state["calls"] == warm_rounds + 2 and state["inside"]:
                    counter.__exit__(None, None, None)
                    state["inside"] = False
                    state["lengths"].append(ids.shape[1])
                counter.active.append(DRAFT)
                try:
                    out = candidates(ids, **more)
                finally:
                    counter._leave(DRAFT)
                if state["inside"]:
                    state["drafted"] = out[0].shape[1] - ids.shape[1]
                return out

            generator.get_candidates = get_candidates
            return generator
        return get_candidate_generator

    def scoped(label: str, original: Any, unless: str | None = None) -> Any:
        @functools.wraps(original)  # generate reads the forward's signature (logits_to_keep, the cache keyword)
        def call(*args: Any, **kwargs: Any) -> Any:
            pushed = unless is None or unless not in counter.active
            if pushed:
                counter.active.append(label)
            try:
                return original(*args, **kwargs)
            finally:
                if pushed:
                    counter._leave(label)
        return call

    model._get_candidate_generator = wrap_generator(model._get_candidate_generator)
    model.forward = scoped(VERIFY, model.forward, unless=DRAFT)
    cache.crop = scoped(CROP, cache.crop)
    saved = _set_draft(draft, strategy.k) if draft is not None else {}
    new_tokens = (warm_rounds + 3) * (strategy.k + 1) + 1
    extra = {"assistant_model": draft} if draft is not None else {}
    try:
        with torch.inference_mode(), _without_eos(model):
            model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                           generation_config=_config(model, strategy, new_tokens),
                           **{compat.cache_keyword(model): cache}, **extra)
    finally:
        if state["inside"]:
            counter.__exit__(None, None, None)
        for name in ("_get_candidate_generator", "forward"):
            vars(model).pop(name, None)
        vars(cache).pop("crop", None)
        for name, value in saved.items():
            setattr(draft.generation_config, name, value)
    if len(state["lengths"]) != 2:
        raise RuntimeError(f"generate ran {state['calls']} rounds; {warm_rounds + 2} are needed to count one")
    generator = state["generator"]
    draft_cache = getattr(generator, "assistant_kwargs", {}).get(compat.cache_keyword(draft)) if draft else None
    return Round(counter.count, state["lengths"][1] - state["lengths"][0], state["drafted"],
                 type(draft_cache).__name__ if draft_cache is not None else None)


def prompt_ids(model: Any, strategy: Speculative, context: int, device: Any) -> torch.Tensor:
    """The prompt of ``context`` tokens a strategy runs on: :func:`lookup_prompt` for prompt lookup, the generate
    driver's (every token ``PAD_TOKEN + 1``) for assisted decoding."""
    if strategy.kind == "prompt-lookup":
        token = repeated_token(model, device)
        ids = lookup_prompt(token, model.config.vocab_size, context, strategy)
        return torch.tensor([ids], device=device)
    return torch.full((1, context), PAD_TOKEN + 1, device=device)


def _phase(count: TrafficCount, label: str) -> TrafficCount:
    return count.scope(label)


def _main(count: TrafficCount) -> TrafficCount:
    """The round's ops less the draft phase (the main model's verify, crop and generate's bookkeeping)."""
    main = TrafficCount()
    draft = count.scope(DRAFT)
    for name, op in count.ops.items():
        less = draft.ops[name] if name in draft.ops else None
        entry = main.ops[name]
        entry.calls = op.calls - (less.calls if less else 0)
        entry.data_calls = op.data_calls - (less.data_calls if less else 0)
        entry.read = op.read - (less.read if less else 0)
        entry.written = op.written - (less.written if less else 0)
    return main


def figures(rounds: dict[int, Round], bytes_per_token: int, draft_bytes_per_token: int | None) -> dict[str, Any]:
    """The counted figures of a strategy for one cache class from rounds counted at two contexts (see the module
    docstring): passes per round (a decode step) and per generated token of the main cache, by phase and by op; the
    draft's passes per byte of its own cache; tokens, candidates and acceptance of the counted round."""
    lo_c, hi_c = min(rounds), max(rounds)
    lo, hi = rounds[lo_c], rounds[hi_c]
    main_delta = (hi_c - lo_c) * bytes_per_token
    slope = lambda a, b, delta: (b.total - a.total) / delta  # noqa: E731
    main_lo, main_hi = _main(lo.count), _main(hi.count)
    tokens = hi.tokens
    per_round = slope(main_lo, main_hi, main_delta)
    phases = {label: slope(_phase(lo.count, label), _phase(hi.count, label), main_delta) for label in (VERIFY, CROP)}
    phases["other"] = per_round - phases[VERIFY] - phases[CROP]
    draft_lo, draft_hi = lo.count.scope(DRAFT), hi.count.scope(DRAFT)
    draft_delta = (hi_c - lo_c) * draft_bytes_per_token if draft_bytes_per_token else None
    draft_round = slope(draft_lo, draft_hi, draft_delta) if draft_delta else None
    return {
        "contexts": [lo_c, hi_c],
        "tokens_per_round": tokens,
        "tokens_per_round_by_context": {str(lo_c): lo.tokens, str(hi_c): hi.tokens},
        "drafted_per_round": hi.drafted,
        "acceptance": (tokens - 1) / hi.drafted if hi.drafted else None,
        "passes_per_round": round(per_round, 4),
        "passes_per_token": round(per_round / tokens, 4) if tokens else None,
        "phases_per_round": {name: round(value, 4) for name, value in phases.items()},
        "by_op": op_passes(main_lo, main_hi, main_delta),
        "draft_cache": hi.draft_cache,
        "draft_passes_per_round": round(draft_round, 4) if draft_round is not None else None,
        "draft_passes_per_token": round(draft_round / tokens, 4) if draft_round is not None and tokens else None,
        "draft_by_op": op_passes(draft_lo, draft_hi, draft_delta) if draft_delta else {},
        "draft_bytes_per_context_token": round((draft_hi.total - draft_lo.total) / (hi_c - lo_c), 2),
    }
