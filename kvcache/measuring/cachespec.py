"""The plug-in records of the cache registry: what a cache factory gets (:class:`CacheRequest`), what a registered
cache class is (:class:`CacheSpec`) and what a class raises when it cannot run here (:class:`Unsupported`). Plain
data, standard library only, imported by the registry (:mod:`kvcache.measuring.caches`), the compat layer and the
decode step that builds caches, so that none of them depends on another. Users import them from
:mod:`kvcache.caches`."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

#: The layer kinds a class may declare it serves (``kinds``), as :data:`kvcache.measuring.geometry.KINDS` names them.
LAYER_KINDS = ("full", "sliding", "linear")


class Unsupported(RuntimeError):
    """The installed Transformers release, a package or the machine cannot provide a cache class or feature; the
    message is the skip reason. Raise it from a class's ``prepare`` (or ``build``) to be skipped with that reason;
    the compat layer (:mod:`kvcache.measuring.compat`) raises it for what a release lacks."""


@dataclass(frozen=True)
class CacheRequest:
    """What a cache factory (``CacheSpec.build``) gets, for one decode point.

    ``config``: the model's Transformers config (``PretrainedConfig``: layers, KV heads, head size, layer types);
    ``max_tokens``: the tokens each sequence's row must hold (the point's context, its warm-up and timed or counted
    steps, and a margin: :func:`kvcache.measuring.decode.tokens_needed`); ``device``: the ``torch.device`` the
    cache lives on; ``dtype``: the ``torch.dtype`` of K and V (``--kv-dtype``); ``batch``: sequences per step
    (``--kv-batch``), the rows of a preallocated buffer (a factory that ignores it still works at batch 1).
    """

    config: Any
    max_tokens: int
    device: Any
    dtype: Any
    batch: int = 1


@dataclass(frozen=True)
class CacheSpec:
    """A registered cache class; every field but ``name`` and ``build`` is a keyword of ``register_cache``.

    ``name``: the class's name in ``--kv-caches``, records and baselines (no ``@``: that separates a class from its
    attention implementation, ``dynamic@eager``);
    ``build``: ``build(request: CacheRequest)`` returns a fresh, empty cache;
    ``description``: one line saying what the class is;
    ``attention``: the attention implementation the model runs with for this class (a name Transformers' attention
    registry knows; default ``"sdpa"``);
    ``prepare`` (optional): called with no argument before the class is used; whatever it raises skips the class
    with the reason (:class:`Unsupported`: its message; ``ImportError``: the missing package named; anything else:
    named with its type; see ``kvcache.measuring.caches.cache_unavailable_reason``);
    ``devices``: the device types (``torch.device.type``: ``"cpu"``, ``"cuda"``...) the class runs on; None: any;
    elsewhere it is skipped with the reason;
    ``memory_factor``: the cache sizes a step holds at its peak, in units of the logical KV bytes of the point's
    ``max_tokens`` × batch (2 for a class that copies on append): a point whose cache would not fit in free memory
    is skipped before it is built, and the measured peak is checked against it;
    ``in_all``: whether ``--kv-caches all`` includes the class (test-only classes say False);
    ``kinds``: the layer kinds it can serve (``"full"``, ``"sliding"``, ``"linear"``); None: any; a model with
    layers of another kind skips it with the reason (:func:`kvcache.measuring.caches.kind_reason`);
    ``point`` (optional): a class that brings its own decode point instead of
    :class:`~kvcache.measuring.decode.DecodePoint`: a factory called with DecodePoint's constructor arguments
    (``model, spec, cache_spec, device, context, max_tokens``, keywords ``fill``, ``seed``) and ``batch=``
    (a :class:`~kvcache.measuring.batch.BatchShape`), returning an object with DecodePoint's interface (``build()``
    returning itself, ``step``, ``before_step``, ``timed_step``, ``warm_up``, ``release``, ``cache``, ``position``,
    ``step_seconds``). :func:`kvcache.measuring.decode.open_point` opens such a class's points with it; the point
    drives the model itself, so ``build`` serves only callers that want a bare cache from a :class:`CacheRequest`
    (it may raise :class:`Unsupported`), and ``attention`` names what the point runs under;
    ``pads``: True when a batch's shorter sequences are left-padded to the longest in this class's cache (passes
    are then also reported per allocated byte, padding included); False when each sequence holds only its own
    tokens (a paged pool), where passes per allocated byte are passes per live byte;
    ``fill_context`` (optional): for a class that hooks the model (a kvpress press): ``fill_context(model)`` returns
    a context manager entered around the point's real prefill (the forward over the context), e.g.
    ``lambda model: press(model)``; it implies ``needs_prefill``;
    ``decode_context`` (optional): ``decode_context(model)`` returns a context manager entered before the point's
    first decode step and left when the point is released: every warm-up, counted and timed step runs inside it (a
    press that works while decoding);
    ``needs_prefill``: the class is filled by a real prefill whatever ``--kv-fill`` says (a synthetic fill writes
    K/V without running the model, so hooks would never see the context); the record says so (``fill``).
    A hook that raises, returns no context manager or changes the model's weights is a one-line error naming the
    class (:mod:`kvcache.measuring.hooks`); ``--kv-driver generate`` and ``--kv-compile`` skip a class that hooks
    the model, with the reason.
    ``period`` (optional): the class does part of its work every N decode steps (a quantized cache flushing its
    residual every ``residual_length`` tokens, a compression every N steps, a window's rollover): an int N, or a
    function of the model's config returning N (None or 1: no period); its counted passes are then amortised over a
    window of N counted steps (docs/how-it-measures.md, "Work done every N steps").
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
    fill_context: Callable[[Any], Any] | None = None
    decode_context: Callable[[Any], Any] | None = None
    needs_prefill: bool = False
    period: int | Callable[[Any], int | None] | None = None

    def __post_init__(self) -> None:
        """Every field checked at registration: a bad one is a one-line ValueError naming the class, the argument
        and what it accepts (a NaN ``memory_factor`` would turn the peak check off, a text one fail mid-run)."""
        problem = spec_problem(self)
        if problem:
            raise ValueError(f"register_cache({self.name!r}): {problem}")
        for name in ("devices", "kinds"):  # a list given is kept as a tuple (the spec is frozen and hashable)
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.fill_context is not None:  # hooks around a prefill: a synthetic fill would never run them
            object.__setattr__(self, "needs_prefill", True)


def spec_problem(spec: CacheSpec) -> str | None:
    """What is wrong with one of ``spec``'s fields, one line naming it, its value and what it accepts; None."""
    def strings(value: Any) -> bool:
        return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, str) and v for v in value)

    factor = spec.memory_factor
    checks = [
        ("name", isinstance(spec.name, str) and spec.name.strip() != "", "a non-empty text"),
        ("build", callable(spec.build), "a function build(request: CacheRequest) -> cache"),
        ("description", isinstance(spec.description, str), "a text"),
        ("attention", isinstance(spec.attention, str) and spec.attention.strip() != "",
         "the name of an attention implementation (sdpa, eager, ...)"),
        ("prepare", spec.prepare is None or callable(spec.prepare), "None or a function of no argument"),
        ("devices", spec.devices is None or strings(spec.devices),
         "None (any device) or a non-empty tuple of device types, e.g. ('cuda',)"),
        ("memory_factor", isinstance(factor, numbers.Real) and not isinstance(factor, bool)
         and math.isfinite(factor) and factor > 0,
         "a finite number above 0: the cache sizes a step holds at its peak (2 for a class that copies on append)"),
        ("in_all", isinstance(spec.in_all, bool), "True or False"),
        ("kinds", spec.kinds is None or (strings(spec.kinds) and set(spec.kinds) <= set(LAYER_KINDS)),
         f"None (any) or a non-empty tuple of {', '.join(LAYER_KINDS)}"),
        ("point", spec.point is None or callable(spec.point), "None or a factory of decode points"),
        ("pads", isinstance(spec.pads, bool), "True or False"),
        ("fill_context", spec.fill_context is None or callable(spec.fill_context),
         "None or a function model -> context manager entered around the prefill"),
        ("decode_context", spec.decode_context is None or callable(spec.decode_context),
         "None or a function model -> context manager entered around the decode steps"),
        ("needs_prefill", isinstance(spec.needs_prefill, bool), "True or False"),
        ("period", spec.period is None or callable(spec.period) or period_problem(spec.period) is None,
         f"None, a whole number of decode steps from 1 to {MAX_PERIOD}, or a function of the model's config "
         "returning one"),
    ]
    for name, good, accepted in checks:
        if not good:
            return f"{name} {getattr(spec, name)!r} is not accepted; give {accepted}"
    return None


MAX_PERIOD = 4096  # decode steps: a longer period would count more steps than any context the suite fills


def period_problem(value: Any) -> str | None:
    """What is wrong with a period (decode steps), or None: a whole number from 1 to :data:`MAX_PERIOD`, or None."""
    if value is None or (isinstance(value, numbers.Integral) and not isinstance(value, bool)
                         and 1 <= value <= MAX_PERIOD):
        return None
    return f"period {value!r} is not accepted; give a whole number of decode steps from 1 to {MAX_PERIOD}, or None"


def period_steps(spec: CacheSpec, config: Any) -> int | None:
    """The class's period in decode steps for a model of ``config`` (``spec.period``, called with the config when a
    function); None when it has none (or 1); a bad value is a one-line ValueError naming the class."""
    value = spec.period(config) if callable(spec.period) else spec.period
    problem = period_problem(value)
    if problem:
        raise ValueError(f"register_cache({spec.name!r}): {problem} (returned for {type(config).__name__})")
    return value if value and value > 1 else None


class EntryPoints:
    """The installed entry points of one ``group`` (``kvcache_passes.caches``, ``kvcache_passes.attention``), loaded
    once per process (:meth:`load`), what each names passed to ``use``. One that fails to load stops nothing: it is
    kept in :attr:`problems` and named where its name would have been looked up (:meth:`failed`)."""

    def __init__(self, group: str, use: Callable[[Any], None]) -> None:
        self.group = group
        self.use = use
        self.loaded = False
        self.problems: list[str] = []

    def load(self) -> list[str]:
        """Load the group's entry points the first time (later calls do nothing); one line per entry point that
        failed."""
        if self.loaded:
            return []
        self.loaded = True
        from importlib.metadata import entry_points

        try:
            found = entry_points(group=self.group)
        except TypeError:  # Python 3.9
            found = entry_points().get(self.group, [])
        problems = []
        for ep in found:
            try:
                self.use(ep.load())
            except Exception as exc:  # noqa: BLE001
                problems.append(f"entry point {ep.name!r} ({ep.value}): {type(exc).__name__}: {exc}")
        self.problems.extend(problems)
        return problems

    def failed(self) -> str:
        """``" (failed to load: <problem>; <problem>)"``, the end of an unknown-name error naming the entry points
        that failed; ``""`` when none did."""
        return f" (failed to load: {'; '.join(self.problems)})" if self.problems else ""
