"""Field replays of two beam-search reorder bugs, counted with the suite's own counter
(:func:`kvcache.measuring.counting.traffic.count`) on the releases before and after each fix (docs/decoding.md,
"Field replays"). Each release is installed side by side by :mod:`kvcache.analysing.releases` and replayed in a Python
of its own (``PYTHONPATH``: the release first); each replay prints one JSON line.

- ``recurrent`` (transformers #46612, fixed by PR #46819 in 5.13.0): beam search on a tiny random-weight Mamba
  (cache passed as ``cache_params``, not ``past_key_values``). Counted: the bytes ``Cache.reorder_cache`` reads and
  writes over the generate call, per beam step and per byte of recurrent state the cache holds (conv + ssm states,
  all beams). Before the fix the reorder is never called: 0 bytes.
- ``quantized`` (PR #45510 / #48700, fixed in 5.19.0): beam search on a tiny random-weight Llama with a
  ``QuantizedCache`` (quanto, int4, residual 4 tokens). Counted: the bytes ``Cache.reorder_cache`` moves and the
  bytes the forwards' ``index_select`` moves (where 5.19.0 applies the deferred reorder of the quantized states),
  per beam step and per byte of the cache's full-precision equivalent. Before the fix only the residual moves.

    python scripts/field_replays.py [--replays recurrent,quantized] [--releases 5.12.1,5.13.0]
                                    [--root /work/pkgs/releases] [--extra-path /work/pkgs/quanto]

Bytes are read + written (the counter's rules, docs/how-it-measures.md); nothing is timed."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPLAYS = {
    "recurrent": ("5.12.1", "5.13.0"),  # transformers #46612 / PR #46819
    "quantized": ("5.18.0", "5.19.0"),  # PR #45510 / #48700
}
BEAMS, NEW_TOKENS, PROMPT = 4, 6, 8


def _counted_generate(model, cache):  # pragma: no cover - runs in the child, on the release under test
    """Beam-search generate with ``Cache.reorder_cache`` and the model's forward each counted; returns the totals."""
    import torch
    from transformers import GenerationConfig
    from transformers.cache_utils import Cache

    from kvcache.measuring.counting.traffic import count

    totals = {"reorder_calls": 0, "reorder_bytes": 0, "forward_calls": 0, "forward_index_select_bytes": 0}
    original_reorder, original_forward = Cache.reorder_cache, model.forward

    def reorder(self, beam_idx):
        result, counted = count(original_reorder, self, beam_idx)
        totals["reorder_calls"] += 1
        totals["reorder_bytes"] += counted.total
        return result

    def forward(*args, **kwargs):
        result, counted = count(original_forward, *args, **kwargs)
        totals["forward_calls"] += 1
        op = counted.ops.get("index_select")
        totals["forward_index_select_bytes"] += op.total if op else 0
        return result

    Cache.reorder_cache = reorder
    model.forward = forward
    try:
        torch.manual_seed(0)
        ids = torch.randint(3, model.config.vocab_size, (1, PROMPT))
        config = GenerationConfig(num_beams=BEAMS, num_return_sequences=1, max_new_tokens=NEW_TOKENS,
                                  min_new_tokens=NEW_TOKENS, do_sample=False, early_stopping=False, use_cache=True)
        kwargs = {"past_key_values": cache} if cache is not None else {}
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, **kwargs)
    finally:
        Cache.reorder_cache = original_reorder
        model.forward = original_forward
    totals["tokens"] = out[0, PROMPT:].tolist()
    totals["beam_steps"] = out.shape[1] - PROMPT  # generate reorders the cache after every generated token
    return totals


def _state_bytes(cache) -> int:  # pragma: no cover - runs in the child
    """Bytes of every tensor of one or more dimensions the cache's layers hold (all beams; in attributes, or in dicts
    and lists of them as 5.25 keeps its states), each storage once."""
    import torch

    seen: dict[int, int] = {}

    def visit(value):
        if isinstance(value, torch.Tensor):
            if value.dim() > 0:
                seen[value.data_ptr()] = value.numel() * value.element_size()
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    for layer in getattr(cache, "layers", []):
        visit(vars(layer))
    return sum(seen.values())


def replay_recurrent() -> dict:  # pragma: no cover - runs in the child
    """#46612: a 2-layer Mamba (random weights, seed 0) decoding with 4 beams."""
    import torch
    import transformers
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    config = MambaConfig(vocab_size=256, hidden_size=64, state_size=16, num_hidden_layers=2, expand=2, conv_kernel=4,
                         pad_token_id=0, eos_token_id=1, bos_token_id=2)
    model = MambaForCausalLM(config).eval()
    caches = []
    original_forward = MambaForCausalLM.forward

    def keep(self, *args, **kwargs):
        out = original_forward(self, *args, **kwargs)
        cache = getattr(out, "cache_params", None) or getattr(out, "cache", None)
        if cache is not None:
            caches.append(cache)
        return out

    MambaForCausalLM.forward = keep
    try:
        totals = _counted_generate(model, None)
    finally:
        MambaForCausalLM.forward = original_forward
    state = _state_bytes(caches[-1]) if caches else 0
    return {"replay": "recurrent", "release": transformers.__version__, "state_bytes": state, **totals,
            "reorder_passes_per_step": _per(totals["reorder_bytes"], totals["beam_steps"] * state)}


def replay_quantized() -> dict:  # pragma: no cover - runs in the child
    """#45510 / #48700: a QuantizedCache (quanto int4, q_group_size 16, residual 4 tokens) of a 2-layer Llama geometry
    (2 KV heads, head_dim 16, float32), 4 beams: filled with 8 tokens (all quantized), one token decoded (the residual
    holds 1), then ``reorder_cache`` (counted) and one more token (counted: the next update, where 5.19.0 applies the
    deferred reorder to the dequantized states). ``quantized_reordered``: whether beam 0 then reads what beam 1 held.
    Then the same through ``generate(num_beams=4)`` on a random-weight model: its outcome."""
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.cache_utils import QuantizedCache

    from kvcache.measuring.counting.traffic import count

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=0, eos_token_id=1, bos_token_id=2)
    heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads

    def new_cache():
        return QuantizedCache(backend="quanto", config=config, nbits=4, q_group_size=16, residual_length=4)

    cache = new_cache()
    states = lambda n: (torch.randn(BEAMS, heads, n, dim), torch.randn(BEAMS, heads, n, dim))  # noqa: E731
    for layer in range(config.num_hidden_layers):
        cache.update(*states(PROMPT), layer)
        cache.update(*states(1), layer)
    before = [cache.layers[i]._dequantize(cache.layers[i]._quantized_keys) for i in range(config.num_hidden_layers)]
    residual = sum(layer.keys.numel() * 4 + layer.values.numel() * 4 for layer in cache.layers)
    beam_idx = torch.tensor([1, 0, 3, 2])
    _, reorder = count(cache.reorder_cache, beam_idx)
    update_index_select, reordered = 0, True
    for layer in range(config.num_hidden_layers):
        (keys, _), counted = count(cache.update, *states(1), layer)
        op = counted.ops.get("index_select")
        update_index_select += op.total if op else 0
        reordered = reordered and torch.allclose(keys[0, :, :PROMPT], before[layer][1])
    quantized_equivalent = 2 * config.num_hidden_layers * BEAMS * heads * PROMPT * dim * 4
    out = {"replay": "quantized", "release": transformers.__version__, "residual_bytes": residual,
           "quantized_full_precision_bytes": quantized_equivalent, "reorder_bytes": reorder.total,
           "next_update_index_select_bytes": update_index_select, "quantized_reordered": bool(reordered)}
    model = LlamaForCausalLM(config).eval()
    try:
        _counted_generate(model, new_cache())
        out["generate"] = "ran"
    except Exception as error:  # noqa: BLE001 - the release's own failure is the finding
        out["generate"] = f"{type(error).__name__}: {error}"
    return out


def _per(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 3) if denominator else None


def child(name: str) -> None:  # pragma: no cover - runs in the child
    # The environment's `kernels` (hub kernels, CUDA only), which 5.12's hub_kernels.py refuses at import, is hidden
    # from a release installed without it by release_env (kvcache.analysing.releases.HIDDEN_UNLESS_INSTALLED).
    print(json.dumps({"recurrent": replay_recurrent, "quantized": replay_quantized}[name]()))


def main(argv: list[str] | None = None) -> int:
    from kvcache.analysing.releases import ReleaseError, ensure, release_env

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replays", default=",".join(REPLAYS), help=f"comma-separated: {', '.join(REPLAYS)}")
    parser.add_argument("--releases", default=None, help="releases to replay on (default: each replay's before/after)")
    parser.add_argument("--root", default=str(ROOT / ".versions"), help="where releases are installed side by side")
    parser.add_argument("--extra-path", default="", help="PYTHONPATH entries after the release (e.g. optimum-quanto)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    names = [name.strip() for name in args.replays.split(",") if name.strip()]
    bad = [name for name in names if name not in REPLAYS]
    if bad:
        parser.error(f"--replays: unknown replay {bad[0]!r} (accepted: {', '.join(REPLAYS)})")
    failed = 0
    for name in names:
        releases = args.releases.split(",") if args.releases else list(REPLAYS[name])
        for release in releases:
            try:
                target = ensure(release, Path(args.root), sys.stderr)
            except ReleaseError as error:
                print(json.dumps({"replay": name, "release": release, "skipped": str(error)}))
                continue
            env = release_env(target)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), args.extra_path, str(ROOT)) if p)
            done = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True)
            if done.returncode:
                failed += 1
                last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                print(json.dumps({"replay": name, "release": release, "failed": last}))
            else:
                print(done.stdout.strip().splitlines()[-1])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
