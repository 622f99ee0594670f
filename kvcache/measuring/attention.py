"""Attention implementations crossed with cache classes (``--kv-attn``): a class under an implementation other than
the default ``sdpa`` is keyed ``<cache>@<attention>`` (``dynamic@eager``) and resolves to a
:class:`~kvcache.measuring.cachespec.CacheSpec` derived from the class's (:func:`derived`); :func:`known` names the
accepted implementations (the release's, those of releases since 4.45, Hub kernels, and those registered by ``-p``
modules, conftest files or the ``kvcache_passes.attention`` entry points). Transformers is imported only when a
non-default name is asked about. docs/attention.md."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from typing import Any

from kvcache.analysing import decoding
from kvcache.analysing.records.counted import Probe
from kvcache.measuring.cachespec import CacheSpec, EntryPoints, Unsupported

DEFAULT = "sdpa"  # what kvcache.measuring.compat.from_config builds every model with: its records keep plain names
SEPARATOR = "@"
#: names some release since 4.45 knows: where the installed one lacks them they are skipped, not a usage error
EVER_KNOWN = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4",
              "paged|sdpa", "paged|eager", "paged|flash_attention_2", "paged|flash_attention_3", "sdpa_paged",
              "eager_paged")
HUB_KERNEL = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w.-]+)?(:[\w.-]+)?$")
PAGING = ("paged|", "sdpa_paged", "eager_paged")  # names that read a paged cache (a prefix or whole names)

#: The entry points installed packages register attention functions through: each names a function called with no
#: argument that registers; one that failed is named in unknown-name errors.
ATTENTION_ENTRY_POINTS = EntryPoints("kvcache_passes.attention", lambda register: register())
_DERIVED: dict[str, CacheSpec] = {}


class AttentionError(ValueError):
    """A ``--kv-attn`` value (or a ``<cache>@<attention>`` key) naming no implementation; one line."""


def record_key(cache: str, attention: str) -> str:
    """The record key of ``cache`` under ``attention``: the class's name under the default, else ``cache@attention``."""
    return cache if attention == DEFAULT else f"{cache}{SEPARATOR}{attention}"


def split(name: str) -> tuple[str, str | None]:
    """``"dynamic@eager"`` -> ``("dynamic", "eager")``; a plain class name -> ``(name, None)``. A class name never
    holds ``@`` (``register_cache`` refuses it), so the first ``@`` separates (a Hub kernel may hold another)."""
    if SEPARATOR not in name:
        return name, None
    cache, attention = name.split(SEPARATOR, 1)
    return cache, attention


def paging(name: str) -> bool:
    """Whether ``name`` is an implementation that reads a paged cache (``paged|sdpa``, ``sdpa_paged`` ...)."""
    return name.startswith(PAGING[0]) or name in PAGING[1:]


def registered() -> list[str]:
    """The names in the installed release's attention registry (``AttentionInterface`` 4.51+, the
    ``ALL_ATTENTION_FUNCTIONS`` dict 4.48-4.50; none up to 4.47), what plug-ins registered included."""
    from transformers import modeling_utils

    interface = getattr(modeling_utils, "AttentionInterface", None)
    if interface is not None:
        return list(getattr(interface, "_global_mapping", {}) or {})
    functions = getattr(modeling_utils, "ALL_ATTENTION_FUNCTIONS", None)
    return list(functions) if isinstance(functions, dict) else []


def takes_paged_prefix() -> bool:
    """Whether the release strips a ``paged|`` prefix off any name (5.x: ``paged|sdpa`` is SDPA over a paged cache)."""
    import inspect

    from transformers import modeling_utils

    interface = getattr(modeling_utils, "AttentionInterface", None)
    try:
        return 'removeprefix("paged|")' in inspect.getsource(interface.get_interface)
    except (OSError, TypeError, AttributeError):
        return False


def release_knows() -> list[str]:
    """Every implementation the installed release can run a model under: ``eager``, ``sdpa``, its registry, and
    ``paged|<name>`` of each where it takes that prefix."""
    ATTENTION_ENTRY_POINTS.load()
    names = ["eager", "sdpa", *registered()]
    if takes_paged_prefix():
        names += [f"paged|{n}" for n in list(names) if not paged_or_internal(n)]
    return list(dict.fromkeys(names))


def paged_or_internal(name: str) -> bool:
    return paging(name) or name.startswith("kvcache_")


def known() -> list[str]:
    """What ``--kv-attn`` accepts here: :func:`release_knows` and :data:`EVER_KNOWN` (a Hub kernel besides)."""
    return list(dict.fromkeys([*release_knows(), *EVER_KNOWN]))


def unknown_attention(prefix: str, name: str) -> AttentionError:
    return AttentionError(f"{prefix}unknown attention implementation {name!r}; this release accepts: "
                          f"{', '.join(known())}, a Hub kernel owner/repo[:function], or a name registered in "
                          f"AttentionInterface by a -p module, conftest.py or an entry point in "
                          f"{ATTENTION_ENTRY_POINTS.group}{ATTENTION_ENTRY_POINTS.failed()}")


def accepted(name: str, prefix: str = "--kv-attn: ") -> str:
    """``name`` if accepted (:func:`known`, or a Hub kernel), else a one-line :class:`AttentionError`."""
    if name in known() or HUB_KERNEL.match(name):
        return name
    raise unknown_attention(prefix, name)


def parse_attentions(text: str) -> list[str]:
    """``"sdpa,eager"`` -> names, each once; empty or an unknown name is a one-line :class:`AttentionError`."""
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    if not names:
        raise AttentionError(f"--kv-attn {text!r} names no attention implementation (e.g. sdpa,eager)")
    return [accepted(name) for name in dict.fromkeys(names)]


def cross(caches: list[str] | tuple[str, ...], attentions: list[str]) -> list[str]:
    """Every class under every implementation, class by class: the keys a run measures (:func:`record_key`), each
    once; a ``--kv-caches`` entry that already names its attention (``dynamic@eager``) is kept as it is, and one that
    names a decoding strategy keeps it last (``dynamic#beam:4`` -> ``dynamic@eager#beam:4``)."""
    out = []
    for cache in caches:
        keyed, strategy = decoding.split_strategy(cache)  # dynamic#beam:4 under eager: dynamic@eager#beam:4
        out += [decoding.strategy_key(keyed if SEPARATOR in keyed else record_key(keyed, attention), strategy)
                for attention in attentions]
    return list(dict.fromkeys(out))


def derived(base: CacheSpec, attention: str) -> CacheSpec:
    """``base`` under ``attention``, named :func:`record_key`; its ``prepare`` raises :class:`compat.Unsupported` with
    the reason when the pair cannot run here (:func:`pair_reason`, :func:`attention_unavailable_reason`)."""
    name = record_key(base.name, attention)
    if name == base.name:
        return base
    if name in _DERIVED and _DERIVED[name].build is base.build:
        return _DERIVED[name]
    own = base.prepare
    runs = runs_as(attention)

    def prepare() -> None:
        reason = pair_reason(base, attention) or attention_unavailable_reason(runs)
        if reason:
            raise Unsupported(reason)
        if "flex" in attention:
            count_higher_order_ops()
        if own is not None:
            own()
    spec = dataclasses.replace(base, name=name, attention=runs, prepare=prepare, in_all=False)
    _DERIVED[name] = spec
    return spec


def copies_factor(probe: Probe | None, heads: int, kv_heads: int, layer_bytes: list[int]) -> float:
    """Cache sizes the attention implementation's own K/V copies hold at a step's peak, beyond what the class
    holds: where the probe saw K/V expanded to every query head (``repeat_kv``: eager, flex_attention with a head
    count that is not a power of two, SDPA before 4.54), one layer's K and V copied ``heads / kv_heads`` times, live
    while that layer attends: ``heads / kv_heads`` × the largest layer's share of the KV bytes (``layer_bytes``: KV
    bytes per token of each layer). 0 where nothing was expanded. The class's declared ``memory_factor`` does not
    cover these (they belong to the attention, not the cache), so the memory check adds them
    (:func:`kvcache.measuring.counting.memory.memory_passes`)."""
    if probe is None or not probe.expansions or kv_heads <= 0 or not layer_bytes or sum(layer_bytes) <= 0:
        return 0.0
    return heads / kv_heads * max(layer_bytes) / sum(layer_bytes)


#: the two spellings of the paged implementations: ``eager_paged``/``sdpa_paged`` (4.53-4.57), ``paged|…`` (5.x)
ALIASES = {"paged|eager": "eager_paged", "paged|sdpa": "sdpa_paged", "eager_paged": "paged|eager",
           "sdpa_paged": "paged|sdpa"}


def runs_as(attention: str) -> str:
    """The name the installed release runs ``attention`` under: itself, or its other spelling (:data:`ALIASES`)
    where only that one is known here, so that one command line serves every release."""
    alias = ALIASES.get(attention)
    if alias is None:
        return attention
    try:
        names = release_knows()
    except ImportError:
        return attention
    return alias if attention not in names and alias in names else attention


def pair_reason(base: CacheSpec, attention: str) -> str | None:
    """Why class ``base`` cannot run under ``attention`` whatever the machine, or None: a class that brings its own
    attention runs with that only (a paging one also under the other ``paged|`` names); a ``paged|`` name needs a
    class that pages."""
    pages = base.point is not None and not base.pads  # the paged class: its own point over a block pool
    if paging(attention):
        if not pages:
            return (f"{base.name} does not page its cache: {attention} reads a paged cache (it goes with the paged "
                    "class)")
        return None
    if base.attention != DEFAULT:
        own = "the release's SDPA over a paged cache" if pages else base.attention
        return (f"{base.name} brings its own attention ({own}) and runs with it only, not {attention} "
                f"(its records under its own name are that attention)")
    return None


def attention_unavailable_reason(attention: str, device_type: str | None = None) -> str | None:
    """Why ``attention`` cannot run on this machine and release, or None: a release without it, ``flash_*`` without a
    CUDA GPU or its package, a Hub kernel without the ``kernels`` package or with the Hub offline."""
    from kvcache.measuring import compat

    if device_type is None:
        import torch

        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if HUB_KERNEL.match(attention) and attention not in release_knows():
        if importlib.util.find_spec("kernels") is None:
            return f"Hub kernel {attention}: the kernels package is not installed (pip install kernels)"
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
            return f"Hub kernel {attention}: the Hub is out of reach (HF_HUB_OFFLINE is set)"
        return None
    if attention not in release_knows():
        return f"attention {attention!r} is not available in transformers {compat.TRANSFORMERS}"
    bare = attention.removeprefix("paged|")
    if bare.startswith("flash_attention"):
        if device_type != "cuda":
            return f"{attention} needs a CUDA GPU (this run is on {device_type})"
        if importlib.util.find_spec("flash_attn") is None and importlib.util.find_spec("kernels") is None:
            return f"{attention} needs the flash-attn package (or kernels) installed"
    return None


def switch(model: Any, name: str) -> None:
    """Run a built model under ``name``: ``set_attn_implementation`` (4.54+), else the config attribute read at call
    time (4.48+); up to 4.47, where attention classes are bound when the model is built, ``eager`` and ``sdpa`` by
    swapping every attention module's class for the release's class of that name (same parameters, a subclass of one
    another); anything else there is :class:`compat.Unsupported`."""
    from kvcache.measuring import compat

    if compat.attention_name(model) == name:
        return
    if name == DEFAULT and getattr(model, "_supports_sdpa", True) is False:
        return  # an architecture without SDPA (an arch: model): the plain class runs its default, named in the record
    if compat.has_attention_registry() or hasattr(model, "set_attn_implementation"):
        compat.set_attention(model, name)
        return
    swap_attention_classes(model, name)


def swap_attention_classes(model: Any, name: str) -> None:
    """Up to 4.47: every attention module of ``model`` becomes ``<MODEL>_ATTENTION_CLASSES[name]`` of its own modeling
    module (the classes share their parameters), and the configs say ``name`` (the causal mask follows it)."""
    import sys

    from kvcache.measuring import compat

    swapped = 0
    for module in model.modules():
        table = next((value for attr, value in vars(sys.modules[type(module).__module__]).items()
                      if attr.endswith("_ATTENTION_CLASSES") and isinstance(value, dict)
                      and type(module) in value.values()), None)
        if table is None:
            continue
        target = table.get(name)
        if target is None:
            raise compat.release_lacks(f"attention {name!r} for {type(module).__name__}")
        module.__class__ = target
        swapped += 1
    if not swapped:
        raise compat.release_lacks(f"switching a built {type(model).__name__}'s attention to {name!r}")
    model.config._attn_implementation = name
    for module in model.modules():
        if getattr(module, "config", None) is not None:
            module.config._attn_implementation = name


def uncompiled(attention: str) -> Any:
    """A context in which dynamo is off while a step under ``attention`` is counted, for the implementations whose
    Transformers code compiles parts of itself (``flex_attention``: the kernel and ``create_block_mask``). With dynamo
    on, whether such a cached graph runs or the frame is skipped under the counter's dispatch mode would depend on
    what was compiled before in the session, and so would the count; with dynamo off every op is dispatched and
    counted, each time. A no-op context for every other implementation."""
    import contextlib

    if "flex" not in attention:
        return contextlib.nullcontext()
    import torch

    return torch._dynamo.config.patch(disable=True)


def compile_failure(attention: str, exc: BaseException) -> str | None:
    """The skip reason when ``exc`` is Transformers' own ``torch.compile`` of ``flex_attention`` failing (it compiles
    flex_attention on every call outside a compiled forward; e.g. 4.51-4.53 ask for ``return_lse`` on CPU, which
    inductor refuses), else None (any other failure stays the class's own)."""
    if "flex" not in attention:
        return None
    names = {cls.__name__ for cls in type(exc).__mro__}
    if not names & {"InductorError", "BackendCompilerFailed", "LoweringException"}:
        return None
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = next((line for line in lines if "NotImplementedError" in line or "Error:" in line), lines[0] if lines
                 else type(exc).__name__)
    return f"{attention} does not compile here (Transformers compiles it on every call): {first[:300]}"


# --- higher-order attention operators under the suite's dispatch modes --------------------------------------------

class _Named:
    """A higher-order operator (``flex_attention``) dressed as one ATen op for the suite's dispatch modes: its name as
    ``overloadpacket.__name__``, a schema with no argument written in place, called as itself."""

    def __init__(self, hop: Any, name: str) -> None:
        self.hop = hop
        self.overloadpacket = type("Packet", (), {"__name__": name})()
        self._schema = type("Schema", (), {"arguments": []})()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.hop(*args, **kwargs)

    def __str__(self) -> str:
        return self.overloadpacket.__name__


_RULED: set[type] = set()


def count_higher_order_ops() -> None:
    """Make ``torch.ops.higher_order.flex_attention`` pass through every dispatch mode of this package (the traffic
    counter, the memory tracker) as one op: reads each distinct input once (query, key, value, the block mask's
    tensors) and writes its outputs, as ``scaled_dot_product_attention`` is charged (a fused kernel counted once).
    Without a rule for a mode, torch refuses the operator under it (``NotImplementedError``). Idempotent."""
    import importlib

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    for module in ("traffic", "memory", "compiled"):  # their modes must exist before they are ruled
        try:
            importlib.import_module(f"kvcache.measuring.{module}")
        except ImportError:
            pass

    hop = getattr(torch.ops.higher_order, "flex_attention", None)
    if hop is None:
        return
    # flex_attention outside a compiled frame (only under a dispatch mode here: Transformers calls it compiled, and a
    # dispatch mode makes dynamo skip that frame) wraps the operator in a fullgraph dynamo trace, which cannot trace
    # a mode's Python; this flag makes it call the operator directly (the unfused math, counted as one op)
    flex_module = importlib.import_module("torch.nn.attention.flex_attention")
    if hasattr(flex_module, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"):
        flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    named = _Named(hop, "flex_attention")
    stack, modes = list(TorchDispatchMode.__subclasses__()), []
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__module__.startswith("kvcache.") and cls not in _RULED:
            modes.append(cls)
    for cls in modes:
        hop.py_impl(cls)(lambda mode, *args, **kwargs: mode.__torch_dispatch__(named, (), args, kwargs))
        _RULED.add(cls)
