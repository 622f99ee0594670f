"""Constructing caches in any release: each class's constructor keywords as this release spells them (StaticCache's
batch keyword, ``config=``, ``offloading=``), quantized, sink and offloaded caches, or :class:`Unsupported` with the
reason where the release lacks the class or keyword."""

from __future__ import annotations

import inspect
from typing import Any

import torch
import transformers
from transformers import cache_utils

from kvcache.measuring.compat.version import TRANSFORMERS, VERSION, Unsupported, exception_line, release_lacks


def cache_class(name: str) -> type:
    """A class from ``transformers.cache_utils`` by name, or :class:`Unsupported`."""
    cls = getattr(cache_utils, name, None)
    if cls is None:
        raise release_lacks(name)
    return cls


def init_params(cls: type) -> dict[str, inspect.Parameter]:
    """Parameters of a class's constructor, looking through subclasses that only pass ``*args, **kwargs`` on."""
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters
        if not any(p.kind is p.VAR_POSITIONAL for p in params.values()):
            return dict(params)
    return {}


def own_params(cls: type) -> frozenset:
    """Parameters the nearest ``__init__`` of ``cls`` names itself (no looking through ``*args``)."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            return frozenset(inspect.signature(klass.__init__).parameters)
    return frozenset()


def dynamic_init_kwargs(config: Any = None, **kwargs: Any) -> dict[str, Any]:
    """Keywords for ``DynamicCache.__init__`` (or a subclass's ``super().__init__``) in this release.

    ``config=``/``offloading=`` only where ``DynamicCache.__init__`` names them (4.56+). 4.54-4.55 route
    ``DynamicCache(*args, **kwargs)`` to ``Cache.__init__``, which turns a config into static-layer
    arguments (``batch_size``...) that ``DynamicLayer`` rejects: no config there. 4.45-4.53 take neither.
    """
    params = own_params(cache_utils.DynamicCache)
    for key in kwargs:
        if key not in params:
            raise Unsupported(f"DynamicCache({key}=...) is not available in transformers {TRANSFORMERS}")
    out = dict(kwargs)
    if config is not None and "config" in params:
        out["config"] = config
    return out


def new_dynamic_cache(config: Any, cls: type | None = None, **kwargs: Any) -> Any:
    """``DynamicCache`` or a subclass (5.x/4.56+ take ``config=`` and ``offloading=``; 4.x before take neither)."""
    return (cls or cache_utils.DynamicCache)(**dynamic_init_kwargs(config, **kwargs))


def _batch_keyword(cls: type, params: dict[str, inspect.Parameter]) -> str | None:
    """StaticCache's batch keyword: ``batch_size`` up to 4.45 (``max_batch_size`` deprecated there),
    ``max_batch_size`` from 4.46 (``batch_size`` deprecated 4.46-4.50, gone from 4.51), none from 4.56. Where both
    are taken either one works (the other only warns), so a commit between 4.45 and 4.46 is answered by number
    without doubt (a plain tuple: nothing to note)."""
    if "max_batch_size" in params and "batch_size" in params:
        return "batch_size" if tuple(VERSION) < (4, 46) else "max_batch_size"
    for key in ("max_batch_size", "batch_size"):
        if key in params:
            return key
    return None


def new_cache(cls: type, config: Any, max_cache_len: int | None = None, device: Any = None, dtype: Any = None,
              batch_size: int = 1, **extra: Any) -> Any:
    """Construct any cache class, passing only the keywords its ``__init__`` takes in this release.

    Covers StaticCache's changes: ``batch_size`` (to 4.45) / ``max_batch_size`` (4.46+), and from 4.56
    ``(config, max_cache_len)`` with lazy allocation; up to 4.55 the buffer is allocated at construction
    (float32 by default: ``device`` and ``dtype`` are passed there); ``batch_size`` rows where the class takes it
    (from 4.56 the buffer takes its batch from the first K/V written). DynamicCache subclasses go through
    :func:`new_dynamic_cache`.
    """
    if issubclass(cls, cache_utils.DynamicCache):
        return new_dynamic_cache(config, cls=cls, **extra)
    params = init_params(cls)
    for key in extra:
        if key not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise Unsupported(f"{cls.__name__}({key}=...) is not available in transformers {TRANSFORMERS}")
    kwargs = dict(config=config, max_cache_len=max_cache_len, device=device, dtype=dtype, **extra)
    batch = _batch_keyword(cls, params)
    if batch is not None:
        kwargs[batch] = batch_size
    return cls(**{k: v for k, v in kwargs.items() if (k in params or k in extra) and v is not None})


def new_quantized_cache(backend: str, config: Any, device: Any, dtype: Any) -> Any:
    """A quantized dynamic cache: ``QuantizedCache(backend, config)`` (4.56+), ``QuantizedCache(backend,
    compute_dtype=, device=)`` (4.54-4.55, no config: see :func:`dynamic_init_kwargs`), or
    ``QuantoQuantizedCache``/``HQQQuantizedCache(cache_config=QuantizedCacheConfig(...))`` (to 4.53).
    Whether this release offers ``backend`` at all is :func:`check_quantized_backend`'s question."""
    cls = getattr(cache_utils, "QuantizedCache", None)
    if cls is None:
        raise release_lacks("QuantizedCache")
    params = own_params(cls)
    if "backend" in params and "config" in params:
        return cls(backend, config)
    if "backend" in params:
        return cls(backend, compute_dtype=dtype, device=str(device))
    legacy = {"quanto": "QuantoQuantizedCache", "hqq": "HQQQuantizedCache"}.get(backend)
    if legacy is None:  # up to 4.53 each backend is a class of its own, and there is none for this one
        raise release_lacks(f"the {backend} backend of QuantizedCache")
    cache_config = cache_utils.QuantizedCacheConfig(backend=backend, compute_dtype=dtype, device=str(device))
    return cache_class(legacy)(cache_config=cache_config)


def quantized_residual_length(backend: str) -> int | None:
    """Tokens a quantized cache of ``backend`` keeps in full precision before it quantizes them all again (its
    ``residual_length``, as :func:`new_quantized_cache` builds it: the release's default), or None for a backend with
    no residual (``fp8`` appends its quantized states as they come) or a release that does not say."""
    if backend == "fp8":
        return None
    layer = {"quanto": "QuantoQuantizedLayer", "hqq": "HQQQuantizedLayer"}.get(backend)
    holder = getattr(cache_utils, layer, None) if layer else None
    if holder is None:  # to 4.55: the residual is a field of QuantizedCacheConfig
        holder = getattr(cache_utils, "QuantizedCacheConfig", None)
    if holder is None:
        return None
    param = inspect.signature(holder.__init__).parameters.get("residual_length")
    default = param.default if param is not None else None
    return default if isinstance(default, int) and not isinstance(default, bool) and default > 0 else None


def tiny_config() -> Any:
    """A one-layer Llama config (8 dims, one head), enough to construct any cache class to see if it builds."""
    return transformers.LlamaConfig(num_hidden_layers=1, hidden_size=8, intermediate_size=16, num_attention_heads=1,
                                    num_key_value_heads=1, vocab_size=16, max_position_embeddings=64)


def check_quantized_backend(backend: str) -> None:
    """:class:`Unsupported`, with the reason, unless this release builds a quantized cache with ``backend``.

    Asked by constructing one for :func:`tiny_config` on the CPU: any exception is the answer (unknown
    backend, a class or keyword this release lacks, a package the backend imports), whatever the release
    spells its check. Call it after checking the backend's package, so that a missing package is named as such.
    """
    try:
        new_quantized_cache(backend, tiny_config(), torch.device("cpu"), torch.float32)
    except Unsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the release raises, the backend cannot be used here
        raise Unsupported(f"the {backend} backend of QuantizedCache is not available in transformers {TRANSFORMERS} "
                          f"(building one raised {exception_line(exc)})") from None


def new_sink_cache(window_length: int, num_sink_tokens: int) -> Any:
    """``SinkCache`` (4.45-4.52); from 4.53 the class is a stub that raises (moved to a Hub repository)."""
    cls = cache_class("SinkCache")
    try:
        return cls(window_length=window_length, num_sink_tokens=num_sink_tokens)
    except NotImplementedError:
        raise Unsupported(f"SinkCache is not available in transformers {TRANSFORMERS} (moved to the Hub "
                          "repository transformers-community/sink_cache)") from None


#: What an offloaded cache of each kind is in the releases that have one (the reason of :func:`check_offloaded`).
OFFLOADED = {"dynamic": "an offloaded dynamic cache (OffloadedCache / DynamicCache(offloading=True))",
             "static": "an offloaded static cache (OffloadedStaticCache / StaticCache(offloading=True))"}


def check_offloaded(kind: str) -> None:
    """:class:`Unsupported`, with the reason, unless this release offers an offloaded cache of ``kind``
    (``"dynamic"``: ``DynamicCache(offloading=True)`` 4.56+ or ``OffloadedCache``; ``"static"``:
    ``StaticCache(offloading=True)`` 4.56+ or ``OffloadedStaticCache``)."""
    cls = cache_utils.DynamicCache if kind == "dynamic" else cache_utils.StaticCache
    legacy = "OffloadedCache" if kind == "dynamic" else "OffloadedStaticCache"
    if "offloading" not in own_params(cls) and not hasattr(cache_utils, legacy):
        raise release_lacks(OFFLOADED[kind])


def offloaded_dynamic(config: Any) -> Any:
    """An offloaded dynamic cache: ``OffloadedCache()`` (4.x) or ``DynamicCache(offloading=True)`` (4.56+)."""
    check_offloaded("dynamic")
    if "offloading" in own_params(cache_utils.DynamicCache):
        return new_dynamic_cache(config, offloading=True)
    return cache_utils.OffloadedCache()


def offloaded_static(config: Any, max_cache_len: int, device: Any, dtype: Any, batch_size: int = 1) -> Any:
    """An offloaded static cache: ``StaticCache(offloading=True)`` (4.56+) or ``OffloadedStaticCache`` (4.x)."""
    check_offloaded("static")
    if "offloading" in own_params(cache_utils.StaticCache):
        return new_cache(cache_utils.StaticCache, config, max_cache_len, device, dtype, batch_size,
                         offloading=True)
    cls = cache_utils.OffloadedStaticCache
    extra = {"offload_device": "cpu"} if "offload_device" in init_params(cls) else {}
    return new_cache(cls, config, max_cache_len, device, dtype, batch_size, **extra)
