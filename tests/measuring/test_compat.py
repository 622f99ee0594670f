"""kvcache.measuring.compat on the installed Transformers release: every class builds and fills, each per-release
function that applies here works on a real cache, the forward keywords drive a real step, the fp8 backend is
found by building one, and every class moves exactly the counted passes this release is known for (docs/releases.md,
"Across Transformers releases"). A release this module has no figures for (one newer than the newest measured, which
an unpinned ``pip install -e ".[test]"`` takes the day it ships) is reported as not yet measured (a skip naming the
commands that measure it), not a failure. With KVCACHE_OTHER_TRANSFORMERS=DIR (a release installed with ``pip install
--target DIR transformers==X``, as ``.ci/run`` does for 4.45.2) this module and the counted suite run again
under that release and must give its own known figures."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.analysing.releases import release_env  # noqa: E402
from kvcache.analysing.settings import Settings  # noqa: E402
from kvcache.measuring import caches, compat  # noqa: E402
from kvcache.measuring.caches import CacheRequest  # noqa: E402
from kvcache.measuring.configs import load_config  # noqa: E402
from kvcache.measuring.devices import Device  # noqa: E402
from kvcache.measuring.models import build_model  # noqa: E402
from kvcache.measuring.session import KVSession, Skipped  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DTYPE = torch.bfloat16
CPU = torch.device("cpu")
OTHER = os.environ.get("KVCACHE_OTHER_TRANSFORMERS", "")

# --- what each release is known to count -----------------------------------------------------------------
# Counted passes per class on the default model (SmolLM2-135M geometry, bf16, CPU), by release range
# (first release, first release after), from the docs/releases.md table "Across Transformers releases" (measured by
# `make versions`). A number is the counted passes (to the table's 2 decimals, so within 0.005); a string is
# what the reason of the class's skip says. Ranges are drawn around the releases that were measured.
TOLERANCE = 0.005
CLASSES = ("dynamic", "static", "inplace", "static-sliced", "sink", "quantized-fp8")
NO_REGISTRY = "no attention registry"
NO_SINK = "SinkCache is not available"
NO_FP8 = "fp8 backend of QuantizedCache is not available"
COUNTED_BY_RELEASE: dict[tuple[tuple[int, int], tuple[int, int]], dict[str, float | str]] = {
    ((4, 45), (4, 48)): {"dynamic": 9.00, "static": 7.01, "inplace": 7.00, "static-sliced": NO_REGISTRY,
                         "sink": 9.00, "quantized-fp8": NO_FP8},
    ((4, 48), (4, 52)): {"dynamic": 9.00, "static": 7.01, "inplace": 7.00, "static-sliced": 1.01,
                         "sink": 9.00, "quantized-fp8": NO_FP8},
    ((4, 53), (4, 54)): {"dynamic": 9.00, "static": 7.00, "inplace": 7.00, "static-sliced": 1.00,
                         "sink": NO_SINK, "quantized-fp8": NO_FP8},
    ((4, 54), (4, 56)): {"dynamic": 3.00, "static": 7.00, "inplace": 3.00, "static-sliced": 1.00,
                         "sink": NO_SINK, "quantized-fp8": NO_FP8},
    ((4, 56), (5, 21)): {"dynamic": 3.00, "static": 7.00, "inplace": 1.00, "static-sliced": 1.00,
                         "sink": NO_SINK, "quantized-fp8": NO_FP8},
    ((5, 21), (5, 23)): {"dynamic": 3.00, "static": 7.00, "inplace": 1.00, "static-sliced": 1.00,
                         "sink": NO_SINK, "quantized-fp8": 11.50},
    ((5, 23), (5, 26)): {"dynamic": 3.000, "static": 1.003, "inplace": 1.000, "static-sliced": 1.003,
                         "sink": NO_SINK, "quantized-fp8": 11.500},
}


def expected_counts(version: tuple[int, ...]) -> dict[str, float | str] | None:
    """The known counted passes (or skip reasons) of the release ``version``, or None if it was never measured."""
    for (first, after), expected in COUNTED_BY_RELEASE.items():
        if first <= version[:2] < after:
            return expected
    return None


NOT_YET_MEASURED = "not yet measured"


def unknown_release(release: str) -> str:
    """What a test says of a release it has no figures for: not yet measured (a skip, so that a user's unpinned
    install is not failed by a release that shipped after these figures), and how to measure it."""
    return (f"transformers {release} is {NOT_YET_MEASURED} here: measure it (`make versions VERSIONS_ARGS="
            f"\"--releases {release}\"`), then add its row to COUNTED_BY_RELEASE and the docs/releases.md table; "
            f"or install the release the Makefile pins ({MAKEFILE_PIN}), whose figures are known")


def makefile_pin() -> str | None:
    """The Transformers release ``make test`` installs (the Makefile's ``TRANSFORMERS ?= transformers==X``)."""
    match = re.search(r"^TRANSFORMERS \?= transformers==(\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    return match[1] if match else None


MAKEFILE_PIN = makefile_pin()


def check_counts(counted: dict[str, float], skipped: dict[str, str], expected: dict[str, float | str]) -> list[str]:
    """One line per class whose counted passes (``counted``) or skip reason (``skipped``) is not the expected one."""
    wrong = []
    for cache, want in expected.items():
        if isinstance(want, str):
            if want not in skipped.get(cache, ""):
                wrong.append(f"{cache}: expected a skip saying {want!r}, got "
                             f"{skipped.get(cache) or f'{counted.get(cache)} passes'}")
        elif cache not in counted or abs(counted[cache] - want) > TOLERANCE:
            wrong.append(f"{cache}: expected {want:.3f} passes, got {counted.get(cache, skipped.get(cache))}")
    return wrong


def test_expected_counts_cover_the_measured_releases():
    """The table's ranges do not overlap, and every release in the docs/releases.md table falls in one."""
    measured = ["4.45.2", "4.47.1", "4.48.3", "4.50.3", "4.51.3", "4.53.3", "4.54.1", "4.55.4", "4.56.2", "4.57.6",
                "5.0.0", "5.3.0", "5.4.0", "5.10.4", "5.17.0", "5.21.1", "5.22.2", "5.23.0", "5.24.0", "5.25.0"]
    for release in measured:
        version = compat.parse_version(release)
        assert sum(first <= version[:2] < after for first, after in COUNTED_BY_RELEASE) == 1, release
    assert expected_counts((4, 52, 0)) is None and expected_counts((5, 26, 0)) is None  # never measured
    assert check_counts({"dynamic": 3.004}, {}, {"dynamic": 3.0}) == []
    assert check_counts({"dynamic": 3.006}, {}, {"dynamic": 3.0}) == ["dynamic: expected 3.000 passes, got 3.006"]
    assert check_counts({"sink": 9.0}, {}, {"sink": NO_SINK}) == [
        f"sink: expected a skip saying {NO_SINK!r}, got 9.0 passes"]


def test_the_pinned_release_has_figures():
    """``make test`` installs a pinned release (as it pins torch), and this module knows its figures: a fresh clone
    is not turned red by a release that ships after it."""
    assert MAKEFILE_PIN, "the Makefile pins no Transformers release (TRANSFORMERS ?= transformers==X)"
    assert expected_counts(compat.parse_version(MAKEFILE_PIN)) is not None, unknown_release(MAKEFILE_PIN)


def test_an_unknown_release_is_not_yet_measured_not_a_failure(monkeypatch):
    """A release the table does not cover (here a newer one than any measured) is a skip saying it is not yet
    measured and how to measure it: not a failure, and not a pass either (``-rs`` lists it)."""
    monkeypatch.setattr(compat, "VERSION", (9, 99, 0))
    monkeypatch.setattr(compat, "TRANSFORMERS", "9.99.0")
    with pytest.raises(pytest.skip.Exception) as info:
        test_counted_passes_are_this_releases(({}, {}))
    assert str(info.value.msg).startswith("transformers 9.99.0 is not yet measured here: measure it (`make versions "
                                          'VERSIONS_ARGS="--releases 9.99.0"`)'), info.value.msg
    assert f"the Makefile pins ({MAKEFILE_PIN})" in info.value.msg


@pytest.fixture(scope="module")
def default_model_counts(one_torch_thread):
    """Counted passes of every class in CLASSES on the default model (skip reasons for those this release lacks)."""
    settings = Settings(model="smollm2-135m", device="cpu", dtype="bfloat16", warmup=2, counted_contexts=(256, 512))
    session = KVSession(settings, Device.from_choice("cpu"))
    counted, skipped = {}, {}
    for name in CLASSES:
        try:
            counted[name] = session.count(name).passes
        except Skipped:
            skipped[name] = next(s.reason for s in session.skipped if s.cache == name)
    return counted, skipped


def test_counted_passes_are_this_releases(default_model_counts):
    """Every class counts exactly what the docs/releases.md table says for the installed release."""
    expected = expected_counts(compat.VERSION)
    if expected is None:
        pytest.skip(unknown_release(compat.TRANSFORMERS))
    counted, skipped = default_model_counts
    assert check_counts(counted, skipped, expected) == [], (compat.TRANSFORMERS, counted, skipped)


# --- building, filling and reading caches -------------------------------------------------------------------

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
    reason = caches.cache_unavailable_reason(spec, CPU.type)
    if reason is not None:
        assert reason.strip(), "a skipped class must say why"
        pytest.skip(reason)
    if spec.point is not None:
        pytest.skip(f"{name} brings its own point, which builds and fills its cache (tests/measuring/test_paged.py)")
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


LAYERED = (4, 54)  # from this release caches keep one layer object per layer; before, key_cache/value_cache lists


def test_this_release_keeps_the_layout_compat_expects(config):
    """``has_layer_objects`` picks the function of this release's range for every kind of cache."""
    for cache in (compat.new_dynamic_cache(config), compat.new_cache(compat.cache_class("StaticCache"), config, 16,
                                                                      CPU, DTYPE)):
        assert compat.has_layer_objects(cache) == (compat.VERSION >= LAYERED), type(cache).__name__


def _step_logits(model, cache, position: int, token: int) -> torch.Tensor:
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([[token]]), **compat.decode_kwargs(model, cache, position, CPU))
    return out.logits[0, -1]


def _store_then_step(model, store) -> tuple[torch.Tensor, torch.Tensor]:
    """A dynamic cache given 12 tokens of K/V per layer by ``store`` and by ``fill_layer`` (through the cache's own
    update): the logits of one decode step on each."""
    stored, filled = compat.new_dynamic_cache(model.config), compat.new_dynamic_cache(model.config)
    for layer in range(model.config.num_hidden_layers):
        keys, values = _kv(12, layer)
        store(stored, layer, keys, values)
        compat.fill_layer(filled, layer, keys.clone(), values.clone(), start=0)
        got = compat.layer_kv(stored, layer)
        assert got[0] is keys and got[1] is values  # stored as given: no copy
    assert compat.seq_length(stored) == 12
    return _step_logits(model, stored, 12, 7), _step_logits(model, filled, 12, 7)


@pytest.mark.skipif(compat.VERSION < LAYERED, reason="layer objects: transformers 4.54+")
def test_store_layer_kv_in_layers_is_what_the_model_reads(model):
    """4.54+: K/V set on the layer objects make the same next step as K/V the cache appended itself."""
    stored, filled = _store_then_step(model, compat.store_layer_kv_in_layers)
    assert torch.equal(stored, filled)


@pytest.mark.skipif(compat.VERSION >= LAYERED, reason="key_cache/value_cache lists: transformers 4.45-4.53")
def test_store_layer_kv_in_lists_is_what_the_model_reads(model):
    """4.45-4.53: K/V set in the key/value lists make the same next step as K/V the cache appended itself."""
    stored, filled = _store_then_step(model, compat.store_layer_kv_in_lists)
    assert torch.equal(stored, filled)


@pytest.mark.skipif(compat.VERSION < LAYERED, reason="layer objects: transformers 4.54+")
def test_layer_kv_from_layers_reads_what_update_wrote(config):
    cache = compat.new_dynamic_cache(config)
    keys, values = _kv(5, 1)
    cache.update(keys, values, 1, {"cache_position": torch.arange(5)})
    got = compat.layer_kv_from_layers(cache, 1)
    assert torch.equal(got[0], keys) and torch.equal(got[1], values)


@pytest.mark.skipif(compat.VERSION >= LAYERED, reason="key_cache/value_cache lists: transformers 4.45-4.53")
def test_layer_kv_from_lists_reads_what_update_wrote(config):
    cache = compat.new_dynamic_cache(config)
    keys, values = _kv(5, 1)
    for layer in range(2):
        cache.update(keys, values, layer, {"cache_position": torch.arange(5)})
    got = compat.layer_kv_from_lists(cache, 1)
    assert torch.equal(got[0], keys) and torch.equal(got[1], values)


# --- forward keywords and quantized backends ------------------------------------------------------------------

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


FP8_FROM = (5, 21)


def test_fp8_backend_is_found_by_building_one(config):
    """The fp8 backend is there exactly from 5.21; where it is, a real cache of the model's config builds."""
    if compat.VERSION >= FP8_FROM:
        compat.check_quantized_backend("fp8")
        cache = compat.new_quantized_cache("fp8", config, CPU, DTYPE)
        compat.fill_layer(cache, 0, *_kv(4, 0), start=0)
        assert compat.seq_length(cache) == 4
    else:
        with pytest.raises(compat.Unsupported, match=NO_FP8):
            compat.check_quantized_backend("fp8")


def test_offloaded_classes_are_asked_of_the_release(monkeypatch):
    """Both offloaded classes and their prepare ask one rule (compat.check_offloaded): this release's code has an
    offloaded cache of that kind, or the skip reason names what it lacks."""
    from transformers import cache_utils

    for kind in ("dynamic", "static"):
        compat.check_offloaded(kind)  # a class of its own up to 4.55, offloading=True from 4.56
    monkeypatch.setattr(compat.construction, "own_params", lambda cls: frozenset())
    monkeypatch.delattr(cache_utils, "OffloadedStaticCache", raising=False)
    with pytest.raises(compat.Unsupported) as info:
        compat.offloaded_static(None, 64, "cpu", torch.bfloat16)
    assert str(info.value) == (f"an offloaded static cache (OffloadedStaticCache / StaticCache(offloading=True)) is "
                               f"not available in transformers {compat.TRANSFORMERS}")
    assert caches.cache_unavailable_reason(caches.get("offloaded-static"), "cuda") == str(info.value)


def test_an_unknown_backend_is_a_skip_naming_what_building_raised():
    with pytest.raises(compat.Unsupported) as info:
        compat.check_quantized_backend("no-such-backend")
    message = str(info.value)
    assert message.startswith(f"the no-such-backend backend of QuantizedCache is not available in transformers "
                              f"{compat.TRANSFORMERS}") and "\n" not in message


def test_a_backend_whose_construction_fails_is_a_skip(monkeypatch):
    """Whatever building raises (here a RuntimeError from a backend's kernels) is a skip with the reason."""
    def broken(*args, **kwargs):
        raise RuntimeError("fp8 kernels need a newer torch\nsecond line")

    monkeypatch.setattr(compat.construction, "new_quantized_cache", broken)
    with pytest.raises(compat.Unsupported, match=r"\(building one raised RuntimeError: fp8 kernels need a newer "
                                                 r"torch\)$"):
        compat.check_quantized_backend("fp8")
    reason = caches.cache_unavailable_reason(caches.get("quantized-fp8"), "cpu")
    assert reason is not None and reason.endswith("(building one raised RuntimeError: fp8 kernels need a newer torch)")


# --- another release, through PYTHONPATH ----------------------------------------------------------------

def other_release_env() -> dict[str, str]:
    target = Path(OTHER).resolve()
    assert (target / "transformers").is_dir(), f"{target} holds no transformers package"
    env = {k: v for k, v in os.environ.items() if k not in ("KVCACHE_OTHER_TRANSFORMERS", "PYTEST_ADDOPTS")}
    env = release_env(target, env)  # first on PYTHONPATH, the environment's kernels hidden where it must be
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def other_release(env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"],
                          capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout.strip()


needs_other = pytest.mark.skipif(not OTHER, reason="set KVCACHE_OTHER_TRANSFORMERS to a pip --target dir with "
                                                   "another release")


@needs_other
def test_this_module_on_another_release():
    """Every test above, under the other release: its own known counts and its own per-release functions."""
    env = other_release_env()
    release = other_release(env)
    assert release != compat.TRANSFORMERS, "KVCACHE_OTHER_TRANSFORMERS holds the installed release"
    cmd = [sys.executable, "-m", "pytest", str(Path(__file__).relative_to(ROOT)), "-p", "no:cacheprovider", "-q",
           "-rA"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert "PASSED tests/measuring/test_compat.py::test_counted_passes_are_this_releases" in done.stdout, \
        f"transformers {release} has no row in COUNTED_BY_RELEASE?\n{tail}"


@needs_other
def test_counted_suite_on_another_release(tmp_path):
    """``pytest benchmarks -m counted`` under the other release writes that release's known counts and skips."""
    env = other_release_env()
    release = other_release(env)
    expected = expected_counts(compat.parse_version(release))
    assert expected is not None, f"transformers {release} has no row in COUNTED_BY_RELEASE"
    out = tmp_path / "counted.json"
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-m", "counted", "--kv-caches", ",".join(CLASSES),
           "--kv-no-gate", "--kv-warmup", "2", "--kv-baseline", "none", "-p", "no:cacheprovider",
           "-q", "--benchmark-json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    kv = json.loads(out.read_text())["kv"]
    assert kv["environment"]["transformers"] == release
    counted = {cache: t["passes"] for cache, t in kv["traffic"].items()}
    skipped = {s["cache"]: s["reason"] for s in kv["skipped"]}
    assert check_counts(counted, skipped, expected) == [], (release, counted, skipped)


@needs_other
def test_decoding_strategies_on_another_release(tmp_path):
    """Beam search, a self-draft and prompt lookup (a share of 1 and of 0.5) run under the other release through
    generate, each step gaining what the strategy says (releases up to 5.7 refuse a lookup without an
    end-of-sequence token; 5.0-5.2 pass get_candidates a second argument)."""
    env = other_release_env()
    out = tmp_path / "decoding.json"
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-m", "counted", "--kv-model", "tiny", "--kv-caches",
           "dynamic", "--kv-driver", "generate", "--kv-decoding", "beam:2,assisted:self:2,prompt-lookup:2,"
           "prompt-lookup:2:0.5", "--kv-no-gate", "--kv-baseline", "none", "-p", "no:cacheprovider", "-q",
           "--benchmark-json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    traffic = json.loads(out.read_text())["kv"]["traffic"]
    tokens = {key: t["tokens_per_step"] for key, t in traffic.items()}
    assert tokens == {"dynamic#beam:2": 1, "dynamic#assisted:self:2": 3, "dynamic#prompt-lookup:2": 3,
                      "dynamic#prompt-lookup:2:0.5": 2}, tokens
