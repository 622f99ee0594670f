"""Beam search (``beam:N``): N beams per sequence, the cache reordered after every step
(``Cache.reorder_cache(beam_idx)``: ``index_select`` over every beam's whole cache, per layer, K and V).

Under ``--kv-driver generate`` the step is generate's own (``GenerationConfig(num_beams=N)``: ``_beam_search``, its
``reorder_cache`` call included); under the loop driver it is the suite's own loop doing what generate does to the
cache: one forward over the N beams, then ``cache.reorder_cache(beam_idx)`` with a fixed permutation of the beams
(no scoring: the bytes of ``index_select`` do not depend on which beams it picks). Passes are per KV byte all beams
hold; the reorder's ops are the ``reorder`` phase."""

from __future__ import annotations

from typing import Any, Callable

import torch

from kvcache.measuring import compat
from kvcache.measuring.decode import DecodePoint
from kvcache.measuring.decoding.base import DecodingStrategy, register_strategy
from kvcache.measuring.generate import GeneratePoint


class Beam(DecodingStrategy):
    family = "beam"

    @property
    def beams(self) -> int:
        return int(self.strategy.number or 2)

    def rows(self) -> int:
        return self.beams

    def generation_options(self) -> dict[str, Any]:
        return {"num_beams": self.beams, "num_return_sequences": 1, "early_stopping": False, "length_penalty": 1.0}

    def unavailable(self, cache_spec: Any, session: Any) -> str | None:
        reason = super().unavailable(cache_spec, session)
        if reason:
            return reason
        if session.settings.ragged:
            return f"{self.name}: not with --kv-ragged (every beam of a sequence holds the same tokens)"
        return None

    def point(self, base: type) -> Callable[..., Any]:
        own = BeamGeneratePoint if issubclass(base, GeneratePoint) else BeamLoopPoint
        return super().point(own)


def reorder(cache: Any, beam_idx: torch.Tensor) -> None:
    """``cache.reorder_cache(beam_idx)`` as generate calls it, or :class:`compat.Unsupported` naming the class when
    it has none."""
    method = getattr(cache, "reorder_cache", None)
    if method is None:
        raise compat.release_lacks(f"reorder_cache on {type(cache).__name__} (beam search)")
    method(beam_idx)


class BeamLoopPoint(DecodePoint):
    """The suite's loop under beam search: each step one forward over every beam (``batch.size`` rows: the
    sequences × N), then the cache reordered by a fixed permutation of each sequence's beams (the next beam's
    row: what generate's reorder copies, whichever beams it picks)."""

    strategy: Any = None
    beam_idx: torch.Tensor | None = None

    def build(self) -> BeamLoopPoint:
        super().build()
        beams = self.strategy.beams if self.strategy is not None else 1
        rows = torch.arange(self.batch.size).view(-1, beams)
        self.beam_idx = rows.roll(1, dims=1).reshape(-1).to(self.device.torch_device)
        return self

    def step(self) -> torch.Tensor:
        logits = super().step()
        with torch.inference_mode():
            reorder(self.cache, self.beam_idx)
        return logits

    def release(self) -> None:
        super().release()
        self.beam_idx = None


class BeamGeneratePoint(GeneratePoint):
    """generate's beam search: the prompt is one row per sequence (generate expands it to its beams), the cache
    holds every beam's row."""

    def build(self) -> BeamGeneratePoint:
        super().build()
        beams = self.strategy.beams if self.strategy is not None else 1
        self.input_ids = self.input_ids[::beams]
        return self


def register() -> None:
    register_strategy("beam", Beam)
