"""A user's own attention function, registered through Transformers' ``AttentionInterface`` by a module loaded with
``-p`` (``pytest benchmarks -p kv_extra_read --kv-attn sdpa,extra_read``): the release's SDPA plus one extra full
read of K and V (``key.sum()``, ``value.sum()``).

Prediction: exactly +1.00 counted pass over the same class under ``sdpa``, named ``sum 1.00`` in the per-op breakdown
(each sum reads its whole tensor once and writes one number; K and V together are the KV bytes the step sees).
"""

from transformers import modeling_utils
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "extra_read"


def extra_read_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA, after reading all of K and all of V once more (their sums, kept so nothing is optimised away)."""
    module.kv_extra_read = (key.sum(), value.sum())
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


modeling_utils.AttentionInterface.register(NAME, extra_read_attention)
try:  # 4.53+: a custom name gets no causal mask unless a mask function is registered for it
    from transformers import masking_utils

    masking_utils.AttentionMaskInterface.register(NAME, masking_utils.sdpa_mask)
except ImportError:
    pass
