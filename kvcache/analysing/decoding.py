"""Decoding strategies as names (``--kv-decoding``): their forms, their parse, and the record keys they make. A class
decoded greedily keeps its key (``dynamic``, ``static@eager``); under any other strategy its key gains
``#<strategy>`` (``dynamic#beam:4``, ``static@eager#beam:4``), so the strategy is part of every record and baseline
key. What a strategy does and counts lives in the measuring wing (:mod:`kvcache.measuring.decoding`). Stdlib only;
docs/decoding.md."""

from __future__ import annotations

import re
from dataclasses import dataclass

STRATEGY_SEPARATOR = "#"  # <cache>[@<attention>]#<strategy>
GREEDY = "greedy"
#: The accepted forms, in the words every usage error gives.
FORMS = ("greedy (default), beam:N (N >= 2), assisted:self:K or assisted:MODEL:K (a preset or config directory as "
         "the draft; K >= 1 draft tokens), prompt-lookup:K or prompt-lookup:K:P (K >= 1 lookup tokens, P the share of "
         "them accepted, a multiple of 1/K from 0 to 1; default 1), chunked-prefill:C (1 <= C <= the smallest "
         "context)")
#: The phases a non-greedy step's counted bytes are split into (``kv.traffic.<key>.phases``): the model's forward, a
#: beam reorder (``reorder_cache``), a speculative ``crop``, a draft model's own work, and ``other``: every op charged
#: to none of them (generate's own per-step work: its token ids, scores and masks).
PHASES = ("forward", "reorder", "crop", "draft", "other")
FAMILIES = ("greedy", "beam", "assisted", "prompt-lookup", "chunked-prefill")
_WHOLE = re.compile(r"^[0-9]+$")


class DecodingError(ValueError):
    """A ``--kv-decoding`` value naming no strategy, or with a bad number; one line."""


@dataclass(frozen=True)
class Strategy:
    """One parsed strategy: ``family`` (:data:`FAMILIES`), ``number`` (beams N, draft tokens K, chunk tokens C; None
    for greedy), ``draft`` (``assisted``: ``self`` or a model name) and ``share`` (``prompt-lookup``: the share of the
    K looked-up tokens the model accepts, a multiple of 1/K; None for all of them). ``name`` is its canonical text,
    the key's suffix (``prompt-lookup:4`` for a share of 1, ``prompt-lookup:4:0.5``)."""

    family: str
    number: int | None = None
    draft: str | None = None
    share: float | None = None

    @property
    def name(self) -> str:
        if self.family == GREEDY:
            return GREEDY
        if self.family == "assisted":
            return f"assisted:{self.draft}:{self.number}"
        if self.share is not None:
            return f"{self.family}:{self.number}:{self.share:g}"
        return f"{self.family}:{self.number}"

    @property
    def accepted(self) -> int | None:
        """``prompt-lookup``: how many of the K looked-up tokens the model accepts each step (K for a share of 1)."""
        if self.family != "prompt-lookup" or self.number is None:
            return None
        return round((1.0 if self.share is None else self.share) * self.number)

    @property
    def greedy(self) -> bool:
        return self.family == GREEDY


def _bad(text: str, why: str) -> DecodingError:
    return DecodingError(f"--kv-decoding {text!r}: {why}; accepted: {FORMS}")


def _count_of(text: str, part: str, what: str, low: int) -> int:
    if not _WHOLE.match(part):
        raise _bad(text, f"{what} {part!r} is not a whole number")
    value = int(part)
    if value < low:
        raise _bad(text, f"{what} {value} is below {low}")
    return value


def _share_of(text: str, part: str, k: int) -> float:
    """The accepted share P of ``prompt-lookup:K:P`` (``0.5`` or ``50%``): a multiple of 1/K from 0 to 1, as a whole
    number of accepted tokens; anything else is a one-line :class:`DecodingError` naming the shares K allows."""
    allowed = ", ".join(f"{a / k:g}" for a in range(k + 1))
    try:
        share = float(part[:-1]) / 100 if part.endswith("%") else float(part)
    except ValueError:
        raise _bad(text, f"share {part!r} is not a number (for {k} lookup tokens: {allowed})") from None
    accepted = share * k
    if not 0 <= share <= 1 or abs(accepted - round(accepted)) > 1e-4:  # 1e-4: `:g` keeps 6 digits of 1/3
        raise _bad(text, f"share {part!r} is not a whole number of the {k} lookup tokens (for {k}: {allowed})")
    return round(accepted) / k


def parse_strategy(text: str, contexts: tuple[int, ...] = ()) -> Strategy:
    """``"beam:4"`` -> ``Strategy("beam", 4)``; an unknown form or a bad number is a one-line :class:`DecodingError`.
    ``contexts`` (tokens): a chunk larger than the smallest of them is an error (that point would not be chunked)."""
    text = str(text).strip()
    family, _, rest = text.partition(":")
    if family == GREEDY and not rest:
        return Strategy(GREEDY)
    if family == "beam" and rest:
        return Strategy("beam", _count_of(text, rest, "beams", 2))
    if family == "prompt-lookup" and rest:
        k, _, share = rest.partition(":")
        k = _count_of(text, k, "lookup tokens", 1)
        share = _share_of(text, share, k) if share else None
        return Strategy("prompt-lookup", k, share=None if share == 1 else share)  # 1: the plain key
    if family == "chunked-prefill" and rest:
        chunk = _count_of(text, rest, "chunk", 1)
        if contexts and chunk > min(contexts):
            raise _bad(text, f"chunk {chunk} is larger than the context {min(contexts)} (that prefill would be one "
                             "chunk)")
        return Strategy("chunked-prefill", chunk)
    if family == "assisted" and rest:
        draft, _, k = rest.rpartition(":")
        if not draft:
            raise _bad(text, "assisted needs a draft and a number of draft tokens")
        return Strategy("assisted", _count_of(text, k, "draft tokens", 1), draft)
    raise _bad(text, "unknown strategy")


def parse_decoding(text: str, contexts: tuple[int, ...] = ()) -> tuple[str, ...]:
    """``"greedy,beam:4"`` -> canonical names, each once, in order; empty or a bad one is a one-line
    :class:`DecodingError`."""
    parts = [part.strip() for part in str(text).split(",") if part.strip()]
    if not parts:
        raise DecodingError(f"--kv-decoding {text!r} names no strategy; accepted: {FORMS}")
    return tuple(dict.fromkeys(parse_strategy(part, contexts).name for part in parts))


def strategy_key(cache: str, strategy: str) -> str:
    """The record key of ``cache`` (a class, or ``<class>@<attention>``) decoded by ``strategy``: itself for greedy,
    else ``cache#strategy``."""
    return cache if strategy == GREEDY else f"{cache}{STRATEGY_SEPARATOR}{strategy}"


def split_strategy(key: str) -> tuple[str, str]:
    """``"static@eager#beam:4"`` -> ``("static@eager", "beam:4")``; a key without ``#`` -> ``(key, "greedy")``. A
    class name never holds ``#`` (``register_cache`` refuses it)."""
    cache, sep, strategy = str(key).partition(STRATEGY_SEPARATOR)
    return (cache, strategy) if sep else (cache, GREEDY)


def strategy_of(key: str) -> Strategy:
    """The parsed strategy of a record key (greedy for a plain key); DecodingError for a suffix naming none."""
    return parse_strategy(split_strategy(key)[1])


def cross_strategies(caches: tuple[str, ...] | list[str], strategies: tuple[str, ...] | list[str]) -> list[str]:
    """Every key under every strategy, key by key (``--kv-attn``'s crossing, then this), each once; a
    ``--kv-caches`` entry that already names its strategy (``dynamic#beam:4``) is kept as it is."""
    out = [cache if STRATEGY_SEPARATOR in cache else strategy_key(cache, strategy)
           for cache in caches for strategy in strategies]
    return list(dict.fromkeys(out))


def summary_lines(traffic: dict, memory: dict) -> list[str]:
    """The summary's lines of the keys decoded other than greedily (``kv.traffic``: {key: Traffic}): passes per
    step and per generated token, then by phase, each named by op; the memory the step left in new storage
    (``kv.memory``: a reallocated cache); the chunked prefill's figures."""
    from kvcache.analysing.tables import by_op, num

    out = []
    for key, t in traffic.items():
        if getattr(t, "strategy", None) is None:
            continue
        phases = "; ".join(f"{name} {num(p.passes, '.2f')} ({by_op(p.by_op)})" for name, p in (t.phases or {}).items())
        rows = f"all {t.rows} sequences" if (t.rows or 1) > 1 else "the sequences"
        out.append(f"decoding {key}: {num(t.passes, '.3f')} passes a step, {num(t.passes_per_token, '.3f')} per "
                   f"generated token ({num(t.tokens_per_step, 'g')} a step), per KV byte {rows} hold"
                   f"{': ' + phases if phases else ''}")
        m, plain = memory.get(key), memory.get(split_strategy(key)[0])
        if m is not None and m.held_new_passes is not None:
            was = f" ({split_strategy(key)[0]}: {num(plain.held_new_passes, '.2f')})" if plain is not None else ""
            out.append(f"decoding {key} memory: allocates {num(m.allocated_passes, '.2f')} "
                       f"({by_op(m.allocated_by_op)}); leaves {num(m.held_new_passes, '.2f')} of the "
                       f"{num(m.held_passes, '.2f')} it holds in storage the step made{was}")
        p = t.prefill
        if p is not None:
            if p.passes is None:
                out.append(f"prefill {key}: {p.error}")
                continue
            out.append(f"prefill {key}: {p.context} tokens in {p.chunks} chunks of {p.chunk} move "
                       f"{num(p.passes, '.2f')} passes per KV byte they leave, {num(p.unchunked_passes, '.2f')} in one "
                       f"forward; chunking adds {num(p.extra_passes, '.2f')} = {by_op(p.extra_by_op)}")
    return out
