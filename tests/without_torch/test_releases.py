"""kvcache.analysing.releases, the side-by-side installer of Transformers releases (shared by scripts/versions.py and
``kvcache bisect --releases``): what it takes as a release number, and how it checks an installed release, with
stand-in packages (no pip, no network)."""

from __future__ import annotations

import io

import pytest

from kvcache.analysing import releases


def fake_release(root, release, version=None, body=""):
    target = root / release
    (target / "transformers").mkdir(parents=True)
    (target / "transformers" / "__init__.py").write_text(f"{body}__version__ = {version or release!r}\n")
    (target / releases.INSTALLED_MARKER).write_text(f"transformers=={release}\n")
    return target


def test_an_installed_release_is_used_and_checked(tmp_path):
    fake_release(tmp_path, "9.8.7")
    log = io.StringIO()
    assert releases.ensure("9.8.7", tmp_path, log) == (tmp_path / "9.8.7").resolve()
    assert "9.8.7" in log.getvalue()


@pytest.mark.parametrize(("version", "body", "says"), [
    ("9.8.6", "", "imported transformers 9.8.6 instead of 9.8.7"),
    (None, "import no_such_module_here\n", "import failed: ModuleNotFoundError: No module named 'no_such_module_here'"),
])
def test_an_installed_release_that_is_not_it_is_refused(tmp_path, version, body, says):
    fake_release(tmp_path, "9.8.7", version, body)
    with pytest.raises(releases.ReleaseError) as info:
        releases.ensure("9.8.7", tmp_path, io.StringIO())
    assert str(info.value) == says


def test_an_unfinished_install_is_not_taken_for_one(tmp_path):
    target = fake_release(tmp_path, "9.8.7")
    (target / releases.INSTALLED_MARKER).unlink()
    assert releases.installed_at("9.8.7", tmp_path) is None


def test_pip_index_lists_final_releases():
    text = "transformers (5.24.0)\nAvailable versions: 5.24.0, 5.24.0rc1, 5.10.4, 4.9.2\n"
    assert releases.parse_pip_index(text) == ["5.24.0", "5.10.4", "4.9.2"]
    assert sorted(releases.parse_pip_index(text), key=releases.version_key) == ["4.9.2", "5.10.4", "5.24.0"]


@pytest.mark.parametrize(("given", "stored"), [("5.23.0", "5.23.0"), ("5.23", "5.23.0"), ("v5.23.0", "5.23.0"),
                                               ("5.23.0.0", "5.23.0"), ("05.023.0", "5.23.0"), ("5.23.1.0.0", "5.23.1"),
                                               ("5.23.0.1", "5.23.0.1"), ("5.0rc01", "5.0.0rc1"),
                                               ("5.1.0.dev03", "5.1.0.dev3")])
def test_one_release_has_one_name(tmp_path, capsys, given, stored):
    """Issue 49 item 12: history add --release 5.23.0.0 or 05.023.0 was stored beside 5.23.0, a step that is none;
    every spelling pip takes for one release (PEP 440 equality) is stored under one name."""
    from fakerun import make_run, write_run

    from kvcache.analysing import arguments
    from kvcache.cli import main

    assert arguments.release("--release", given) == stored
    if "rc" not in stored and "dev" not in stored:
        assert releases.normalise(given)[0] == stored
    run = write_run(tmp_path / "run.json", make_run())
    store = tmp_path / "h.jsonl"
    assert main(["history", "add", str(run), "--store", str(store), "--release", stored]) == 0
    assert main(["history", "add", str(run), "--store", str(store), "--release", given]) == 2
    assert f"already has an entry for release {stored}" in capsys.readouterr().err


def test_a_release_installed_without_kernels_does_not_see_the_environments(tmp_path):
    """transformers 5.25 requires the hub ``kernels`` package, made for a newer huggingface_hub than older releases
    bring; a release installed without it runs with it hidden (import fails, ``find_spec`` says None), one installed
    with it sees its own."""
    import os
    import subprocess
    import sys

    check = ("import importlib.util, sys\n"
             "print(importlib.util.find_spec('kernels') is None)\n"
             "try:\n    import kernels\n    print('imported', kernels.__file__)\n"
             "except ImportError:\n    print('hidden')\n")
    elsewhere = tmp_path / "env"
    (elsewhere / "kernels").mkdir(parents=True)
    (elsewhere / "kernels" / "__init__.py").write_text("")
    without = fake_release(tmp_path / "root", "4.54.1")
    (without / "huggingface_hub").mkdir()  # a release brings its own, older than the environment's kernels needs
    env = releases.release_env(without, {"PYTHONPATH": str(elsewhere), "PATH": ""})
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split() == ["True", "hidden"], done
    own = fake_release(tmp_path / "root", "5.25.0")
    (own / "huggingface_hub").mkdir()
    (own / "kernels").mkdir()
    (own / "kernels" / "__init__.py").write_text("")
    env = releases.release_env(own, {"PYTHONPATH": str(elsewhere), "PATH": ""})
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split()[:2] == ["False", "imported"] and str(own) in done.stdout, done
    checkout = tmp_path / "transformers" / "src"  # a checkout brings no huggingface_hub: it sees the environment's
    (checkout / "transformers").mkdir(parents=True)
    env = releases.release_env(checkout, {"PYTHONPATH": str(elsewhere), "PATH": ""})
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(checkout)
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split()[:2] == ["False", "imported"] and str(elsewhere) in done.stdout, done
