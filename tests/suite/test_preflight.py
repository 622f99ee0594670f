"""Fail fast: what would only fail after the whole sweep (a path the run cannot write, a copy tensor larger
than free memory) or in every test (a model directory whose config is unusable, weights larger than free memory,
counted from the config without building anything), and a hub id that would
wait half a minute for a network that is not there, stop ``pytest benchmarks`` at start-up: exit 4 and one
line naming the value. A hub id already in the local Hugging Face cache loads without the network.

The plugin cases are fresh ``pytest.main(["benchmarks", "--co", "-q", ...])`` runs, a batch per environment
(tests/kvrun.py). The hub batch points the hub at a local port that accepts connections and never answers:
a machine whose network drops packets, deterministically."""

from __future__ import annotations

import json
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kvrun import describe, output, run_batch

from kvcache.analysing.presets import PRESETS

torch = pytest.importorskip("torch")

USAGE_ERROR = 4
TINY_LLAMA = {"model_type": "llama", **PRESETS["tiny"]}
BERT = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512}
T5 = {"model_type": "t5", "d_model": 512, "num_layers": 6, "num_heads": 8, "d_ff": 2048, "vocab_size": 32128,
      "is_encoder_decoder": True}
CACHED, CONFIG_ONLY, NOT_CACHED = "kvcache-test/tiny-llama", "kvcache-test/config-only", "kvcache-test/absent"
HUGE_VOCAB = 10**9  # 576 x 1e9 embedding parameters: about 1 TiB in bf16, more than any machine here has free
DEEP = "qwen3-0.6b@layers=100000"  # about 3 TiB of weights


def tiny_parameters(vocab: int) -> int:
    """Parameters of ``tiny`` with a vocabulary of ``vocab`` (tied embeddings: the matrix counted once)."""
    from transformers import LlamaConfig

    from kvcache.measuring.geometry import count_parameters

    return count_parameters(LlamaConfig(**{**PRESETS["tiny"], "vocab_size": vocab}))


def model_dir(tmp: Path, name: str, config: str | dict) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return d


def fake_hub_cache(hf_home: Path, repo: str, config: dict, *, weights: bool) -> Path:
    """The layout huggingface_hub keeps under ``HF_HOME/hub``: refs/main naming a snapshot with the files."""
    repo_dir = hf_hub_cache(hf_home) / f"models--{repo.replace('/', '--')}"
    sha = "0123456789abcdef0123456789abcdef01234567"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(sha)
    snapshot = repo_dir / "snapshots" / sha
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    if weights:
        (snapshot / "model.safetensors").write_bytes(b"")
    return snapshot


def hf_hub_cache(hf_home: Path) -> Path:
    return hf_home / "hub"


def _cases(tmp: Path) -> dict[str, tuple[list[str], list[str]]]:
    """case -> (arguments, texts the error line must contain), run with the default (offline) environment."""
    a_file = tmp / "a-file.txt"
    a_file.write_text("not a directory\n")
    a_dir = tmp / "a-dir"
    a_dir.mkdir()
    storage = a_file / "storage"
    cases = {
        "json-under-file": (["--benchmark-json", str(a_file / "out.json")],
                            ["--benchmark-json", str(a_file / "out.json"), f"{a_file} is not a directory"]),
        "json-is-dir": (["--benchmark-json", str(a_dir)], ["--benchmark-json", str(a_dir), "is a directory"]),
        "baseline-under-file": (["--kv-update-baseline", "--kv-baseline", str(a_file / "sub" / "kv.json")],
                                ["--kv-baseline", str(a_file / "sub" / "kv.json"), f"{a_file} is not a directory"]),
        "storage-under-file": (["--benchmark-autosave", "--benchmark-storage", f"file://{storage}"],
                               ["--benchmark-storage", str(storage), f"{a_file} is not a directory"]),
        "copy-too-big": (["--kv-copy-mib", "100000000"],
                         ["--kv-copy-mib 100000000", "195312.50 GiB", "source and destination", "GiB free"]),
    }
    if Path("/proc/self").is_dir():  # a directory nobody can create files in, root included
        cases["baseline-unwritable-dir"] = (
            ["--kv-update-baseline", "--kv-baseline", "/proc/kv-baseline.json"],
            ["--kv-baseline", "/proc/kv-baseline.json", "cannot create a file in /proc"])
    if os.geteuid() != 0:  # permissions do not stop root
        read_only = tmp / "read-only"
        read_only.mkdir(mode=0o500)
        cases["baseline-read-only-dir"] = (["--kv-update-baseline", "--kv-baseline", str(read_only / "kv.json")],
                                           ["--kv-baseline", f"cannot create a file in {read_only}"])
    models = {
        "model-corrupt": ('{"model_type": "llama", "hidden_size": ', ["is not JSON"]),
        "model-empty": ("", ["is empty"]),
        "model-list": ("[1, 2]", ["is a list, expected an object"]),
        "model-no-type": ({k: v for k, v in TINY_LLAMA.items() if k != "model_type"}, ["has no model_type"]),
        "model-unknown-type": ({**TINY_LLAMA, "model_type": "no-such-model"}, ["model_type 'no-such-model'",
                                                                                "not known"]),
        "model-missing-fields": ({"model_type": "llama", "hidden_size": 576},
                                 ["lacks num_hidden_layers, num_attention_heads", "intermediate_size"]),
        "model-bad-value": ({**TINY_LLAMA, "num_hidden_layers": 0}, ["num_hidden_layers is 0",
                                                                     "a positive whole number"]),
        "model-bert": (BERT, ["model_type 'bert'", "encoder", "not a decoder-only causal LM with a KV cache"]),
        "model-t5": (T5, ["model_type 't5'", "encoder-decoder", "not a decoder-only causal LM with a KV cache"]),
    }
    for name, (config, expected) in models.items():
        d = model_dir(tmp, name, config)
        cases[name] = (["--kv-model", str(d)], [f"--kv-model '{d}'", str(d / "config.json"), *expected])
    huge_vocab = model_dir(tmp, "model-huge-vocab", {**TINY_LLAMA, "vocab_size": HUGE_VOCAB})
    cases["model-huge-vocab"] = (["--kv-model", str(huge_vocab)], [
        f"--kv-model '{huge_vocab}': its weights need", f"{tiny_parameters(HUGE_VOCAB):,} parameters x 2 B, bfloat16",
        "while built in float32", "GiB free"])
    cases["model-100000-layers"] = (["--kv-model", DEEP], [
        f"--kv-model '{DEEP}': its weights need 2930.41 GiB (1,573,249,983,488 parameters x 2 B, bfloat16)",
        "and its smallest point's cache", "GiB free"])
    cases["hub-offline-not-cached"] = (["--kv-model", NOT_CACHED], [
        f"--kv-model '{NOT_CACHED}'", "not in the local Hugging Face cache", "HF_HUB_OFFLINE"])
    return cases


def _hub_cases() -> dict[str, tuple[list[str], list[str]]]:
    """Run with the hub online in name but unreachable: HF_HUB_OFFLINE=0, the endpoint a port that never answers."""
    return {
        "hub-cached": (["--kv-model", CACHED], []),
        "hub-not-cached": (["--kv-model", NOT_CACHED], [f"--kv-model '{NOT_CACHED}'", "not in the local Hugging Face "
                                                        "cache", "cannot be reached"]),
        "hub-cached-config-only": (["--kv-model", CONFIG_ONLY], [f"--kv-model '{CONFIG_ONLY}'", "weights",
                                                                 "cannot be reached"]),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("preflight")
    hf_home = tmp / "hf-home"
    fake_hub_cache(hf_home, CACHED, TINY_LLAMA, weights=True)
    fake_hub_cache(hf_home, CONFIG_ONLY, TINY_LLAMA, weights=False)
    cache_env = {"HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_hub_cache(hf_home)), "HF_HUB_OFFLINE": "1"}
    cases, hub = _cases(tmp), _hub_cases()
    missing = "none"
    warm_up = ["--co", "-q", "--kv-model", "tiny", "--kv-baseline", missing]  # pays the imports, timed cases after
    jobs = {"warm-up": warm_up}
    for name, (args, _) in cases.items():
        isolate = [] if "--kv-baseline" in args else ["--kv-baseline", missing]
        jobs[name] = ["--co", "-q", "--kv-model", "tiny", *isolate, *args]
    new_dir = tmp / "new-dir" / "sub"
    jobs["json-new-dir"] = [*warm_up, "--benchmark-json", str(new_dir / "out.json")]
    hub_jobs = {"warm-up": warm_up, **{name: [*warm_up, *args] for name, (args, _) in hub.items()}}
    with socket.socket() as silent, ThreadPoolExecutor(max_workers=2) as pool:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel accepts connections; nothing ever answers them
        silent_hub = {**cache_env, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0",
                      "HF_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        batch = pool.submit(run_batch, jobs, env=cache_env)
        hub_batch = pool.submit(run_batch, hub_jobs, env=silent_hub, timeout=120)
        results = {**batch.result(), **hub_batch.result()}
    return {**cases, **hub}, results, new_dir


def one_error_line(done) -> str:
    assert done.returncode == USAGE_ERROR, describe(done)
    text = output(done)
    assert "Traceback" not in text, describe(done)
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ERROR: "), describe(done)
    return lines[0]


CASE_NAMES = ["json-under-file", "json-is-dir", "baseline-under-file", "baseline-unwritable-dir",
              "baseline-read-only-dir", "storage-under-file", "copy-too-big", "model-corrupt", "model-empty",
              "model-list", "model-no-type", "model-unknown-type", "model-missing-fields", "model-bad-value",
              "model-bert", "model-t5", "hub-offline-not-cached", "hub-not-cached", "hub-cached-config-only",
              "model-huge-vocab", "model-100000-layers"]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_checked_before_anything_runs(runs, case):
    specs, results, _ = runs
    if case not in results:
        pytest.skip("needs /proc" if case == "baseline-unwritable-dir" else "permissions do not stop root")
    line = one_error_line(results[case])
    for part in specs[case][1]:
        assert part in line, f"{part!r} not in {line!r}"


@pytest.mark.parametrize("case", ["hub-not-cached", "hub-cached-config-only"])
def test_hub_without_network_fails_in_seconds(runs, case):
    """One bounded probe decides (no retries): the error names the probe's bound. No wall-clock assert here;
    the batch's own time limit only guards against a hang."""
    from kvcache.measuring.configs import HUB_TIMEOUT_S

    line = one_error_line(runs[1][case])
    assert f"no answer within {HUB_TIMEOUT_S:g} s" in line, line


def test_hub_id_in_local_cache_loads_offline(runs):
    done = runs[1]["hub-cached"]
    assert done.returncode == 0, describe(done)
    assert "tests collected" in output(done), describe(done)  # that the hub is never asked: the next test


def test_json_directory_is_created_and_nothing_left_behind(runs):
    done, new_dir = runs[1]["json-new-dir"], runs[2]
    assert done.returncode == 0, describe(done)
    assert new_dir.is_dir() and not any(new_dir.iterdir()), describe(done)


def test_cached_hub_id_touches_no_network(tmp_path, monkeypatch):
    """In process: a hub id in the cache is read from its snapshot; the hub is never asked."""
    from huggingface_hub import constants

    from kvcache.measuring import configs

    snapshot = fake_hub_cache(tmp_path, CACHED, TINY_LLAMA, weights=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_hub_cache(tmp_path)))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def no_network(*_args, **_kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(configs, "hub_unreachable", no_network)
    config, weights = configs.load_config(CACHED)
    assert config.num_hidden_layers == 2 and weights == snapshot


@pytest.mark.parametrize("config, expected", [('{"model_type": ', "is not JSON"), (BERT, "model_type 'bert'")])
def test_traffic_command_gets_the_same_one_line(tmp_path, capsys, config, expected):
    from kvcache.commands import traffic as traffic_cli

    d = model_dir(tmp_path, "model", config)
    assert traffic_cli.main(["--model", str(d), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"kvcache traffic: --model '{d}': "), err
    assert expected in err, err


# --- memory: the weights and the smallest point against free memory, before anything is built ----------------

def test_traffic_command_refuses_weights_larger_than_free_memory(tmp_path, capsys):
    from kvcache.commands import traffic as traffic_cli

    d = model_dir(tmp_path, "model", {**TINY_LLAMA, "vocab_size": HUGE_VOCAB})
    assert traffic_cli.main(["--model", str(d), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"kvcache traffic: --model '{d}': its weights need"), err
    assert "GiB free" in err, err


def memory(settings, free_gib: float, device: str = "cpu", host_gib: float | None = None) -> str | None:
    """What :func:`preflight.memory_problem` says of ``settings``' run with ``free_gib`` GiB free on ``device`` (and
    ``host_gib`` in host memory, when another device)."""
    from kvcache.measuring import preflight

    free = {device: int(free_gib * 2**30), "cpu": int((host_gib if host_gib is not None else free_gib) * 2**30)}
    return preflight.memory_problem(preflight.model_memory(settings), device, free)


def test_the_weights_and_the_smallest_point_must_fit():
    """``tiny``: 8.3 M parameters (33 MB while built in float32); its smallest point (static, the counted context
    256 with two warm-up steps, one counted and the margin) must fit beside them; larger points are skipped when they
    open, with their numbers."""
    from kvcache.analysing.settings import Settings

    settings = Settings(model="tiny", dtype="bfloat16", caches=("dynamic", "static"))
    assert memory(settings, 1.0) is None
    line = memory(settings, 0.02)
    assert line.startswith("--kv-model 'tiny': its weights need 0.02 GiB (8,260,416 parameters x 2 B, bfloat16, "
                           "0.03 GiB while built in float32 and cast)"), line
    assert "static at 267 tokens" in line and "cpu has 0.02 GiB free" in line, line
    batch = memory(Settings(model="tiny", batch=64, counted_contexts=(4096, 8192), contexts=(8192,)), 0.1)
    assert batch and "at 4107 tokens x 64 sequences" in batch, batch  # the batch's sequences count


def test_on_a_gpu_the_host_builds_the_weights_first():
    from kvcache.analysing.settings import Settings

    deep = Settings(model="smollm2-135m@layers=3000")  # 10.6 G parameters: 39.6 GiB in float32, 19.8 in bf16
    assert memory(deep, 100.0, "cuda", host_gib=100.0) is None
    line = memory(deep, 100.0, "cuda", host_gib=30.0)
    assert line and "(built in host memory first); cpu has 30.00 GiB free" in line, line
    line = memory(deep, 20.0, "cuda", host_gib=100.0)
    assert line and "; cuda has 20.00 GiB free" in line, line


def test_check_model_memory_is_a_settings_error():
    from kvcache.analysing.settings import Settings, SettingsError
    from kvcache.measuring import preflight

    with pytest.raises(SettingsError, match="^--kv-model 'tiny': its weights need"):
        preflight.check_model_memory(Settings(model="tiny", device="cpu"), free={"cpu": 2**20})
    preflight.check_model_memory(Settings(model="tiny", device="cpu"), free={"cpu": 2**40})


@pytest.mark.parametrize("name, layers", [("qwen3-0.6b", 40), ("gemma3-270m", 42), ("gemma3-270m", 40),
                                          ("deepseek-v2-lite", 37)])
def test_deep_configs_are_counted_without_building_every_layer(monkeypatch, name, layers):
    """Past META_LAYERS (here lowered to 8) the parameters are counted at three shallow depths and extrapolated: the
    same figure as building every layer on the meta device, with a layer pattern (gemma3: 5 sliding, 1 full), a
    depth that ends part-way through it (40 = 6 x 6 + 4), and dense first layers (DeepSeek)."""
    from kvcache.measuring import compat, configs, geometry

    config = geometry.at_depth(configs.preset_config(name), layers)
    exact = compat.meta_parameters(config)
    monkeypatch.setattr(geometry, "META_LAYERS", 8)
    built: list[int] = []
    real = compat.meta_parameters
    monkeypatch.setattr(compat, "meta_parameters", lambda c: built.append(c.num_hidden_layers) or real(c))
    assert geometry.count_parameters(config) == exact
    assert built and max(built) < layers, built  # never built at its full depth

