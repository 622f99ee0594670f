"""What a cache factory gets (:class:`CacheRequest`) and what a registered cache class is (:class:`CacheSpec`): plain
data, imported by the registry (:mod:`kvcache.measuring.caches`) and by the decode step that builds caches, so that
neither depends on the other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class CacheRequest:
    """What a cache factory gets: the model config, the tokens each sequence's row must hold, where, in what dtype,
    and the sequences per step (``--kv-batch``; rows of a preallocated buffer)."""

    config: Any
    max_tokens: int
    device: Any
    dtype: Any
    batch: int = 1


@dataclass(frozen=True)
class CacheSpec:
    """A registered cache class.

    ``build`` returns a fresh, empty cache for a :class:`CacheRequest`; ``prepare`` (optional) runs
    before use, and anything it raises skips the class with the reason (:func:`unavailable_reason`);
    ``attention`` is the attention implementation the model runs with for this class;
    ``memory_factor`` is the cache sizes a step holds at its peak (2 for a class that copies on append);
    ``kinds`` the layer kinds it can serve (``full``, ``sliding``, ``linear``; None: any), so that a model with
    layers of another kind skips it with the reason (:func:`kind_reason`);
    ``pads``: a batch's shorter sequences are left-padded to the longest in this class's cache (False: each holds
    only its own tokens, as in a paged pool), so passes per allocated byte differ from passes per live byte;
    ``point`` (optional) a class that brings its own decode point instead of
    :class:`~kvcache.measuring.decode.DecodePoint`: a factory called with DecodePoint's constructor arguments
    (``model, spec, cache_spec, device, context, max_tokens``, keywords ``fill``, ``seed``) and ``batch=``
    (a :class:`~kvcache.measuring.batch.BatchShape`), returning an object with DecodePoint's interface (``build()``
    returning itself, ``step``, ``before_step``, ``timed_step``, ``warm_up``, ``release``, ``cache``, ``position``,
    ``step_seconds``). :func:`kvcache.measuring.decode.open_point` opens such a class's points with it; the point
    drives the model itself, so ``build`` serves only callers that want a bare cache from a :class:`CacheRequest`
    (it may raise :class:`compat.Unsupported`), and ``attention`` names what the point runs under.
    """

    name: str
    build: Callable[[CacheRequest], Any]
    description: str = ""
    attention: str = "sdpa"
    prepare: Callable[[], None] | None = None
    devices: tuple[str, ...] | None = None
    memory_factor: float = 2.0
    in_all: bool = True
    kinds: tuple[str, ...] | None = None
    point: Callable[..., Any] | None = None
    pads: bool = True


def run_entry_points(group: str, use: Callable[[Any], None]) -> list[str]:
    """Load every installed entry point of ``group`` and pass what it names to ``use``; one line per entry point
    that failed (a broken plug-in must not stop the suite: it is named where its name would be looked up)."""
    from importlib.metadata import entry_points

    try:
        found = entry_points(group=group)
    except TypeError:  # Python 3.9
        found = entry_points().get(group, [])
    problems = []
    for ep in found:
        try:
            use(ep.load())
        except Exception as exc:  # noqa: BLE001
            problems.append(f"entry point {ep.name!r} ({ep.value}): {type(exc).__name__}: {exc}")
    return problems
