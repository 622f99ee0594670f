"""Every difference between Transformers releases (4.45 to 5.x) that this project meets, in one place.

Callers never compare version numbers themselves: they ask this module to build a cache, fill a layer,
name the forward keywords, or register an attention function, and get :class:`Unsupported` (with a
reason fit for a skip message) when the installed release cannot do it.
"""

from __future__ import annotations

import inspect
import re
import sys
from functools import cache
from typing import Any, Callable

import torch
import transformers
from transformers import cache_utils


class Unsupported(RuntimeError):
    """The installed Transformers release lacks a class or feature; the message is the skip reason."""


def parse_version(text: str) -> tuple[int, ...]:
    """``"4.57.1"`` -> ``(4, 57, 1)``; pre-release suffixes are dropped."""
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


class InstalledVersion(tuple):
    """The installed release as a tuple (``(5, 24, 0)``), comparable with ``(5, 23)`` and the like, that notes each
    comparison it cannot answer for the code it runs on.

    A commit between two releases reports the next release as a development version (``5.24.0.dev0``): its code has
    whatever that release's cycle merged so far, so a gate ``VERSION >= (5, 24)`` (a feature 5.24 brought) may be
    true or false there. Every comparison of a development version with a number of its own release (the first
    three parts equal, zeros added) is noted in :data:`AMBIGUOUS` with the caller's place; a probe of ``kvcache
    bisect`` reports such probes as not to be trusted. Released versions, and comparisons with other releases'
    numbers, are exact and note nothing. Every form of a comparison notes: ``<``, ``<=``, ``>``, ``>=``, ``==``,
    ``!=``, with the version on either side (``(5, 24) <= VERSION`` is Python's ``VERSION >= (5, 24)``), of a slice
    (``VERSION[:2]`` is an InstalledVersion too) or of one part (``VERSION[1] >= 24``: a part compared with its own
    value where every later part is 0). Gates that can be asked of the code itself (a class, a keyword) are, in this
    module; these are the ones left."""

    text: str
    development: bool
    full: tuple[int, ...]

    def __new__(cls, text: str) -> InstalledVersion:
        self = super().__new__(cls, parse_version(text))
        self.text = text
        self.development = not re.fullmatch(r"\d+(\.\d+)*", text.split("+")[0])
        self.full = tuple(self)  # the whole version, also in a slice of it
        return self

    def _note(self, other: object, op: str) -> None:
        if not self.development or not isinstance(other, tuple):
            return
        pad = lambda t: (tuple(t) + (0, 0, 0))[:3]  # noqa: E731
        if pad(other) != pad(self.full):
            return
        _note_gate(self.text, op, ".".join(map(str, other)))

    def __getitem__(self, key):
        """A slice is an InstalledVersion of the same text (its comparisons note too); a part is a
        :class:`VersionPart`."""
        got = tuple.__getitem__(self, key)
        if isinstance(key, slice):
            part = tuple.__new__(InstalledVersion, got)
            part.text, part.development, part.full = self.text, self.development, self.full
            return part
        index = key + len(self) if key < 0 else key
        return VersionPart(got, self, index)

    def __eq__(self, other):
        self._note(other, "==")
        return tuple.__eq__(self, other)

    def __ne__(self, other):
        self._note(other, "!=")
        return tuple.__ne__(self, other)

    __hash__ = tuple.__hash__

    def __lt__(self, other):
        self._note(other, "<")
        return tuple.__lt__(self, other)

    def __le__(self, other):
        self._note(other, "<=")
        return tuple.__le__(self, other)

    def __gt__(self, other):
        self._note(other, ">")
        return tuple.__gt__(self, other)

    def __ge__(self, other):
        self._note(other, ">=")
        return tuple.__ge__(self, other)

    def __reduce__(self):
        return (InstalledVersion, (self.text,))


def _note_gate(text: str, op: str, wanted: str) -> None:
    """Note, with the place of the comparison's caller, a gate that development version ``text`` cannot answer."""
    frame = sys._getframe(3)  # _note_gate <- _note <- the comparison <- its caller
    where = f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}:{frame.f_lineno}"
    AMBIGUOUS.setdefault(where, f"{where} gates on transformers {op} {wanted}, which {text} (a commit "
                                f"between releases) cannot answer")


class VersionPart(int):
    """One part of an :class:`InstalledVersion` (``VERSION[1]``): an int whose comparisons with its own value note,
    where every later part is 0 (``VERSION[1] >= 24`` of 5.24.0.dev0: as unanswerable as ``VERSION >= (5, 24)``)."""

    def __new__(cls, value: int, version: InstalledVersion, index: int) -> VersionPart:
        self = super().__new__(cls, value)
        self.version, self.index = version, index
        return self

    def _note(self, other: object, op: str) -> None:
        version = self.version
        if (version.development and isinstance(other, int) and other == int(self)
                and not any(version.full[self.index + 1:])):
            _note_gate(version.text, op, f"{other} (part {self.index} of the version)")

    def __lt__(self, other):
        self._note(other, "<")
        return int.__lt__(self, other)

    def __le__(self, other):
        self._note(other, "<=")
        return int.__le__(self, other)

    def __gt__(self, other):
        self._note(other, ">")
        return int.__gt__(self, other)

    def __ge__(self, other):
        self._note(other, ">=")
        return int.__ge__(self, other)

    def __eq__(self, other):
        self._note(other, "==")
        return int.__eq__(self, other)

    def __ne__(self, other):
        self._note(other, "!=")
        return int.__ne__(self, other)

    __hash__ = int.__hash__


#: ``{caller: reason}`` of every version gate :class:`InstalledVersion` could not answer in this process.
AMBIGUOUS: dict[str, str] = {}


def ambiguous_gates() -> list[str]:
    """The version gates this process took that the installed (development) version cannot answer, one line each."""
    return list(AMBIGUOUS.values())


TRANSFORMERS = transformers.__version__
VERSION = InstalledVersion(TRANSFORMERS)


def release_lacks(what: str) -> Unsupported:
    return Unsupported(f"{what} is not available in transformers {TRANSFORMERS}")


def described(exc: BaseException) -> str:
    """``"RuntimeError: first line of its message"``: an exception as one line of a skip reason."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


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


# --- constructing caches ---------------------------------------------------------------------------

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
                          f"(building one raised {described(exc)})") from None


def new_sink_cache(window_length: int, num_sink_tokens: int) -> Any:
    """``SinkCache`` (4.45-4.52); from 4.53 the class is a stub that raises (moved to a Hub repository)."""
    cls = cache_class("SinkCache")
    try:
        return cls(window_length=window_length, num_sink_tokens=num_sink_tokens)
    except NotImplementedError:
        raise Unsupported(f"SinkCache is not available in transformers {TRANSFORMERS} (moved to the Hub "
                          "repository transformers-community/sink_cache)") from None


def offloaded_dynamic(config: Any) -> Any:
    """An offloaded dynamic cache: ``OffloadedCache()`` (4.x) or ``DynamicCache(offloading=True)`` (4.56+)."""
    if "offloading" in own_params(cache_utils.DynamicCache):
        return new_dynamic_cache(config, offloading=True)
    if hasattr(cache_utils, "OffloadedCache"):
        return cache_utils.OffloadedCache()
    raise release_lacks("an offloaded dynamic cache (OffloadedCache / DynamicCache(offloading=True))")


def offloaded_static(config: Any, max_cache_len: int, device: Any, dtype: Any, batch_size: int = 1) -> Any:
    """An offloaded static cache: ``StaticCache(offloading=True)`` (4.56+) or ``OffloadedStaticCache`` (4.x)."""
    if "offloading" in own_params(cache_utils.StaticCache):
        return new_cache(cache_utils.StaticCache, config, max_cache_len, device, dtype, batch_size,
                         offloading=True)
    if hasattr(cache_utils, "OffloadedStaticCache"):
        cls = cache_utils.OffloadedStaticCache
        extra = {"offload_device": "cpu"} if "offload_device" in init_params(cls) else {}
        return new_cache(cls, config, max_cache_len, device, dtype, batch_size, **extra)
    raise release_lacks("an offloaded static cache (OffloadedStaticCache / StaticCache(offloading=True))")


def has_offloaded(kind: str) -> bool:
    cls = cache_utils.DynamicCache if kind == "dynamic" else cache_utils.StaticCache
    legacy = "OffloadedCache" if kind == "dynamic" else "OffloadedStaticCache"
    return "offloading" in own_params(cls) or hasattr(cache_utils, legacy)


# --- a layer's K/V inside a cache: one function per release range ----------------------------------------
# Every read or write of a cache's per-layer storage (``layers[i].keys``, ``key_cache[i]``) is here, nowhere else.

def has_layer_objects(cache: Any) -> bool:
    """Whether ``cache`` keeps one layer object per layer (``cache.layers``, 4.54+) rather than the lists
    ``key_cache``/``value_cache`` (4.45-4.53)."""
    return hasattr(cache, "layers")


def layer_kv(cache: Any, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V tensors a cache holds for one layer, in any release."""
    if has_layer_objects(cache):
        return layer_kv_from_layers(cache, layer_idx)
    return layer_kv_from_lists(cache, layer_idx)


def store_layer_kv(cache: Any, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Make ``keys``/``values`` what the release's cache reports for ``layer_idx`` (its length, its masks),
    without copying them: how :class:`kvcache.measuring.fixed.InplaceCache` hands over views of its buffer."""
    if has_layer_objects(cache):
        store_layer_kv_in_layers(cache, layer_idx, keys, values)
    else:
        store_layer_kv_in_lists(cache, layer_idx, keys, values)


def layer_kv_from_layers(cache: Any, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """4.54+: ``cache.layers[i].keys`` / ``.values``."""
    layer = cache.layers[layer_idx]
    return layer.keys, layer.values


def layer_kv_from_lists(cache: Any, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """4.45-4.53: ``cache.key_cache[i]`` / ``cache.value_cache[i]``."""
    return cache.key_cache[layer_idx], cache.value_cache[layer_idx]


def add_layers(cache: Any, layer_idx: int) -> None:
    """4.54+: give a layered cache layer objects up to ``layer_idx``. 4.56+ caches built without a config
    replicate ``layer_class_to_replicate`` (what ``Cache.update`` does lazily); 4.54-4.55 ``append_new_layers``."""
    layers = cache.layers
    if len(layers) > layer_idx:
        return
    replicate = getattr(cache, "layer_class_to_replicate", None)
    if replicate is not None:
        while len(layers) <= layer_idx:
            layers.append(replicate())
    elif hasattr(cache, "append_new_layers"):
        cache.append_new_layers(layer_idx)


def store_layer_kv_in_layers(cache: Any, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """4.54+: set ``layers[i].keys``/``.values`` and mark the layer initialised (5.x layers allocate lazily and
    take their device from the first update)."""
    add_layers(cache, layer_idx)
    layer = cache.layers[layer_idx]
    layer.keys, layer.values = keys, values
    if not getattr(layer, "is_initialized", True):
        layer.device = keys.device
    layer.is_initialized = True


def store_layer_kv_in_lists(cache: Any, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """4.45-4.53: set ``key_cache[i]``/``value_cache[i]`` (empty tensors stand in for layers not yet seen) and,
    for layer 0, ``_seen_tokens``, which those releases read as the cache's length."""
    while len(cache.key_cache) <= layer_idx:
        cache.key_cache.append(torch.tensor([], dtype=keys.dtype, device=keys.device))
        cache.value_cache.append(torch.tensor([], dtype=values.dtype, device=values.device))
    cache.key_cache[layer_idx], cache.value_cache[layer_idx] = keys, values
    if hasattr(cache, "_seen_tokens") and layer_idx == 0:
        cache._seen_tokens = keys.shape[-2]


# --- filling and measuring caches through their public methods -------------------------------------------

def seq_length(cache: Any) -> int:
    """Tokens held (5.4+ returns a 0-dim tensor; up to 5.3 StaticCache counts non-zero rows)."""
    return int(cache.get_seq_length())


def fill_layer(cache: Any, layer_idx: int, keys: torch.Tensor, values: torch.Tensor, start: int) -> None:
    """Write ``keys``/``values`` ([batch, kv_heads, n, head_dim]) at positions ``start..start+n`` of a layer.

    Uses ``cache.update`` with a positional ``cache_kwargs`` dict (accepted by every release; StaticCache up
    to 4.53 requires it, from 5.4 it ignores ``cache_position`` and writes at its own counter, so fill in
    order from slot 0).
    """
    n = keys.shape[-2]
    position = torch.arange(start, start + n, device=keys.device)
    cache.update(keys, values, layer_idx, {"cache_position": position})


# --- driving a decode step ------------------------------------------------------------------------

@cache
def _forward_params(forward: Callable) -> frozenset:
    return frozenset(inspect.signature(forward).parameters)


def _base_params(model: Any) -> frozenset:
    """The parameters of the base model's forward (``model.model``; Falcon: ``.transformer``)."""
    base = getattr(model, "model", None) or getattr(model, "transformer", None) or model
    return _forward_params(type(base).forward)


def cache_keyword(model: Any, params: frozenset | None = None) -> str:
    """The forward's (and generate's) cache keyword: ``past_key_values`` up to 5.23, ``cache`` from 5.24."""
    return "cache" if "cache" in (params if params is not None else _base_params(model)) else "past_key_values"


def decode_kwargs(model: Any, cache: Any, position: int, device: Any, position_ids: torch.Tensor | None = None,
                  attention_mask: torch.Tensor | None = None) -> dict[str, Any]:
    """Keywords for one single-token forward at ``position`` (the cache slot it writes) with ``cache``.

    The cache keyword is ``past_key_values`` up to 5.23 and ``cache`` from 5.24 (:func:`cache_keyword`);
    ``cache_position`` is passed while the model still takes it (up to 5.3). ``position_ids``: a [batch, 1] tensor
    already on the device (a decode loop keeps one and advances it there, so that no step copies a position from
    the host: on CUDA that copy would wait for the device); made here when not given. Its first row is the longest
    sequence (a left-padded batch's row 0 has no padding), so its position is the slot the step writes: that row,
    a view, is the ``cache_position``. ``attention_mask``: the [batch, tokens] padding mask of a ragged batch.
    """
    params = _base_params(model)
    ids = position_ids if position_ids is not None else torch.tensor([[position]], device=device)
    kwargs: dict[str, Any] = {cache_keyword(model, params): cache, "use_cache": True, "position_ids": ids}
    if "cache_position" in params:
        kwargs["cache_position"] = ids[0]
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    return kwargs


def cache_from_output(output: Any) -> Any:
    """The cache object a forward returned (``cache`` from 5.24, ``past_key_values`` before)."""
    fields = getattr(type(output), "__dataclass_fields__", {})
    return getattr(output, "cache" if "cache" in fields else "past_key_values", None)


# --- attention functions -----------------------------------------------------------------------------

def register_attention(name: str, fn: Callable, *, with_sdpa_mask: bool = True) -> None:
    """Register an attention function under ``name`` for ``set_attention``.

    4.51+: ``AttentionInterface.register``; 4.48-4.50: the ``ALL_ATTENTION_FUNCTIONS`` dict; up to 4.47
    there is no functional interface (:class:`Unsupported`). From 4.53 a custom name gets no mask unless a
    mask function is registered too, so ``with_sdpa_mask`` registers ``sdpa_mask`` for it.
    """
    from transformers import modeling_utils

    interface = getattr(modeling_utils, "AttentionInterface", None)
    if interface is not None:
        interface.register(name, fn)
    elif isinstance(getattr(modeling_utils, "ALL_ATTENTION_FUNCTIONS", None), dict):
        modeling_utils.ALL_ATTENTION_FUNCTIONS[name] = fn
    else:
        raise Unsupported(f"no attention registry in transformers {TRANSFORMERS}: a custom attention function "
                          "needs AttentionInterface / ALL_ATTENTION_FUNCTIONS (4.48+)")
    if with_sdpa_mask:
        try:
            from transformers import masking_utils
        except ImportError:  # before 4.53 masks are built by the model, whatever the name
            return
        masking_utils.AttentionMaskInterface.register(name, masking_utils.sdpa_mask)


def attention_name(model: Any) -> str:
    return str(model.config._attn_implementation)


def has_attention_registry() -> bool:
    """Whether the release looks attention functions up by name when a layer runs (4.48+: the
    ``ALL_ATTENTION_FUNCTIONS`` dict, ``AttentionInterface`` from 4.51), asked of the code, not the version."""
    from transformers import modeling_utils

    return hasattr(modeling_utils, "AttentionInterface") or isinstance(
        getattr(modeling_utils, "ALL_ATTENTION_FUNCTIONS", None), dict)


def set_attention(model: Any, name: str) -> None:
    """Switch the attention implementation of a built model (``set_attn_implementation`` from 4.54;
    before that the config attribute, read at call time from 4.48)."""
    if attention_name(model) == name:
        return
    if name not in ("sdpa", "eager") and getattr(model, "_supports_attention_backend", True) is False:
        raise Unsupported(f"{type(model).__name__} runs its own attention code, not a registered attention function "
                          f"such as {name!r} (no AttentionInterface support)")
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
        return
    if not has_attention_registry():  # up to 4.47 a model picks its attention class when it is built
        raise release_lacks(f"switching a built model's attention to {name!r}")
    model.config._attn_implementation = name
    for module in model.modules():
        if getattr(module, "config", None) is not None and module.config is not model.config:
            module.config._attn_implementation = name


def from_config(config: Any, dtype: Any = None) -> Any:
    """A randomly initialised causal LM from a config (attention ``sdpa``), built in ``dtype`` when given (a large
    model then never exists in float32)."""
    from transformers import AutoModelForCausalLM

    config._attn_implementation = "sdpa"
    if dtype is None:
        return AutoModelForCausalLM.from_config(config)
    return AutoModelForCausalLM.from_config(config, **{dtype_keyword(): dtype})


def meta_parameters(config: Any) -> int:
    """Parameters of the causal LM a config describes, counted on the meta device (nothing allocated or initialised);
    tied weights once."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@cache
def dtype_keyword() -> str:
    """``from_pretrained``'s dtype keyword: ``torch_dtype`` up to 4.55, ``dtype`` after. Asked of the code: from
    4.56 ``PreTrainedModel._from_config`` pops ``dtype`` (and ``torch_dtype`` only for compatibility); the version
    number answers only where the source cannot be read."""
    from transformers import modeling_utils

    try:
        source = inspect.getsource(modeling_utils.PreTrainedModel._from_config)
    except (OSError, TypeError, AttributeError):
        return "dtype" if VERSION >= (4, 56) else "torch_dtype"
    return "dtype" if re.search(r"""pop\(\s*["']dtype["']""", source) else "torch_dtype"


# --- what each layer of a model caches ---------------------------------------------------------------------

def layer_types(config: Any) -> list[str]:
    """The cache layer type of every decoder layer (``full_attention``, ``sliding_attention``,
    ``linear_attention``, ``conv``, ``hybrid``, ``dummy``...), as this release's caches read them from the config:
    ``cache_utils.get_layer_types_and_kwargs`` (5.x); before it, ``config.layer_types`` when the config has it,
    else every layer sliding when ``sliding_window`` is set and not switched off (Qwen2/Qwen3 configs carry a
    ``sliding_window`` with ``use_sliding_window=False``: full attention), full otherwise."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    reader = getattr(cache_utils, "get_layer_types_and_kwargs", None)
    if reader is not None:
        return list(reader(text)[0])
    declared = getattr(text, "layer_types", None)
    if declared:
        return list(declared)
    sliding = getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True) is not False
    return ["sliding_attention" if sliding else "full_attention"] * text.num_hidden_layers


def mla_caches_latent() -> bool:
    """Whether this release's DeepSeek-V2/V3 attention caches the compressed latent (``kv_lora_rank`` as keys,
    the rotary key ``qk_rope_head_dim`` as values, one head) and expands it every step (``expand_kv``), rather
    than caching the expanded per-head K and V."""
    try:
        from transformers.models.deepseek_v2 import modeling_deepseek_v2
    except ImportError:
        return False
    return hasattr(modeling_deepseek_v2.DeepseekV2Attention, "expand_kv")


def stored_bytes(cache: Any) -> int:
    """Bytes a cache actually stores: every distinct tensor its layer objects (4.54+) or its ``key_cache`` /
    ``value_cache`` lists (up to 4.53; a PagedAttentionCache's pools up to 5.17) hold, quantized data and scales
    included, each once (a view of a buffer counts the part it spans); a PagedAttentionCache from 5.18 keeps one flat
    ``cache_tensor`` (the whole pool, its two trash sectors included)."""
    seen: set[tuple] = set()
    total = 0

    def visit(value: Any, depth: int = 0) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            if value.numel() > 1:  # scalars (lengths, windows) are bookkeeping, not storage
                key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape),
                       tuple(value.stride()))
                if key not in seen:
                    seen.add(key)
                    total += value.numel() * value.element_size()
        elif depth < 3 and isinstance(value, dict):
            for item in value.values():
                visit(item, depth + 1)
        elif depth < 3 and isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth + 1)
        elif depth < 2 and hasattr(value, "__dict__") and not isinstance(value, type):
            for item in vars(value).values():
                visit(item, depth + 1)

    if has_layer_objects(cache):
        layers = cache.layers
    elif hasattr(cache, "key_cache"):
        layers = [cache.key_cache, cache.value_cache]
    else:  # a PagedAttentionCache from 5.18: one flat pool for every layer
        layers = [getattr(cache, "cache_tensor", None)]
    for layer in layers:
        visit(layer, 1)
    return total
