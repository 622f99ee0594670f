"""A planted press (loaded with ``-p kv_press_twice``): the fake press of :mod:`kvcache.testing.press` (half the
context kept after the prefill), plus a decode-time hook that gathers each layer's kept K and V twice more per step
(every row, as a press that re-selects its tokens at each step would), registered as ``press-twice``.

Prediction: counted passes above the fake press's 1.50 per logical byte, so a counted gate bounded at 1.5 fails."""

import contextlib

import torch

from kvcache.caches import register_cache
from kvcache.measuring import compat
from kvcache.testing.press import FakePress, attention_modules


def gather_twice(module, args, kwargs, output):
    cache = next((kwargs[k] for k in ("past_key_values", "past_key_value", "cache") if kwargs.get(k) is not None),
                 None)
    if cache is None:
        return output
    keys, values = compat.layer_kv(cache, module.layer_idx)
    rows = torch.arange(keys.shape[-2], device=keys.device)[None, None, :, None]
    for _ in range(2):
        module.kv_gathered = (keys.gather(2, rows.expand_as(keys)), values.gather(2, rows.expand_as(values)))
    return output


@contextlib.contextmanager
def gathering(model):
    handles = [m.register_forward_hook(gather_twice, with_kwargs=True) for m in attention_modules(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


register_cache("press-twice", lambda request: compat.new_dynamic_cache(request.config), in_all=False,
               description="test-only: the fake press plus two gathers of the kept cache per decode step",
               fill_context=lambda model: FakePress(0.5)(model), decode_context=gathering)
