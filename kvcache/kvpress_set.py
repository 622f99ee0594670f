"""The kvpress presses the suite counts (docs/cache-classes.md, "kvpress presses"; the ``kvpress`` workflow): load
it as a plug-in, ``pytest benchmarks -p kvcache.kvpress_set --kv-caches knorm,...``. Each line registers one press
as a cache class (:func:`kvcache.caches.register_press`); without kvpress installed each is skipped with the reason.
Importing it imports neither torch nor kvpress."""

from kvcache.caches import register_press

#: {class name: the press, among kvpress's names}: half the context kept by each prefill press.
PRESSES = {
    "knorm": "KnormPress(compression_ratio=0.5)",
    "random": "RandomPress(compression_ratio=0.5)",
    "snapkv": "SnapKVPress(compression_ratio=0.5)",
    "streaming": "StreamingLLMPress(compression_ratio=0.5)",
    "adakv": "AdaKVPress(KnormPress(compression_ratio=0.5))",
    "decoding": "DecodingPress(KnormPress())",  # compresses every compression_interval (512) decode steps
}

for _name, _press in PRESSES.items():
    register_press(_name, _press, replace=True)
