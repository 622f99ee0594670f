"""Every difference between Transformers releases (4.45 to 5.x) that this project meets, in one place.

Callers never compare version numbers themselves: they ask this package to build a cache, fill a layer, name the
forward keywords, or register an attention function, and get :class:`Unsupported` (with a reason fit for a skip
message) when the installed release cannot do it. Its modules, by concern: :mod:`.version` (the installed release
and the gates a development version cannot answer), :mod:`.construction` (building caches), :mod:`.storage` (a
cache's per-layer K/V, filling it, the bytes it stores), :mod:`.modeling` (building models, forward keywords,
attention functions, layer types). Callers use the names below: ``from kvcache.measuring import compat``.
"""

from kvcache.measuring.compat.construction import (
    OFFLOADED,
    cache_class,
    check_offloaded,
    check_quantized_backend,
    dynamic_init_kwargs,
    init_params,
    new_cache,
    new_dynamic_cache,
    new_quantized_cache,
    new_sink_cache,
    offloaded_dynamic,
    offloaded_static,
    own_params,
    quantized_residual_length,
    tiny_config,
)
from kvcache.measuring.compat.modeling import (
    attention_name,
    cache_from_output,
    cache_keyword,
    decode_kwargs,
    dtype_keyword,
    from_config,
    has_attention_registry,
    layer_types,
    meta_parameters,
    mla_caches_latent,
    register_attention,
    set_attention,
)
from kvcache.measuring.compat.storage import (
    add_layers,
    fill_layer,
    has_layer_objects,
    layer_kv,
    layer_kv_from_layers,
    layer_kv_from_lists,
    seq_length,
    store_layer_kv,
    store_layer_kv_in_layers,
    store_layer_kv_in_lists,
    stored_bytes,
)
from kvcache.measuring.compat.version import (
    TRANSFORMERS,
    VERSION,
    InstalledVersion,
    Unsupported,
    VersionPart,
    ambiguous_gates,
    exception_line,
    parse_version,
    release_lacks,
)

__all__ = [
    "OFFLOADED", "TRANSFORMERS", "VERSION", "InstalledVersion", "Unsupported", "VersionPart", "add_layers",
    "ambiguous_gates", "attention_name", "cache_class", "cache_from_output", "cache_keyword", "check_offloaded",
    "check_quantized_backend", "decode_kwargs", "dtype_keyword", "exception_line", "dynamic_init_kwargs", "fill_layer",
    "from_config", "has_attention_registry", "has_layer_objects", "init_params", "layer_kv", "layer_kv_from_layers",
    "layer_kv_from_lists", "layer_types", "meta_parameters", "mla_caches_latent", "new_cache", "new_dynamic_cache",
    "new_quantized_cache", "quantized_residual_length", "new_sink_cache", "offloaded_dynamic", "offloaded_static",
    "own_params", "parse_version",
    "register_attention", "release_lacks", "seq_length", "set_attention", "store_layer_kv", "store_layer_kv_in_layers",
    "store_layer_kv_in_lists", "stored_bytes", "tiny_config",
]
