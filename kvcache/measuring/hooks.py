"""Classes that hook the model, not only the cache (a kvpress press: forward hooks on every attention module): a
class's ``fill_context(model)`` entered around its point's real prefill, its ``decode_context(model)`` around the
decode steps (counted and timed), each checked: one that raises, returns no context manager or changes the model's
weights is a one-line :class:`HookError` naming the class. docs/cache-classes.md ("Classes that hook the model")."""

from __future__ import annotations

import contextlib
import sys
import weakref
from typing import Any, Callable

from kvcache.measuring.cachespec import CacheSpec


class HookError(ValueError):
    """A class's ``fill_context`` or ``decode_context`` that raised, returned no context manager or changed the
    model's weights; the message is one line naming the class."""


def fill_of(cache_spec: CacheSpec, fill: str) -> str:
    """The fill a point of ``cache_spec`` gets under ``--kv-fill fill``: ``prefill`` for a class that declares
    ``needs_prefill`` (a synthetic fill never runs the model's forward, so its hooks would never see the context),
    else ``fill``."""
    return "prefill" if cache_spec.needs_prefill else fill


def hooks_model(cache_spec: CacheSpec) -> bool:
    """Whether the class hooks the model (a ``fill_context`` or a ``decode_context``)."""
    return cache_spec.fill_context is not None or cache_spec.decode_context is not None


def fingerprint(model: Any) -> tuple[Any, ...]:
    """A cheap fingerprint of the model's parameters: name, storage address, shape, dtype and version counter (bumped
    by every in-place write) of each; it changes when a parameter is added, removed, replaced or written."""
    return tuple((name, p.data_ptr(), tuple(p.shape), str(p.dtype), p._version)
                 for name, p in model.named_parameters())


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def opened(cache_spec: CacheSpec, which: str, model: Any) -> contextlib.AbstractContextManager[Any]:
    """``cache_spec.<which>(model)``, checked: a context manager, or :class:`HookError`."""
    make: Callable[[Any], Any] = getattr(cache_spec, which)
    try:
        manager = make(model)
    except Exception as exc:  # noqa: BLE001
        raise HookError(f"cache class {cache_spec.name!r}: {which}(model) raised {_first_line(exc)}") from None
    if not (hasattr(manager, "__enter__") and hasattr(manager, "__exit__")):
        raise HookError(f"cache class {cache_spec.name!r}: {which}(model) returned {type(manager).__name__}, not a "
                        "context manager (give a function model -> context manager, e.g. lambda m: press(m))")
    return manager


@contextlib.contextmanager
def entered(cache_spec: CacheSpec, which: str, model: Any) -> Any:
    """Inside ``cache_spec.<which>(model)`` when the class has one (else nothing), the model's weights checked
    unchanged on the way out."""
    if getattr(cache_spec, which) is None:
        yield
        return
    manager = opened(cache_spec, which, model)
    before = fingerprint(model)
    try:
        manager.__enter__()
    except Exception as exc:  # noqa: BLE001
        raise HookError(f"cache class {cache_spec.name!r}: entering {which}(model) raised {_first_line(exc)}") \
            from None
    try:
        yield
    except BaseException:
        if not manager.__exit__(*sys.exc_info()):
            raise
    else:
        manager.__exit__(None, None, None)
    check_weights(cache_spec, which, model, before)


def check_weights(cache_spec: CacheSpec, which: str, model: Any, before: tuple[Any, ...]) -> None:
    """:class:`HookError` when the model's parameters changed since ``before`` (:func:`fingerprint`)."""
    after = fingerprint(model)
    if after != before:
        changed = next((b[0] for a, b in zip(after, before) if a != b), None) or "the set of parameters"
        raise HookError(f"cache class {cache_spec.name!r}: {which}(model) changed the model's weights ({changed}); "
                        "a class may hook the model, never change it")


class DecodeHold:
    """A point's ``decode_context``, held from its first decode step to its release. One model serves one held
    context at a time: a point that steps while another point on the same model holds its own makes that one exit
    first (its hooks off, its state reset as the class's context resets it), so that no point steps under another's
    hooks."""

    _holders: weakref.WeakKeyDictionary[Any, DecodeHold] = weakref.WeakKeyDictionary()

    def __init__(self, cache_spec: CacheSpec, model: Any) -> None:
        self.cache_spec, self.model = cache_spec, model
        self.manager: contextlib.AbstractContextManager[Any] | None = None
        self.before: tuple[Any, ...] = ()

    def hold(self) -> None:
        """Enter the context unless this point holds it already (cheap: a dictionary look-up per step)."""
        if self.manager is not None:
            return
        other = DecodeHold._holders.get(self.model)
        if other is not None:
            other.drop()
        manager = opened(self.cache_spec, "decode_context", self.model)
        self.before = fingerprint(self.model)
        try:
            manager.__enter__()
        except Exception as exc:  # noqa: BLE001
            raise HookError(f"cache class {self.cache_spec.name!r}: entering decode_context(model) raised "
                            f"{_first_line(exc)}") from None
        self.manager = manager
        DecodeHold._holders[self.model] = self

    def drop(self) -> None:
        """Exit the context if held, the weights checked unchanged."""
        manager, self.manager = self.manager, None
        if manager is None:
            return
        if DecodeHold._holders.get(self.model) is self:
            del DecodeHold._holders[self.model]
        manager.__exit__(None, None, None)
        check_weights(self.cache_spec, "decode_context", self.model, self.before)


def attributes(model: Any) -> dict[tuple[int, str], tuple[Any, Any]]:
    """The plain attributes of every module of ``model`` (``vars``, not parameters, buffers or submodules):
    ``{(id(module), name): (module, value)}``, what a hook may leave on a module for the decode steps."""
    return {(id(m), k): (m, v) for m in model.modules() for k, v in vars(m).items() if not k.startswith("_")}


_MISSING = object()


class FillState:
    """The module attributes a point's ``fill_context`` left on the model (kvpress's ``AdaKVPress``:
    ``masked_key_indices`` on every attention module, which its patched attention reads at every decode step), the
    point's own: put back before each of its steps when another point on the model has set its own since (state
    isolated between points open on one model), and taken away when the point is released."""

    _owners: weakref.WeakKeyDictionary[Any, FillState] = weakref.WeakKeyDictionary()

    def __init__(self, model: Any, before: dict[tuple[int, str], tuple[Any, Any]]) -> None:
        self.model = model
        after = attributes(model)
        self.changed = [(m, key[1], v, before[key][1] if key in before else _MISSING)
                        for key, (m, v) in after.items() if key not in before or before[key][1] is not v]
        FillState._owners[model] = self

    @staticmethod
    def before_fill(model: Any) -> dict[tuple[int, str], tuple[Any, Any]]:
        """The model's attributes before a fill, another point's taken away first (so that each point's are
        relative to the model as built)."""
        owner = FillState._owners.get(model)
        if owner is not None:
            owner.revert()
        return attributes(model)

    def apply(self) -> None:
        """Make this point's attributes the model's (nothing when they are already: one look-up per step)."""
        owner = FillState._owners.get(self.model)
        if owner is self:
            return
        if owner is not None:
            owner.revert()
        for module, name, value, _ in self.changed:
            module.__dict__[name] = value
        FillState._owners[self.model] = self

    def revert(self) -> None:
        """Put back what the attributes were before this point's fill, when this point's are the model's."""
        if FillState._owners.get(self.model) is not self:
            return
        for module, name, _, old in self.changed:
            if old is _MISSING:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = old
        del FillState._owners[self.model]
