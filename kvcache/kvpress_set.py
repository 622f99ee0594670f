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
    # compresses to target_size every compression_interval decode steps (kvpress's defaults 2048 and 512; 128 and 16
    # here, so that the counted contexts, 256 and 512, are compressed and a counted window covers the period):
    # counted amortised over those steps
    "decoding": "DecodingPress(KnormPress(), compression_interval=16, target_size=128)",
}

for _name, _press in PRESSES.items():
    register_press(_name, _press, replace=True)
