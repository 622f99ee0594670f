"""Assisted decoding (``assisted:self:K``, ``assisted:MODEL:K``) and prompt lookup (``prompt-lookup:K``), as
``model.generate`` runs them (``assistant_model=``, ``prompt_lookup_num_tokens=``; docs/decoding.md).

A step is one assisted iteration (one stopping-criteria mark of ``_assisted_decoding``): the candidate generator drafts
K tokens (the ``draft`` phase: the draft model's own generate, its forwards and its cache's crop; for prompt lookup,
the n-gram search over the token ids), the main model verifies the last accepted token and the K candidates in one
forward (``forward``), and the main cache is cropped to the accepted ones (``crop``). Passes are per KV byte of the
main model's sequence; the draft's cache is reported beside it (``kv.traffic.<key>.draft``: the draft phase per KV
byte the draft's cache holds), never in the main denominator.

The point does not fill the cache: generate's first iteration prefills the prompt (so a draft model, which prefills
its own cache from the same token ids, sees what the main model saw); the counted iteration comes after at least one
more, in the same generate call. The prompt is a run of one token the model greedily repeats after a run of itself
(random weights have such fixed points) and, for a random draft, one the draft does not: a self-draft's and a lookup's
candidates (that token again) are all accepted, a random draft's none, the same at every context (docs/decoding.md,
"Assisted decoding")."""

from __future__ import annotations

from typing import Any, Callable

import torch

from kvcache.analysing.records.counted import DraftTraffic
from kvcache.measuring import compat
from kvcache.measuring.cachespec import CacheRequest
from kvcache.measuring.counting.traffic import active_counters, charge_methods
from kvcache.measuring.decoding.base import DRAFT, DecodingStrategy, register_strategy
from kvcache.measuring.decoding.prompts import TRIES, fixed_points, last_prediction, speculative_prompt
from kvcache.measuring.generate import GeneratePoint, StepMarks, _criteria, _without_eos, generation_config

SELF = "self"
DRAFT_SEED = 1  # a random draft's weights are not the main model's (seed 0)
ROUNDS_SLACK = 8  # iterations' worth of slots beyond the counted ones: warm-up iterations and generate's margin
CROP_REASON = "Assisted decoding requires a cache that can be cropped to restore the states after draft verification"

_DRAFTS: dict[tuple[str, str, str], tuple[Any, Any]] = {}
_COUNTED: dict[str, dict[str, Any]] = {}  # {key: the counted iteration's tokens, candidates, draft cache class}


class _DraftOnly(list):
    """A counter's active scopes while the draft runs: only ``draft`` (a self-draft's forwards are the main model's
    modules, whose scopes must not charge them to ``forward`` or a layer too)."""

    def append(self, label: str) -> None:
        if label == DRAFT:
            super().append(label)


def drafting(get_candidates: Callable[..., Any]) -> Callable[..., Any]:
    """``get_candidates`` with its ops charged to the ``draft`` phase only, in every active traffic counter."""
    def call(*args: Any, **kwargs: Any) -> Any:
        counters = active_counters()
        saved = [counter.active for counter in counters]
        for counter in counters:
            counter.active = _DraftOnly([DRAFT])
        try:
            return get_candidates(*args, **kwargs)
        finally:
            for counter, active in zip(counters, saved):
                counter.active = active
    return call


class Speculative(DecodingStrategy):
    """Assisted decoding and prompt lookup (see the module docstring)."""

    probe_last_forward = True  # the probe describes the verifying forward, not generate's prefill

    @property
    def k(self) -> int:
        return int(self.strategy.number or 1)

    def generation_options(self) -> dict[str, Any]:
        if self.strategy.family == "prompt-lookup":
            return {"prompt_lookup_num_tokens": self.k}
        return {}

    def extra_slots(self) -> int:
        return ROUNDS_SLACK * (self.k + 1)

    def unavailable(self, cache_spec: Any, session: Any) -> str | None:
        if not session.generating:
            return f"{self.name}: generate's own loop (--kv-driver generate); the loop driver has none"
        if session.settings.batch > 1:
            return f"{self.name}: generate's assisted decoding takes one sequence (--kv-batch 1)"
        reason = cache_spec_cannot_crop(cache_spec, session) or self._draft_problem(session)
        return f"{self.name}: {reason}" if reason else None

    def _draft_problem(self, session: Any) -> str | None:
        """Why the draft cannot draft here (it cannot be built; its vocabulary, where only the built config says it,
        is not the model's), or None. A preset or directory with another vocabulary never gets here: settings_from
        refuses it (kvcache.analysing.drafts)."""
        model, _ = session.model()
        try:
            draft, _ = self.draft(model, session.device.torch_device, session.settings.dtype)
        except Exception as exc:  # noqa: BLE001 - a draft that cannot be built is this key's skip, not the session's
            return f"the draft {self.strategy.draft!r} cannot be built: {compat.exception_line(exc)}"
        if draft is not None and draft.config.vocab_size != model.config.vocab_size:
            return (f"the draft {self.strategy.draft!r} has a vocabulary of {draft.config.vocab_size} tokens, the "
                    f"model {model.config.vocab_size}")
        return None

    def tokens_per_step(self, point: Any) -> float:
        """The counted iteration's accepted candidates + 1 (noted, with its candidates and the draft's cache class,
        for :meth:`add_figures`)."""
        lengths = getattr(point, "lengths", [])
        tokens = float(lengths[-1] - lengths[-2]) if len(lengths) >= 2 else 1.0
        seen = _COUNTED.setdefault(point.cache_spec.name, {"tokens": {}})
        seen["tokens"][point.context] = tokens
        seen.update(drafted=point.drafted, cache=point.draft_cache)
        return tokens

    def point(self, base: type) -> Callable[..., Any]:
        return super().point(SpeculativePoint)

    def draft(self, model: Any, device: Any, dtype: str) -> tuple[Any, Any]:
        """``(draft model, its ModelSpec)``: the model itself for ``self``, else a random-weight build (seed
        :data:`DRAFT_SEED`) of the named preset or config directory, built once per session; (None, None) for
        prompt lookup."""
        if self.strategy.family != "assisted":
            return None, None
        from kvcache.measuring.geometry import spec_from_config

        if self.strategy.draft == SELF:
            return model, spec_from_config(SELF, model.config, dtype)
        key = (self.strategy.draft, str(device), dtype)
        if key not in _DRAFTS:
            from kvcache.measuring.models import build_model

            _DRAFTS[key] = build_model(self.strategy.draft, device, dtype, seed=DRAFT_SEED)
        return _DRAFTS[key]

    def add_figures(self, counting: Any, key: str, result: Any) -> None:
        """``draft``: the draft model, its cache's class, candidates drafted and accepted in the counted step, and the
        draft phase per KV byte the draft's cache holds (assisted decoding: the ``draft`` phase's slope over the
        draft's bytes per token instead of the main model's; the same Δ context)."""
        s = counting.session
        model, mspec = s.model()
        _, dspec = self.draft(model, s.device.torch_device, s.settings.dtype)
        seen = _COUNTED.pop(key, {})
        tokens, drafted = result.tokens_per_step, seen.get("drafted")
        if len(set(seen.get("tokens", {}).values())) > 1:  # the slope would mix two different steps
            raise RuntimeError(f"{key}: the counted iteration added {seen['tokens']} tokens at the counted contexts; "
                               "passes between them would mix two different steps")
        record = DraftTraffic.of(model=self.strategy.draft, cache=seen.get("cache"), drafted=drafted,
                                 accepted=tokens - 1 if tokens else None,
                                 acceptance=(tokens - 1) / drafted if tokens and drafted else None)
        phase = (result.phases or {}).get(DRAFT)
        if phase is not None and phase.passes is not None:
            record.update(step_bytes=phase.step_bytes)
            if dspec is not None and dspec.bytes_per_token:
                ratio = mspec.bytes_per_token / dspec.bytes_per_token
                record.update(bytes_per_token=dspec.bytes_per_token, passes=phase.passes * ratio,
                              passes_per_token=phase.passes * ratio / tokens if tokens else None,
                              by_op={op: round(value * ratio, 4) for op, value in phase.by_op.items()})
        result.update(draft=record)


def cache_spec_cannot_crop(cache_spec: Any, session: Any) -> str | None:
    """The release's reason a class's cache cannot be rolled back after verification (``is_croppable`` False, or no
    ``crop``), from a one-token instance; None when it can."""
    from kvcache.measuring.cachespec import CacheRequest

    model, _ = session.model()
    dtype = next(model.parameters()).dtype
    try:
        if cache_spec.prepare is not None:
            cache_spec.prepare()
        cache = cache_spec.build(CacheRequest(model.config, 16, session.device.torch_device, dtype, 1))
    except Exception:  # noqa: BLE001 - the point itself reports a class that cannot be built
        return None
    if not hasattr(cache, "crop"):
        return f"{type(cache).__name__} has no crop ({CROP_REASON})"
    if getattr(cache, "is_croppable", True) is False:
        return f"{type(cache).__name__} cannot crop ({CROP_REASON}: transformers {compat.TRANSFORMERS})"
    return None


class _Stop:
    """The stopping criterion of an assisted generate call: at the end of every iteration it marks the step
    (``marks``), notes the sequence's length and stops after ``wanted`` iterations. Releases up to 5.2x also ask the
    criteria about the candidates, between the draft and the verifying forward (``is_done_candidate``): a call while
    ``pending`` is set (from the draft's return to the model's next forward) is that one, answered False, unmarked."""

    def __init__(self, wanted: int, lengths: list[int], marks: StepMarks) -> None:
        self.wanted, self.lengths, self.marks = wanted, lengths, marks
        self.pending = False

    def __call__(self, input_ids: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
        if self.pending:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        self.marks(input_ids, scores)
        self.lengths.append(input_ids.shape[1])
        done = len(self.lengths) - 1 >= self.wanted
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class SpeculativePoint(GeneratePoint):
    """generate's assisted decoding or prompt lookup: one step is one iteration (see the module docstring).
    ``lengths``: the sequence's length before the last generate call and after each of its iterations; ``drafted``
    and ``draft_cache``: the counted iteration's candidates and the draft's cache class."""

    lengths: list[int]
    prompt: torch.Tensor | None = None
    drafted: int | None = None
    draft_cache: str | None = None

    def _fill_synthetic(self, gen: torch.Generator, dtype: torch.dtype) -> None:
        """Nothing: generate's first iteration prefills the prompt (see the module docstring)."""

    def _fill_prefill(self, gen: torch.Generator) -> None:
        """Nothing: generate's first iteration prefills the prompt."""

    def build(self) -> SpeculativePoint:
        super().build()
        self.lengths = []
        self.input_ids = torch.tensor([self._prompt()], device=self.device.torch_device)
        self.next_ids = self.input_ids[:, -1:]
        self.prompt = self.input_ids
        return self

    def _prompt(self) -> list[int]:
        """The point's prompt (:func:`speculative_prompt`) at its context, from the first of the model's
        :func:`fixed_points` (at most :data:`TRIES`) for which it holds at that length: the model still predicts the
        token after the whole prompt (and a random draft does not); RuntimeError when none does."""
        device = self.device.torch_device
        draft, _ = self.strategy.draft(self.model, device, self.spec.dtype)
        other = draft if draft is not None and draft is not self.model else None
        length, k, accepted = self.input_ids.shape[1], self.strategy.k, self.strategy.strategy.accepted
        tried = 0
        for token in fixed_points(self.model, draft):
            ids = speculative_prompt(token, length, k, accepted, (token + 1) % self.model.config.vocab_size)
            prompt = torch.tensor([ids], device=device)
            with torch.inference_mode():
                holds = int(last_prediction(self.model, prompt)) == token and (
                    other is None or int(last_prediction(other, prompt)) != token)
            if holds:
                return ids
            tried += 1
            if tried >= TRIES:
                break
        raise RuntimeError(f"no token the model repeats after a prompt of {length} of itself (and the draft does not; "
                           f"{tried} tried): the speculative prompt cannot be built")

    def _fresh(self, iterations: int) -> None:
        """An empty cache of the class and the prompt again: generate's assisted decoding prefills the whole
        ``input_ids`` in its first iteration, whatever the cache holds, so every call starts from nothing. A
        preallocated class gets room for ``iterations`` of K + 1 tokens (a timed run's many)."""
        dtype = next(self.model.parameters()).dtype
        room = max(self.max_tokens, self.prompt.shape[1] + (iterations + 2) * (self.strategy.k + 1))
        self.max_tokens = room
        request = CacheRequest(self.model.config, room, self.device.torch_device, dtype, self.batch.size)
        self.cache = self.cache_spec.build(request)
        charge_methods(self.cache, self.strategy.cache_phases())
        self.input_ids = self.prompt
        self.position = self.context

    def timed_tokens_per_step(self) -> float | None:
        """The mean length gain of the last call's timed iterations (its last ``len(step_seconds)``, not the 1st)."""
        gains = [b - a for a, b in zip(self.lengths[1:], self.lengths[2:])][-len(self.step_seconds):]
        return sum(gains) / len(gains) if gains and self.step_seconds else None

    def timed_mean_tokens(self) -> float | None:
        """The sequence's length at the start of each timed iteration, averaged: the cache holds all of it but the
        last token, which the verifying forward feeds first (as the session counts a one-token step: the cache and
        the step's new token)."""
        starts = self.lengths[1:-1][-len(self.step_seconds):] if self.step_seconds else []
        return sum(starts) / len(starts) if starts else None

    def warm_up(self, steps: int) -> None:
        """Nothing: every generate call starts from an empty cache (:meth:`_fresh`), and the counted step of
        :meth:`count_step` comes after at least one iteration of its own call."""

    def generate(self, new_tokens: int, on_mark: Callable[[int], None] | None = None) -> StepMarks:
        """``new_tokens`` iterations of one generate call (each adds the accepted candidates + 1 tokens)."""
        self._fresh(new_tokens)
        strategy = self.strategy
        draft, _ = strategy.draft(self.model, self.device.torch_device, self.spec.dtype)
        marks = StepMarks(self.device.sync, on_mark)
        marks.hook = self.model.register_forward_pre_hook(lambda *_: marks.start())
        before = self.input_ids.shape[1]
        lengths = [before]
        own = self.model._get_candidate_generator
        seen: dict[str, Any] = {}
        stop = _Stop(new_tokens, lengths, marks)
        verifying = self.model.register_forward_pre_hook(lambda *_: setattr(stop, "pending", False))

        def candidate_generator(*args: Any, **kwargs: Any) -> Any:
            generator = own(*args, **kwargs)
            inner = drafting(generator.get_candidates)

            def get_candidates(ids: torch.Tensor, *rest: Any, **more: Any) -> Any:  # 5.0-5.2: + is_first_iteration
                out = inner(ids, *rest, **more)
                stop.pending = True  # until the verifying forward: a criteria call now is about the candidates
                seen["drafted"] = out[0].shape[1] - ids.shape[1]
                cache = getattr(generator, "assistant_kwargs", {}).get(compat.cache_keyword(draft)) if draft else None
                seen["draft_cache"] = type(cache).__name__ if cache is not None else None
                return out
            generator.get_candidates = get_candidates
            return generator

        self.model._get_candidate_generator = candidate_generator
        saved = _set_draft(draft, strategy.k) if draft is not None else {}
        config = generation_config(self.model, new_tokens * (strategy.k + 1) + strategy.k + 2,
                                   self.generation_options())
        if strategy.strategy.family == "prompt-lookup":  # up to 5.7 a lookup without an end-of-sequence token fails
            config.eos_token_id = (int(self.prompt[0, -1]) + 2) % self.model.config.vocab_size  # one never proposed
        extra = {"assistant_model": draft} if draft is not None else {}
        try:
            with torch.inference_mode(), _without_eos(self.model):
                out = self.model.generate(input_ids=self.input_ids, attention_mask=torch.ones_like(self.input_ids),
                                          generation_config=config,
                                          stopping_criteria=_criteria([stop]),
                                          **{compat.cache_keyword(self.model): self.cache}, **extra)
        finally:
            vars(self.model).pop("_get_candidate_generator", None)
            verifying.remove()
            if marks.hook is not None:
                marks.hook.remove()
            for name, value in saved.items():
                setattr(draft.generation_config, name, value)
        if marks.ends != new_tokens:
            raise RuntimeError(f"generate ran {marks.ends} assisted iterations for {new_tokens}")
        self.lengths, self.drafted, self.draft_cache = lengths, seen.get("drafted"), seen.get("draft_cache")
        self.generated.append(out[:, before:])
        self.input_ids, self.next_ids = out, out[:, -1:]
        self.position += out.shape[1] - before
        return marks


def _set_draft(draft: Any, k: int) -> dict[str, Any]:
    """K draft tokens every iteration, never fewer (no schedule, no confidence stop); the settings replaced."""
    wanted = {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
              "assistant_confidence_threshold": 0.0}
    own = draft.generation_config
    before = {name: getattr(own, name, None) for name in wanted}
    for name, value in wanted.items():
        setattr(own, name, value)
    return before


def register() -> None:
    register_strategy("assisted", Speculative)
    register_strategy("prompt-lookup", Speculative)
