"""A local model directory's identity is its name and a hash of its config.json, not the path as typed: the same
model typed two ways, or a moved checkout, keeps its baseline; presets and hub ids keep their keys. The path as given
stays in the run (``settings.model_path``) for people to read."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvcache.analysing.presets import PRESETS
from kvcache.analysing.records import Environment, identity
from kvcache.analysing.records.identity import model_key
from kvcache.analysing.settings import Settings

CONFIG = {"model_type": "llama", **PRESETS["tiny"], "transformers_version": "5.24.0"}


def model_dir(parent: Path, config: dict, name: str = "mymodel", **dumps) -> Path:
    d = parent / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config, **dumps))
    return d


def counted_key(settings: Settings) -> str:
    return identity.baseline_key(identity.of(Environment(device_type="cpu"), identity.recorded_settings(settings)),
                        "counted")


def test_a_directory_is_keyed_by_its_name_and_config_hash(tmp_path, monkeypatch):
    d = model_dir(tmp_path / "checkout", CONFIG)
    key = model_key(str(d))
    name, _, digest = key.partition("@")
    assert name == "mymodel" and len(digest) == 8 and int(digest, 16) >= 0, key
    monkeypatch.chdir(tmp_path)
    assert model_key("checkout/mymodel") == model_key("./checkout/mymodel/") == key  # typed another way
    moved = tmp_path / "elsewhere" / "mymodel"
    shutil.copytree(d, moved)
    assert model_key(str(moved)) == key  # a moved checkout
    monkeypatch.chdir(d)
    assert model_key(".") == key


def test_the_key_follows_the_config_not_its_formatting(tmp_path):
    key = model_key(str(model_dir(tmp_path / "a", CONFIG)))
    reordered = dict(reversed(list(CONFIG.items())))
    assert model_key(str(model_dir(tmp_path / "b", reordered, indent=2))) == key
    resaved = {**CONFIG, "transformers_version": "4.45.2", "_name_or_path": "/somewhere/else"}
    assert model_key(str(model_dir(tmp_path / "c", resaved))) == key  # where and with what it was saved
    deeper = {**CONFIG, "num_hidden_layers": 3}
    assert model_key(str(model_dir(tmp_path / "d", deeper))) != key  # another model, another identity


@pytest.mark.parametrize("name", ["tiny", "smollm2-135m", "smollm2-135m-mha", "gemma3-270m", "qwen3-0.6b@layers=4",
                                  "tiny@layers=3", "HuggingFaceTB/SmolLM2-135M"])
def test_presets_and_hub_ids_keep_their_keys(name):
    assert model_key(name) == name
    settings = identity.recorded_settings(Settings(model=name, dtype="bfloat16")).to_json()
    assert settings["model"] == name and "model_path" not in settings
    assert counted_key(Settings(model=name)) == f"cpu | {name} | bfloat16"


def test_a_runs_settings_carry_the_key_and_the_path(tmp_path):
    d = model_dir(tmp_path / "checkout", CONFIG)
    settings = identity.recorded_settings(Settings(model=str(d))).to_json()
    assert settings["model"] == model_key(str(d)) and settings["model"].startswith("mymodel@")
    assert settings["model_path"] == str(d)
    assert counted_key(Settings(model=str(d))) == f"cpu | {model_key(str(d))} | bfloat16"
    moved = tmp_path / "moved" / "mymodel"
    shutil.copytree(d, moved)
    assert counted_key(Settings(model=str(moved))) == counted_key(Settings(model=str(d)))  # the baseline still found


def test_names_are_checked_and_keyed_without_torch(tmp_path):
    """kvcache.analysing.presets is the standard library only: the settings check ``--kv-model`` and key it (and
    scripts/versions.py reads the presets) where torch and transformers are absent."""
    d = model_dir(tmp_path, CONFIG)
    code = ("import sys\nfor blocked in ('torch', 'transformers'):\n    sys.modules[blocked] = None\n"
            "from kvcache.analysing import presets\nfrom kvcache.analysing.records import identity\n"
            "presets.check_name('gemma3-270m@layers=12'); presets.check_name(sys.argv[1])\n"
            "print(identity.model_key('tiny'), identity.model_key(sys.argv[1]) == sys.argv[2])")
    done = subprocess.run([sys.executable, "-c", code, str(d), model_key(str(d))], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tiny", "True"]
