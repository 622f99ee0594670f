"""kvpress presses as cache classes, one call each (:func:`register_press`): NVIDIA kvpress compresses a
``DynamicCache`` through forward hooks on every attention module, entered with ``with press(model):`` around the
prefill and around the decode steps, as a user's ``with press(model): model.generate(...)`` does. kvpress stays
optional: the press is made when a point is built, so a run without the package skips the class with the reason.
Standard library only here; docs/cache-classes.md ("kvpress presses")."""

from __future__ import annotations

import copy
import importlib
from typing import Any

from kvcache.measuring.caches import _dynamic, register_cache
from kvcache.measuring.cachespec import CacheSpec

#: The package the presses come from, imported when a press is first made.
PACKAGE = "kvpress"


def _kvpress() -> Any:
    return importlib.import_module(PACKAGE)


def is_press(obj: Any) -> bool:
    """Whether ``obj`` is a press itself (kvpress's have a ``forward_hook``), not a text or a factory."""
    return callable(getattr(obj, "forward_hook", None))


def make_press(press: Any) -> Any:
    """A fresh press: ``press`` evaluated among kvpress's names (``"KnormPress(0.5)"``,
    ``"AdaKVPress(KnormPress(0.5))"``), a copy of a press given itself, or called (a function of no argument
    returning a press); ImportError when kvpress is not installed (a skip naming it)."""
    if is_press(press):
        return copy.deepcopy(press)
    if isinstance(press, str):
        return eval(press, {"__builtins__": {}}, vars(_kvpress()))  # noqa: S307 (the user's own registration)
    return press()


def register_press(name: str, press: Any, *, decoding: bool = True,
                   description: str = "", replace: bool = False, **options: Any) -> CacheSpec:
    """Register a kvpress press as the cache class ``name``: a ``DynamicCache`` filled by a real prefill inside
    ``with press(model):`` (``fill_context``) and decoded with the press's hooks still on (``decode_context``), as
    ``with press(model): model.generate(...)`` keeps them: what they cost a decode step (a ``DecodingPress``'s
    compression, every press's host syncs: an ``.item()`` per layer per step) is counted; ``decoding=False``: hooks
    on around the prefill only. ``press``: a text evaluated among kvpress's names, ``"KnormPress(0.5)"``, a press
    (``KnormPress(0.5)``: copied for every point) or a function of no argument returning one; a fresh press per
    point, so no state is shared between points. ``options``: other ``register_cache`` keywords; ``period``
    defaults to the press's ``compression_interval`` where it has one (a ``DecodingPress``: its counted passes
    amortised over that many steps, the compression named as the periodic part). A run without kvpress skips the
    class with the reason."""
    if not (isinstance(press, str) and press.strip()) and not callable(press):
        raise ValueError(f"register_press({name!r}): press {press!r} is not accepted; give a text such as "
                         "'KnormPress(0.5)' (evaluated among kvpress's names), a press (copied for every point) or a "
                         "function of no argument returning a press")

    def fill_context(model: Any) -> Any:
        return make_press(press)(model)

    def decode_context(model: Any) -> Any:
        return make_press(press)(model)

    def prepare() -> None:
        _kvpress()  # ImportError: the class is skipped naming the missing package

    def period(config: Any) -> int | None:  # a press that compresses every N decode steps: counted over N steps
        return getattr(make_press(press), "compression_interval", None)

    options.setdefault("period", period)
    text = press if isinstance(press, str) else repr(press) if is_press(press) else getattr(press, "__name__", "")
    return register_cache(name, _dynamic, description=description or f"kvpress {text} on a DynamicCache",
                          fill_context=fill_context, decode_context=decode_context if decoding else None,
                          prepare=prepare, replace=replace, in_all=options.pop("in_all", False), **options)
