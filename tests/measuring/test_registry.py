"""kvcache.measuring.caches: registering a cache class of one's own (in process, through a ``-p`` plugin module in a
real suite run, and through an installed distribution's entry point), unknown names, and ``all``."""

from __future__ import annotations

import json
import textwrap

import pytest
from kvrun import describe, load_json, output, run_python, run_suite

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.cache_utils import DynamicCache  # noqa: E402

from kvcache.measuring import caches, compat, decode  # noqa: E402
from kvcache.measuring.caches import CacheError, CacheRequest, CacheSpec, register_cache  # noqa: E402
from kvcache.measuring.configs import load_config  # noqa: E402

BUILTINS = ("dynamic", "static", "inplace", "static-sliced")


class MyCache(DynamicCache):
    """A user's own cache class (here: a DynamicCache by another name)."""


@pytest.fixture
def registered():
    """register_cache for one test: the names it registers are removed (or restored) afterwards."""
    before = dict(caches.registry())
    yield register_cache
    caches._REGISTRY.clear()
    caches._REGISTRY.update(before)


def request_for_tiny() -> CacheRequest:
    return CacheRequest(load_config("tiny")[0], 64, torch.device("cpu"), torch.bfloat16)


# --- in process --------------------------------------------------------------------------------------

def test_readme_style_registration(registered):
    spec = registered("mine", lambda req: compat.new_cache(MyCache, req.config), description="my cache")
    assert isinstance(spec, CacheSpec) and spec.name == "mine" and spec.description == "my cache"
    assert spec.attention == "sdpa" and spec.in_all
    assert caches.get("mine") is spec
    assert caches.parse_caches("mine") == ["mine"]
    assert caches.parse_caches(" dynamic, mine ,dynamic") == ["dynamic", "mine"]
    assert "mine" in caches.parse_caches("all")
    assert caches.cache_unavailable_reason(spec, "cpu") is None
    assert isinstance(spec.build(request_for_tiny()), MyCache)


def test_unavailable_reasons(registered):
    gpu_only = registered("mine-gpu", lambda req: None, devices=("cuda",))
    assert caches.cache_unavailable_reason(gpu_only, "cpu") == "mine-gpu runs on cuda only, not cpu"
    assert caches.cache_unavailable_reason(gpu_only, "cuda") is None

    def too_old() -> None:
        raise compat.release_lacks("MyFeature")

    old = registered("mine-old", lambda req: None, prepare=too_old)
    assert caches.cache_unavailable_reason(old, "cpu") == \
        f"MyFeature is not available in transformers {compat.TRANSFORMERS}"

    def no_package() -> None:
        raise ImportError("pip install my-kernels")

    missing = registered("mine-pkg", lambda req: None, prepare=no_package)
    assert caches.cache_unavailable_reason(missing, "cpu") == \
        "mine-pkg needs a package that is not installed (pip install my-kernels)"


def test_any_exception_from_prepare_is_a_skip_reason(registered):
    """A prepare that fails in a way nobody planned for (not Unsupported, not ImportError) skips its class."""
    def corrupt() -> None:
        raise RuntimeError("kernel table is corrupt\nat line 3")

    broken = registered("mine-broken", lambda req: None, prepare=corrupt)
    assert caches.cache_unavailable_reason(broken, "cpu") == \
        "mine-broken could not be prepared: RuntimeError: kernel table is corrupt"


def test_the_public_api_exports_unsupported_and_needs_no_torch(registered):
    """``kvcache.caches`` is what users import: its ``Unsupported`` is the one compat raises, a ``prepare`` raising it
    skips the class with its message, and importing the API loads neither torch nor transformers."""
    import kvcache.caches as public

    assert public.Unsupported is compat.Unsupported and set(public.__all__) == {
        "ENTRY_POINT_GROUP", "CacheError", "CacheRequest", "CacheSpec", "Unsupported", "get", "parse_caches",
        "register_cache", "registry", "register_press", "HookError", "DecodePoint", "PointSkip", "BatchShape",
        "tokens_needed"}
    assert public.DecodePoint is decode.DecodePoint and public.PointSkip is decode.PointSkip  # torch: when named

    def no_cuda() -> None:
        raise public.Unsupported("mine-cuda needs CUDA kernels")

    spec = registered("mine-cuda", lambda req: None, prepare=no_cuda)
    assert caches.cache_unavailable_reason(spec, "cpu") == "mine-cuda needs CUDA kernels"
    code = ("import sys\nfor blocked in ('torch', 'transformers'):\n    sys.modules[blocked] = None\n"
            "from kvcache.caches import Unsupported, register_cache, register_press\n"
            "print(register_cache('mine', lambda request: None).name, issubclass(Unsupported, RuntimeError),\n"
            "      register_press('knorm', 'KnormPress(0.5)').needs_prefill)")
    done = run_python(code)
    assert done.returncode == 0, describe(done)
    assert done.stdout.split() == ["mine", "True", "True"]


def test_registration_rules(registered):
    registered("mine", lambda req: None)
    with pytest.raises(ValueError, match="already registered"):
        registered("mine", lambda req: None)
    with pytest.raises(ValueError, match="already registered"):
        registered("inplace", lambda req: None)  # a built-in name is taken too
    with pytest.raises(TypeError, match="build function"):
        registered("mine-nobuild")
    hidden = registered("mine-hidden", lambda req: None, in_all=False)
    assert "mine-hidden" not in caches.parse_caches("all")
    assert caches.parse_caches("mine-hidden") == [hidden.name]


def test_replace_overrides_a_builtin(registered):
    mine = registered("static", lambda req: compat.new_cache(MyCache, req.config), replace=True,
                      description="my static")
    assert caches.get("static") is mine


def test_replace_of_a_builtin_before_first_use():
    """A plugin imported before anything touched the registry (``-p``, a conftest) overrides a built-in with
    replace=True; the built-ins must not then clash with it."""
    code = textwrap.dedent("""
        from kvcache.measuring import caches
        caches.register_cache("static", lambda req: None, replace=True, description="mine")
        reg = caches.registry()
        print(reg["static"].description, "dynamic" in reg, "twin-clean" in reg)
    """)
    done = run_python(code)
    assert done.returncode == 0, describe(done)
    assert done.stdout.split() == ["mine", "True", "False"]  # the test twins are never in the production registry


def test_unknown_names_are_one_line_cache_errors():
    with pytest.raises(CacheError) as info:
        caches.parse_caches("dynamic,nope")
    message = str(info.value)
    assert "\n" not in message
    assert "'nope'" in message and "known: " + ", ".join(BUILTINS) in message and message.endswith(", or all")
    assert isinstance(info.value, ValueError)
    with pytest.raises(CacheError, match="unknown cache class 'nope'; known: dynamic, static"):
        caches.get("nope")
    with pytest.raises(CacheError, match="names no cache class"):
        caches.parse_caches(" , ")


def test_all_excludes_the_test_twins():
    everything = caches.parse_caches("all")
    assert set(BUILTINS) <= set(everything)
    assert not [name for name in everything if name.startswith("twin-")]
    assert {"twin-clean", "twin-planted"} <= set(caches.registry())
    assert caches.parse_caches("twin-clean,twin-planted") == ["twin-clean", "twin-planted"]


# --- a user's cache class in a real suite run, through a -p plugin module ---------------------------------

PLUGIN = '''
"""A user's own cache class, plugged into kvcache-passes without editing it."""
from transformers.cache_utils import DynamicCache

from kvcache.measuring import compat
from kvcache.measuring.caches import register_cache


class MyCache(DynamicCache):
    pass


register_cache("mine", lambda req: compat.new_cache(MyCache, req.config), description="my cache")


def _corrupt():
    raise RuntimeError("kernel table is corrupt")


register_cache("mine-broken", lambda req: compat.new_cache(MyCache, req.config), prepare=_corrupt)
'''


def test_own_cache_class_in_a_suite_run(tmp_path):
    """A user's class is counted; a user's class whose prepare raises is skipped with the reason, and the run
    goes on."""
    (tmp_path / "my_kv_plugin.py").write_text(PLUGIN)
    out = tmp_path / "run.json"
    done = run_suite("-m", "counted", "--kv-model", "tiny", "--kv-caches", "mine,mine-broken", "-p", "my_kv_plugin",
                     "--kv-baseline", "none", "--benchmark-json", str(out), "-q",
                     pythonpath=[tmp_path])
    assert done.returncode == 0, describe(done)
    assert "1 passed, 1 skipped" in output(done), describe(done)
    assert "counted mine: 3.000 passes = cat 2.00, scaled_dot_product_attention 1.00" in output(done)
    kv = load_json(out)["kv"]
    assert kv["settings"]["caches"] == ["mine", "mine-broken"]
    assert kv["skipped"] == [{"cache": "mine-broken", "context": None,
                              "reason": "mine-broken could not be prepared: RuntimeError: kernel table is corrupt"}]
    assert "mine-broken" not in kv["traffic"]
    assert kv["traffic"]["mine"]["passes"] == pytest.approx(3.0, abs=0.05)
    assert kv["verdict"]["mine"]["counted"]["status"] == "no-baseline"


# --- an installed distribution's entry points --------------------------------------------------------------

ENTRY_MODULE = '''
from kvcache.measuring.caches import CacheSpec, register_cache


def _build(req):
    from kvcache.measuring import compat

    return compat.new_dynamic_cache(req.config)


def register():
    register_cache("ep-mine", _build, description="registered by an entry point function")


SPEC = CacheSpec(name="ep-spec", build=_build, description="an entry point that is a CacheSpec")


def broken():
    raise RuntimeError("this plug-in is broken")
'''

ENTRY_POINTS = '''
[kvcache_passes.caches]
mine = mycachemod:register
spec = mycachemod:SPEC
broken = mycachemod:broken
missing = mycachemod:not_there
'''


def test_entry_points_of_an_installed_distribution(tmp_path):
    site = tmp_path / "site"
    dist = site / "my_kv_caches-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-kv-caches\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    (site / "mycachemod.py").write_text(ENTRY_MODULE)
    code = textwrap.dedent("""
        import json
        from kvcache.measuring import caches
        problems = caches.load_entry_points()
        reg = caches.registry()
        print(json.dumps({"names": list(reg), "problems": problems,
                          "descriptions": {n: reg[n].description for n in ("ep-mine", "ep-spec") if n in reg},
                          "all": caches.parse_caches("all"), "again": caches.load_entry_points()}))
    """)
    done = run_python(code, pythonpath=[site])
    assert done.returncode == 0, describe(done)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"ep-mine", "ep-spec", *BUILTINS} <= set(found["names"])
    assert found["descriptions"] == {"ep-mine": "registered by an entry point function",
                                     "ep-spec": "an entry point that is a CacheSpec"}
    assert {"ep-mine", "ep-spec"} <= set(found["all"])
    problems = found["problems"]  # a broken plug-in is reported, one line each, and stops nothing
    assert len(problems) == 2 and all("\n" not in p for p in problems)
    assert any("'broken'" in p and "RuntimeError: this plug-in is broken" in p for p in problems)
    assert any("'missing'" in p and "AttributeError" in p for p in problems)
    assert found["again"] == []  # loaded once per process


def test_registry_loads_entry_points_on_first_use(tmp_path):
    """Without calling load_entry_points itself, ``registry()`` (what the plugin uses) picks them up."""
    site = tmp_path / "site"
    dist = site / "my_kv_caches-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-kv-caches\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[kvcache_passes.caches]\nmine = mycachemod:register\n")
    (site / "mycachemod.py").write_text(ENTRY_MODULE)
    done = run_python("from kvcache import caches; print('ep-mine' in caches.registry(), "
                      "caches.parse_caches('ep-mine'))", pythonpath=[site])
    assert done.returncode == 0, describe(done)
    assert done.stdout.split() == ["True", "['ep-mine']"]


@pytest.mark.parametrize("options, argument", [
    ({"memory_factor": float("nan")}, "memory_factor nan"), ({"memory_factor": "x"}, "memory_factor 'x'"),
    ({"memory_factor": -1}, "memory_factor -1"), ({"memory_factor": 0}, "memory_factor 0"),
    ({"memory_factor": float("inf")}, "memory_factor inf"), ({"memory_factor": True}, "memory_factor True"),
    ({"devices": "cuda"}, "devices 'cuda'"), ({"kinds": ("full", "global")}, "kinds ('full', 'global')"),
    ({"prepare": "no"}, "prepare 'no'"), ({"attention": ""}, "attention ''"), ({"in_all": "yes"}, "in_all 'yes'"),
    ({"pads": None}, "pads None"), ({"point": 3}, "point 3"), ({"description": 1}, "description 1"),
])
def test_a_bad_argument_is_refused_at_registration_in_one_line(registered, options, argument):
    """NaN would turn the peak check off, text fail mid-run (INTERNALERROR), inf blame --kv-model: all refused here,
    naming the class, the argument and what it accepts; nothing registered."""
    with pytest.raises(ValueError) as raised:
        register_cache("mine-bad", lambda request: DynamicCache(), **options)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"register_cache('mine-bad'): {argument} is not accepted; give ")
    assert "mine-bad" not in caches.registry()


def test_a_list_of_devices_or_kinds_is_kept_as_a_tuple(registered):
    spec = register_cache("mine-listed", lambda request: DynamicCache(), devices=["cpu"], kinds=["full"],
                          memory_factor=1)
    assert spec.devices == ("cpu",) and spec.kinds == ("full",) and spec.memory_factor == 1


@pytest.mark.parametrize("name, fn, argument", [("", print, "name ''"), ("a@b", print, "name 'a@b'"),
                                                ("mine-attn", "sdpa", "fn 'sdpa'")])
def test_register_attention_refuses_a_bad_argument_in_one_line(name, fn, argument):
    with pytest.raises(ValueError) as raised:
        compat.register_attention(name, fn)
    assert "\n" not in str(raised.value) and f": {argument} is not accepted" in str(raised.value)
