"""kvpress presses as cache classes, one call each (:func:`register_press`): NVIDIA kvpress compresses a
``DynamicCache`` through forward hooks on every attention module, entered with ``with press(model):`` around the
prefill (and, for a press that works while decoding, around the decode steps). kvpress stays optional: the press is
made when a point is built, so a run without the package skips the class with the reason. Standard library only
here; docs/cache-classes.md ("kvpress presses")."""

from __future__ import annotations

import contextlib
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


def decodes(press: Any) -> bool:
    """Whether a press works while decoding (kvpress's ``DecodingPress`` and its kin: a class of its MRO named
    ``*Decoding*``), so that its hooks must stay on during the decode steps."""
    return any("Decoding" in cls.__name__ for cls in type(press).__mro__)


def register_press(name: str, press: Any, *, decoding: bool | None = None,
                   description: str = "", replace: bool = False, **options: Any) -> CacheSpec:
    """Register a kvpress press as the cache class ``name``: a ``DynamicCache`` filled by a real prefill inside
    ``with press(model):`` (``fill_context``), and, for a press that works while decoding (``decoding``; None: a
    ``*Decoding*`` press), with its hooks on through the decode steps too (``decode_context``). ``press``: a text
    evaluated among kvpress's names, ``"KnormPress(0.5)"``, a press (``KnormPress(0.5)``: copied for every point) or
    a function of no argument returning one; a fresh press per point, so no state is shared between points.
    ``options``: other ``register_cache`` keywords. A run without kvpress skips the class with the reason."""
    if not (isinstance(press, str) and press.strip()) and not callable(press):
        raise ValueError(f"register_press({name!r}): press {press!r} is not accepted; give a text such as "
                         "'KnormPress(0.5)' (evaluated among kvpress's names), a press (copied for every point) or a "
                         "function of no argument returning a press")

    def fill_context(model: Any) -> Any:
        return make_press(press)(model)

    def decode_context(model: Any) -> Any:
        made = make_press(press)
        on = decoding if decoding is not None else decodes(made)
        return made(model) if on else contextlib.nullcontext()

    def prepare() -> None:
        _kvpress()  # ImportError: the class is skipped naming the missing package

    text = press if isinstance(press, str) else repr(press) if is_press(press) else getattr(press, "__name__", "")
    return register_cache(name, _dynamic, description=description or f"kvpress {text} on a DynamicCache",
                          fill_context=fill_context, decode_context=decode_context if decoding is not False else None,
                          prepare=prepare, replace=replace, in_all=options.pop("in_all", False), **options)
