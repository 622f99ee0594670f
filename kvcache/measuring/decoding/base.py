"""The strategy base class and the registry of families (:mod:`kvcache.measuring.decoding`)."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from kvcache.analysing import decoding as names
from kvcache.analysing.decoding import Strategy

#: The phases counted bytes are split into (:data:`kvcache.analysing.decoding.PHASES`; ``FORWARD`` is the traffic
#: counter's scope of the model's forward).
REORDER, CROP, DRAFT, OTHER = names.PHASES[1:]


class DecodingStrategy:
    """One strategy of a family, as the session runs it on a point. The base class is greedy decoding: one sequence
    per ``--kv-batch`` row, the session's own point, one token a step, nothing to skip. A family overrides what
    differs; every method has the session (:class:`kvcache.measuring.session.KVSession`) or the point at hand."""

    family: ClassVar[str] = names.GREEDY
    #: What the attention probe (``kv.probe.<key>``) describes: False, every attention call of one more step (one
    #: forward: greedy, beam search, chunked prefill); True, the model's last forward of the counted step, in a
    #: generate call like the counted one (a speculative iteration's verifying forward, not generate's prefill of the
    #: prompt nor the draft's forwards: :func:`kvcache.measuring.counting.probe.probe_last_forward`).
    probe_last_forward: ClassVar[bool] = False

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy

    @property
    def name(self) -> str:
        """The canonical name, the record key's suffix (``beam:4``)."""
        return self.strategy.name

    def rows(self) -> int:
        """Sequences the point's cache holds per ``--kv-batch`` sequence (beam search: its N beams): the counted
        passes are per KV byte all of them hold."""
        return 1

    def unavailable(self, cache_spec: Any, session: Any) -> str | None:
        """Why ``cache_spec``'s class cannot be decoded this way here (the release's reason, the driver's), or None.
        The session skips the key with it (recorded), never fails. By default: a class that brings its own decode
        point (``paged``: continuous batching's pool) is not decoded by any strategy but greedy."""
        if cache_spec.point is not None and not self.strategy.greedy:
            return (f"{cache_spec.name}: the class steps the model its own way (its own point, not generate's "
                    f"loop), which decoding {self.name} does not drive")
        return None

    def generation_options(self) -> dict[str, Any]:
        """Fields of the ``GenerationConfig`` the generate driver builds (``num_beams``, ``prefill_chunk_size``,
        ``prompt_lookup_num_tokens``, ``assistant_model`` ...), over its greedy defaults."""
        return {}

    def cache_phases(self) -> dict[str, str]:
        """Methods of the point's cache whose ops are charged to a phase (:data:`PHASES`): ``{method: phase}``. The
        point wraps them on the cache it builds (:func:`kvcache.measuring.counting.traffic.charge_methods`)."""
        return {"reorder_cache": REORDER, "crop": CROP}

    def scopes(self, session: Any) -> dict[Any, str]:
        """Modules whose ops are charged to a phase besides the model's forward (a draft model: ``{draft:
        "draft"}``)."""
        return {}

    def extra_slots(self) -> int:
        """Slots a step may write beyond one token (a speculative step writes up to K + 1): the point's
        preallocated caches are built that much larger."""
        return 0

    def tokens_per_step(self, point: Any) -> float:
        """Tokens each sequence gained by the counted step (1 for greedy and beam search; accepted + 1 for a
        speculative step): passes per generated token are passes per step over this."""
        return 1.0

    def point(self, base: type) -> Callable[..., Any]:
        """The point factory the session opens this strategy's points with, given the session's own point type
        (``DecodePoint`` for the loop driver, ``GeneratePoint`` for generate): by default that type, with this
        strategy attached (``point.strategy``), which is how the point learns :meth:`generation_options`,
        :meth:`cache_phases` and :meth:`extra_slots`."""
        def make(*args: Any, **kwargs: Any) -> Any:
            dp = base(*args, **kwargs)
            dp.strategy = self
            return dp
        return make

    def add_figures(self, counting: Any, key: str, result: Any) -> None:
        """After the step is counted (``result``: the key's :class:`~kvcache.analysing.records.counted.Traffic`),
        add what this strategy measures besides (chunked prefill: ``prefill``)."""


_STRATEGIES: dict[str, Callable[[Strategy], DecodingStrategy]] = {}


def register_strategy(family: str, factory: Callable[[Strategy], DecodingStrategy]) -> None:
    """Register the family ``family`` (one of :data:`kvcache.analysing.decoding.FAMILIES`): ``factory(strategy)``
    returns the :class:`DecodingStrategy` of one parsed :class:`Strategy`. A later registration replaces an earlier
    one (the speculative families replace their placeholders)."""
    if family not in names.FAMILIES:
        raise ValueError(f"decoding family {family!r} is not one of {', '.join(names.FAMILIES)} "
                         "(kvcache.analysing.decoding.FAMILIES)")
    _STRATEGIES[family] = factory


class Unregistered(DecodingStrategy):
    """A family no module registered (yet): every class is skipped with that reason."""

    def unavailable(self, cache_spec: Any, session: Any) -> str | None:
        return f"decoding {self.name}: not measured by this version of the suite (no strategy registered for " \
               f"{self.strategy.family!r})"
