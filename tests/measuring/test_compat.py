"""kvcache.measuring.compat on the installed Transformers release (fast), and optionally the counted suite on another
release installed with ``pip install --target DIR transformers==X`` (set KVCACHE_OTHER_TRANSFORMERS=DIR)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.measuring import (  # noqa: E402
    caches,
    compat,  # noqa: E402
)
from kvcache.measuring.caches import CacheRequest  # noqa: E402
from kvcache.measuring.models import build_model, load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DTYPE = torch.bfloat16
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def config():
    return load_config("tiny")[0]


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", CPU, "bfloat16", seed=0)[0]


def _kv(n: int, seed: int) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 3, n, 64, generator=gen).to(DTYPE) for _ in range(2))


@pytest.mark.parametrize("name", list(caches.registry()))
def test_cache_class_builds_and_fills(config, name):
    """Every class this release offers builds through the compat helpers; fill_layer and seq_length agree."""
    spec = caches.get(name)
    reason = caches.unavailable_reason(spec, CPU.type)
    if reason is not None:
        assert reason.strip(), "a skipped class must say why"
        pytest.skip(reason)
    cache = spec.build(CacheRequest(config, 64, CPU, DTYPE))
    layers = config.num_hidden_layers
    for layer in range(layers):
        compat.fill_layer(cache, layer, *_kv(10, layer), start=0)
    assert compat.seq_length(cache) == 10
    for layer in range(layers):
        compat.fill_layer(cache, layer, *_kv(3, 100 + layer), start=10)
    assert compat.seq_length(cache) == 13
    if not name.startswith("quantized"):  # quantized caches keep their own storage
        keys, values = compat.layer_kv(cache, layers - 1)
        assert keys.dtype == DTYPE and values.dtype == DTYPE  # up to 4.55 StaticCache defaults to float32
        assert keys.shape[-2] >= 13 and keys.shape[1] == config.num_key_value_heads


def test_static_cache_holds_the_model_dtype(config):
    cache = compat.new_cache(compat.cache_class("StaticCache"), config, 32, CPU, DTYPE)
    compat.fill_layer(cache, 0, *_kv(4, 0), start=0)
    keys, _ = compat.layer_kv(cache, 0)
    assert keys.dtype == DTYPE and keys.shape[-2] == 32


def test_decode_kwargs_picks_this_releases_keywords(model):
    params = inspect.signature(type(model.model).forward).parameters
    cache = compat.new_dynamic_cache(model.config)
    kwargs = compat.decode_kwargs(model, cache, 0, CPU)
    expected = "cache" if "cache" in params else "past_key_values"
    assert kwargs[expected] is cache
    assert ({"cache", "past_key_values"} - {expected}).isdisjoint(kwargs)
    assert ("cache_position" in kwargs) == ("cache_position" in params)
    assert kwargs["position_ids"].tolist() == [[0]]
    # and the keywords drive a real forward: the cache grows by one token per step
    with torch.inference_mode():
        for position in range(3):
            kwargs = compat.decode_kwargs(model, cache, position, CPU)
            out = model(input_ids=torch.tensor([[position + 1]]), **kwargs)
            cache = compat.cache_from_output(out) or cache
    assert compat.seq_length(cache) == 3
    assert out.logits.shape[:2] == (1, 1)


def test_unsupported_keyword_is_a_skip_reason(config):
    with pytest.raises(compat.Unsupported, match="transformers"):
        compat.dynamic_init_kwargs(config, no_such_keyword=True)


# --- another release, through PYTHONPATH ----------------------------------------------------------------

OTHER = os.environ.get("KVCACHE_OTHER_TRANSFORMERS", "")


@pytest.mark.skipif(not OTHER, reason="set KVCACHE_OTHER_TRANSFORMERS to a pip --target dir with another release")
def test_counted_suite_on_another_release(tmp_path):
    target = Path(OTHER).resolve()
    assert (target / "transformers").is_dir(), f"{target} holds no transformers package"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), env.get("PYTHONPATH", "")) if p)
    release = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"],
                             capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout.strip()
    out = tmp_path / "counted.json"
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-m", "counted", "--kv-model", "tiny",
           "--kv-caches", "dynamic,static", "--kv-no-gate", "--kv-warmup", "1", "-p", "no:cacheprovider", "-q",
           "--benchmark-json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    kv = json.loads(out.read_text())["kv"]
    assert kv["environment"]["transformers"] == release
    traffic = kv["traffic"]
    assert set(traffic) == {"dynamic", "static"}, kv["skipped"]
    dynamic, static = traffic["dynamic"], traffic["static"]
    # DynamicCache: torch.cat reads and writes the cache (2 passes) in every release; attention reads it
    # once with native GQA (4.54+ on CPU) or, where K/V are expanded with repeat_kv, 4 + 3 passes more.
    assert dynamic["by_op"]["cat"] == pytest.approx(2.0, abs=0.01)
    assert dynamic["passes"] == pytest.approx(3.0, abs=0.05) or dynamic["passes"] == pytest.approx(9.0, abs=0.05)
    # StaticCache: no cat; attention over the whole buffer, K/V expanded 3 -> 9 heads (about 7) or not (about 1)
    assert "cat" not in static["by_op"]
    assert 0.95 <= static["passes"] <= 7.3
