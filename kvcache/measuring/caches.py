"""The cache registry: every cache class the suite can sweep, count and probe, by name, the built-in classes among
them (a class the installed release or packages cannot provide is skipped with the reason; the test-only twins are
registered by ``benchmarks/conftest.py``). Add your own through :mod:`kvcache.caches` or a ``kvcache_passes.caches``
entry point (docs/cache-classes.md)."""

from __future__ import annotations

import importlib.util
from typing import Any, Callable

from kvcache.analysing import decoding
from kvcache.measuring import attention as attentions
from kvcache.measuring.cachespec import CacheRequest, CacheSpec, EntryPoints, Unsupported

__all__ = ["CacheError", "CacheRequest", "CacheSpec", "register_cache", "registry", "get", "parse_caches"]



class CacheError(ValueError):
    """A ``--kv-caches`` value naming no registered class; the message is one line."""


_REGISTRY: dict[str, CacheSpec] = {}
_builtins_registered = False


def _register_entry_point(obj: Any) -> None:
    """What an entry point of ``kvcache_passes.caches`` names: a :class:`CacheSpec` (registered unless the name is
    taken) or a function that registers."""
    if isinstance(obj, CacheSpec):
        _REGISTRY.setdefault(obj.name, obj)
    else:
        obj()


#: The entry points installed packages add cache classes through; one that failed is named in unknown-class errors.
CACHE_ENTRY_POINTS = EntryPoints("kvcache_passes.caches", _register_entry_point)
#: The entry-point group of cache classes (public: :data:`kvcache.caches.ENTRY_POINT_GROUP`).
ENTRY_POINT_GROUP = CACHE_ENTRY_POINTS.group


def register_cache(name: str, build: Callable[[CacheRequest], Any] | None = None, *, replace: bool = False,
                   **options: Any) -> CacheSpec:
    """Register a cache class under ``name`` (see :class:`CacheSpec` for ``options``) and return its spec."""
    if build is None:
        raise TypeError("register_cache needs a build function: build(request: CacheRequest) -> cache")
    if attentions.SEPARATOR in str(name):
        raise ValueError(f"cache class name {name!r} contains '@', which separates a class from its attention "
                         "implementation in record keys (dynamic@eager): pick a name without it")
    if decoding.STRATEGY_SEPARATOR in str(name):
        raise ValueError(f"cache class name {name!r} contains '#', which separates a class from its decoding "
                         "strategy in record keys (dynamic#beam:4): pick a name without it")
    _register_builtins()  # first, so that replace=True overrides a built-in and a clash is reported here
    if name in _REGISTRY and not replace:
        raise ValueError(f"cache class {name!r} is already registered (pass replace=True to override)")
    spec = CacheSpec(name=name, build=build, **options)
    _REGISTRY[name] = spec
    return spec


def load_entry_points() -> list[str]:
    """Register the classes installed packages offer (once); return one line per entry point that failed."""
    return CACHE_ENTRY_POINTS.load()


def unknown_class(prefix: str, name: str, specs: dict) -> CacheError:
    return CacheError(f"{prefix}unknown cache class {name!r}; known: {', '.join(specs)}, or all"
                      f"{CACHE_ENTRY_POINTS.failed()}")


def registry() -> dict[str, CacheSpec]:
    """Every registered class, ``{name: CacheSpec}``: the built-in ones, the entry points' and the registered ones."""
    _register_builtins()
    load_entry_points()
    return dict(_REGISTRY)


def get(name: str) -> CacheSpec:
    """The spec of a registered class, or of ``<class>@<attention>`` (the class under that attention implementation:
    :func:`kvcache.measuring.attention.derived`); a key with a decoding strategy (``dynamic#beam:4``) is its class's
    spec named by the whole key (what the strategy does: :mod:`kvcache.measuring.decoding`)."""
    base_key, strategy = decoding.split_strategy(name)
    if strategy != decoding.GREEDY:
        return _with_strategy(get(base_key), name)
    specs = registry()
    if name in specs:
        return specs[name]
    base, attention = attentions.split(name)
    if attention is None or base not in specs:
        raise unknown_class("", base if attention is not None else name, specs)
    return attentions.derived(specs[base], attention)


_STRATEGY_SPECS: dict[str, CacheSpec] = {}


def _with_strategy(base: CacheSpec, name: str) -> CacheSpec:
    """``base`` named ``name`` (its ``<cache>#<strategy>`` key), outside ``--kv-caches all``; one spec per key."""
    import dataclasses

    spec = _STRATEGY_SPECS.get(name)
    if spec is None or spec.build is not base.build:
        spec = _STRATEGY_SPECS[name] = dataclasses.replace(base, name=name, in_all=False)
    return spec


def parse_caches(text: str) -> list[str]:
    """``"dynamic,static"`` or ``"all"`` -> names; an unknown name is a one-line :class:`CacheError`."""
    specs = registry()
    if text.strip() == "all":
        return [name for name, spec in specs.items() if spec.in_all]
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise CacheError(f"--kv-caches {text!r} names no cache class; known: {', '.join(specs)}, or all")
    for name in names:
        keyed, strategy = decoding.split_strategy(name)
        if strategy != decoding.GREEDY:  # <class>[@<attention>]#<strategy>: the strategy's form checked here
            try:
                decoding.parse_strategy(strategy)
            except decoding.DecodingError as exc:
                raise CacheError(f"--kv-caches {name}: {exc}") from None
        base, attention = attentions.split(keyed)
        if base not in specs:
            raise unknown_class("--kv-caches: ", base, specs)
        if attention is not None:  # <class>@<attention>: checked against the release's implementations
            try:
                attentions.accepted(attention, prefix=f"--kv-caches {name}: ")
            except attentions.AttentionError as exc:
                raise CacheError(str(exc)) from None
    return list(dict.fromkeys(names))


def cache_unavailable_reason(spec: CacheSpec, device_type: str) -> str | None:
    """Why ``spec`` cannot run here (device, release, package), or None if it can.

    Runs the class's ``prepare``: whatever it raises is a skip with the reason, never an error of the
    session (:class:`Unsupported` is the reason itself; a missing package is named; any other exception is named
    with its type).
    """
    if spec.devices is not None and device_type not in spec.devices:
        return f"{spec.name} runs on {', '.join(spec.devices)} only, not {device_type}"
    if spec.prepare is None:
        return None
    try:
        spec.prepare()
    except Unsupported as exc:
        return str(exc)
    except ImportError as exc:
        return f"{spec.name} needs a package that is not installed ({exc})"
    except Exception as exc:  # noqa: BLE001 - a class that cannot be prepared is skipped, not a crash
        from kvcache.measuring import compat

        return f"{spec.name} could not be prepared: {compat.exception_line(exc)}"
    return None


def kind_reason(spec: CacheSpec, model: str, kind_layers: dict[str, list[int]]) -> str | None:
    """Why ``spec`` cannot serve a model whose layers are of these kinds (``{kind: [layer indices]}``), or None."""
    if spec.kinds is None:
        return None
    missing = [kind for kind in kind_layers if kind not in spec.kinds]
    if not missing:
        return None
    what = ", ".join(f"{len(kind_layers[kind])} {kind}" for kind in missing)
    return (f"{spec.name} cannot serve {' or '.join(missing)} layers (it handles {', '.join(spec.kinds)} only); "
            f"{model} has {what} layers")


# --- built-in classes ------------------------------------------------------------------------------

def _needs_package(module: str, package: str) -> Callable[[], None]:
    def check() -> None:
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            raise ImportError(f"pip install {package}")
    return check


def _all_of(*checks: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        for check in checks:
            check()
    return run


def _dynamic(req: CacheRequest) -> Any:
    from kvcache.measuring import compat

    return compat.new_dynamic_cache(req.config)


def _static(req: CacheRequest) -> Any:
    from kvcache.measuring import compat

    return compat.new_cache(compat.cache_class("StaticCache"), req.config, req.max_tokens, req.device, req.dtype,
                            req.batch)


def _inplace(req: CacheRequest) -> Any:
    from kvcache.measuring.fixed import InplaceCache

    return InplaceCache(req.config, capacity=req.max_tokens)


def _static_sliced(req: CacheRequest) -> Any:
    from kvcache.measuring import compat
    from kvcache.measuring.fixed import StaticSlicedCache

    return compat.new_cache(StaticSlicedCache, req.config, req.max_tokens, req.device, req.dtype, req.batch)


def _prepare_sliced() -> None:
    from kvcache.measuring.fixed import register_sliced_attention

    register_sliced_attention()


def _offloaded(req: CacheRequest) -> Any:
    from kvcache.measuring import compat

    return compat.offloaded_dynamic(req.config)


def _offloaded_static(req: CacheRequest) -> Any:
    from kvcache.measuring import compat

    return compat.offloaded_static(req.config, req.max_tokens, req.device, req.dtype, req.batch)


def _prepare_offloaded() -> None:
    from kvcache.measuring import compat

    compat.check_offloaded("dynamic")


def _prepare_offloaded_static() -> None:
    from kvcache.measuring import compat

    compat.check_offloaded("static")


def _quantized(backend: str) -> Callable[[CacheRequest], Any]:
    def build(req: CacheRequest) -> Any:
        from kvcache.measuring import compat

        return compat.new_quantized_cache(backend, req.config, req.device, req.dtype)
    return build


def _prepare_quantized(backend: str) -> Callable[[], None]:
    def check() -> None:
        from kvcache.measuring import compat

        compat.check_quantized_backend(backend)
    return check


SINK_TOKENS = 4


def _sink(req: CacheRequest) -> Any:
    from kvcache.measuring import compat

    return compat.new_sink_cache(window_length=req.max_tokens, num_sink_tokens=SINK_TOKENS)


def _prepare_sink() -> None:
    from kvcache.measuring import compat

    compat.new_sink_cache(window_length=2 * SINK_TOKENS, num_sink_tokens=SINK_TOKENS)


def _paged_unbuilt(req: CacheRequest) -> Any:
    """``paged`` brings its own point (:class:`kvcache.measuring.paged_point.PagedPoint`), which builds the release's
    PagedAttentionCache for its batch itself; a bare request cannot say how many sequences it holds."""
    raise Unsupported("paged: the cache is built by its own point (kvcache.measuring.paged_point.PagedPoint), "
                             "not from a bare CacheRequest")


def _prepare_paged() -> None:
    from kvcache.measuring import paged_point

    paged_point.supported_api()


def _paged_point(*args: Any, **kwargs: Any) -> Any:
    from kvcache.measuring.paged_point import PagedPoint

    return PagedPoint(*args, **kwargs)


def _register_builtins() -> None:
    global _builtins_registered
    if _builtins_registered:
        return
    _builtins_registered = True
    reg = register_cache
    reg("dynamic", _dynamic, description="DynamicCache: torch.cat appends, copying the whole cache every step")
    reg("static", _static, description="StaticCache sized to context + warm-up + steps + margin",
        memory_factor=1.5)
    reg("inplace", _inplace, description="dynamic cache written in place into a preallocated buffer (this project)",
        memory_factor=1.2, kinds=("full",))
    reg("static-sliced", _static_sliced, attention="kvcache_sliced_sdpa", prepare=_prepare_sliced,
        description="static cache; attention sees the filled slots only, native GQA (this project)",
        memory_factor=1.2, kinds=("full",))
    reg("offloaded", _offloaded, prepare=_prepare_offloaded, devices=("cuda",),
        description="dynamic cache offloaded to CPU between layers (offloading=True)")
    reg("offloaded-static", _offloaded_static, prepare=_prepare_offloaded_static, devices=("cuda",),
        description="static cache offloaded to CPU between layers", memory_factor=1.5)
    reg("quantized-fp8", _quantized("fp8"), prepare=_prepare_quantized("fp8"),
        description="QuantizedCache, fp8 backend (per-tensor)", kinds=("full",))
    reg("quantized-quanto", _quantized("quanto"),
        prepare=_all_of(_needs_package("optimum.quanto", "optimum-quanto"), _prepare_quantized("quanto")),
        description="QuantizedCache, quanto backend (int4, residual 128 tokens in full precision)", kinds=("full",))
    reg("quantized-hqq", _quantized("hqq"), prepare=_all_of(_needs_package("hqq", "hqq"), _prepare_quantized("hqq")),
        description="QuantizedCache, hqq backend", kinds=("full",))
    reg("sink", _sink, prepare=_prepare_sink,
        description="SinkCache with a window as large as the sweep needs (4.x only)", kinds=("full",))
    reg("paged", _paged_unbuilt, attention="sdpa_paged", prepare=_prepare_paged, point=_paged_point,
        description="continuous batching's PagedAttentionCache (4.53+) under the release's paged SDPA: every step "
                    "gathers each live sequence's K/V out of the block pool (this project drives the forward)",
        memory_factor=1.5, kinds=("full",), pads=False)
