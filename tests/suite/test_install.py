"""Usable from any repository: the built wheel ships the suite (``kvcache.benchmarks``) and the plugin (a
``pytest11`` entry point), and ``pytest --pyargs kvcache.benchmarks`` runs it from a directory outside this
repository with a user's own classes (a ``-p`` module, an installed entry point). Installed, the plugin loads
in every pytest run of the environment: there it imports nothing heavy and checks nothing unless asked.

The wheel is built from a copy of the sources (nothing is written into the checkout) and unpacked into a
directory put first on ``PYTHONPATH``: an installation without pip, beside whatever this environment has."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from kvrun import ROOT, describe, environment, output

BUILD_TIMEOUT_S = 300
SUITE_FILES = ("__init__.py", "conftest.py", "test_decode.py", "test_traffic.py", "test_remeasure.py")
USER_CACHES = '''
from transformers import DynamicCache

from kvcache.caches import register_cache


class MyCache(DynamicCache):
    """A user's cache class; here simply DynamicCache."""


register_cache("mine", lambda request: MyCache(), description="a user's class, registered by a -p module")


def pytest_collection_finish(session):  # for the test: where the collected items' files are
    with open("collected.txt", "w") as out:
        out.writelines(f"{item.path}\\n" for item in session.items)
'''
TEAM_CACHES = '''
from transformers import DynamicCache

from kvcache.caches import register_cache


def register():
    register_cache("team", lambda request: DynamicCache(), description="a class from an installed package")
'''
TEAM_ENTRY_POINTS = "[kvcache_passes.caches]\nteam = team_caches:register\n"


def copy_sources(dest: Path) -> Path:
    """What a wheel is built from (pyproject.toml, README.md, kvcache/, benchmarks/), without caches."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("kvcache", "benchmarks"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    return dest


def build(src: Path, out: Path, hook: str) -> Path:
    """``setuptools.build_meta.<hook>`` (build_wheel, build_editable) run in ``src``: the wheel's path."""
    code = f"import sys; from setuptools import build_meta; print(build_meta.{hook}(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, env=environment())
    assert done.returncode == 0, describe(done)
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """This checkout's wheel, unpacked into a site directory, with a team's package offering a class through
    the entry-point group kvcache_passes.caches."""
    tmp = tmp_path_factory.mktemp("install")
    wheel = build(copy_sources(tmp / "src"), tmp / "dist", "build_wheel")
    site = tmp / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    (site / "team_caches.py").write_text(TEAM_CACHES)
    dist_info = site / "team_caches-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: team-caches\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(TEAM_ENTRY_POINTS)
    return site


def test_wheel_ships_the_suite_and_the_plugin_entry_point(installed):
    for name in SUITE_FILES:
        assert (installed / "kvcache" / "benchmarks" / name).is_file(), name
    entry_points = next(installed.glob("kvcache_passes-*.dist-info")) / "entry_points.txt"
    text = entry_points.read_text()
    assert "[pytest11]" in text and "kvcache.plugin = kvcache.plugin" in text, text


def readme_command(readme: Path = ROOT / "README.md") -> str:
    """The README's command that runs the suite from another repository: the one line of a ``sh`` block that runs
    ``--pyargs kvcache.benchmarks``, as written there."""
    found, fence = [], None
    for line in readme.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence in ("sh", "bash", "console") and "--pyargs kvcache.benchmarks" in line:
            found.append(line.split(" #")[0].strip())
    assert len(found) == 1, f"expected one command with --pyargs kvcache.benchmarks in the README, found {found}"
    return found[0]


def test_readme_command_runs_from_another_directory_with_the_users_classes(installed, tmp_path):
    """The README's command exactly as written, run by a shell in a directory outside this repository that holds
    ``my_caches.py``, with the wheel installed (not editable) and this environment's ``python``/``pytest`` first on
    PATH. Only what the README leaves to the user's choice is set, through ``PYTEST_ADDOPTS``: the tiny model and
    the counted items, to keep it cheap. Rootdir, baseline and JSON are the user's directory's."""
    (tmp_path / "my_caches.py").write_text(USER_CACHES)
    command = readme_command()
    bin_dir = str(Path(sys.executable).parent)
    env = environment([installed], PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
                      PYTEST_ADDOPTS="-p no:cacheprovider -v -m counted --kv-model tiny")
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    text = output(done)
    assert done.returncode == 0, f"{command}\n{describe(done)}"
    assert "test_traffic.py::test_traffic[mine] PASSED" in text, describe(done)
    collected = (tmp_path / "collected.txt").read_text().split()
    assert collected and {Path(p) for p in collected} == {installed / "kvcache" / "benchmarks" / "test_traffic.py"}
    assert "kvcache-passes" in text, describe(done)
    for cache in ("dynamic", "mine"):
        assert f"counted {cache}: 3.000 passes" in text, describe(done)
    json_out = command.split("--benchmark-json", 1)[1].split()[0] if "--benchmark-json" in command else None
    assert json_out is None or (tmp_path / json_out).is_file(), describe(done)


def test_a_class_from_an_installed_package_is_collected(installed, tmp_path):
    """The entry-point group ``kvcache_passes.caches``: the team's class is registered where the wheel is installed
    (collected only: the README command above measures the classes)."""
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "kvcache.benchmarks", "-p", "no:cacheprovider", "--co", "-q",
           "-m", "counted", "--kv-model", "tiny", "--kv-caches", "dynamic,team", "--kv-baseline", "none"]
    done = subprocess.run(cmd, cwd=tmp_path, env=environment([installed]), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, describe(done)
    assert "test_traffic[team]" in done.stdout, describe(done)


def test_readme_command_is_found(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("Run `pytest --pyargs kvcache.benchmarks` here.\n\n```sh\npip install x\n"
                      "python -m pytest --pyargs kvcache.benchmarks -p my_caches --kv-caches mine  # a note\n```\n")
    assert readme_command(readme) == "python -m pytest --pyargs kvcache.benchmarks -p my_caches --kv-caches mine"


def test_editable_install_maps_the_suite_to_benchmarks(tmp_path):
    """``pip install -e .``: setuptools' editable finder maps kvcache.benchmarks to the checkout's benchmarks/."""
    src = copy_sources(tmp_path / "src")
    wheel = build(src, tmp_path / "dist", "build_editable")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    code = ("import importlib.util, site, sys; site.addsitedir(sys.argv[1]); "
            "print(*(importlib.util.find_spec(m).origin for m in ('kvcache.benchmarks', 'kvcache.plugin')))")
    # -I -S: no site-packages and no PYTHONPATH, so only this editable install can provide kvcache
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(site)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, describe(done)
    suite, plugin = done.stdout.split()
    assert Path(suite) == src / "benchmarks" / "__init__.py"
    assert Path(plugin) == src / "kvcache" / "plugin" / "__init__.py"


# --- installed, the plugin loads in every pytest run: it must cost nothing there ----------------------------

UNRELATED_TEST = '''
import os
import sys


def test_unrelated(request):
    assert request.config.pluginmanager.has_plugin("kvcache.plugin")
    heavy = ("torch", "transformers", "numpy", "kvcache.measuring", "kvcache.analysing")
    # the options table the plugin declares and the settings it parses them into (with --kv-decoding's names): stdlib
    table = ("kvcache.analysing", "kvcache.analysing.options", "kvcache.analysing.settings",
             "kvcache.analysing.decoding")
    loaded = sorted(m for m, module in sys.modules.items() if module is not None and m not in table
                    and any(m == h or m.startswith(h + ".") for h in heavy))
    allowed = [a for a in os.environ["KV_TEST_ALLOWED"].split(",") if a]  # packages checking --kv-* may import
    assert not [m for m in loaded if not any(m == a or m.startswith(a + ".") for a in allowed)], loaded
'''
# torch and transformers made unimportable, as in an environment without them (the analysing wing's CI job)
WITHOUT_TORCH = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; import pytest; "
                 "sys.exit(pytest.main(sys.argv[1:]))")
CHECKING_OPTIONS = "numpy,kvcache.measuring,kvcache.analysing"  # the registry, presets, --kv-max-passes: no torch


def run_unrelated(tmp_path: Path, *args: str, allowed: str = "") -> subprocess.CompletedProcess:
    """A team's own test file, ``-p kvcache.plugin`` (a no-op where the entry point loaded it), without torch
    and without pytest-benchmark's hooks (``-p no:benchmark``), like the analysing wing's CI environment."""
    (tmp_path / "test_unrelated.py").write_text(UNRELATED_TEST)
    cmd = [sys.executable, "-c", WITHOUT_TORCH, "test_unrelated.py", "-p", "kvcache.plugin", "-p", "no:benchmark",
           "-p", "no:cacheprovider", "-q", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=environment([ROOT], KV_TEST_ALLOWED=allowed), capture_output=True,
                          text=True, timeout=120)


def test_unrelated_run_imports_and_checks_nothing(tmp_path):
    done = run_unrelated(tmp_path)
    assert done.returncode == 0 and "1 passed" in done.stdout, describe(done)


def test_unrelated_run_checks_given_options_without_torch(tmp_path):
    """Given --kv-* values are checked; what needs the device, the model or memory waits for the suite."""
    done = run_unrelated(tmp_path, "--kv-model", str(tmp_path / "no-such-model"), "--kv-copy-mib", "100000000",
                         "--kv-contexts", "1k,2k", allowed=CHECKING_OPTIONS)
    assert done.returncode == 0 and "1 passed" in done.stdout, describe(done)


def test_unrelated_run_with_a_bad_kv_option_is_one_line_usage_error(tmp_path):
    done = run_unrelated(tmp_path, "--kv-caches", "nope")
    assert done.returncode == 4, describe(done)
    lines = [line for line in output(done).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ERROR: --kv-caches: unknown cache class 'nope'"), describe(done)


# --- the suite collected though its arguments did not show it: checked once its items are collected -------

UNPREDICTED = ("import sys; import kvcache.plugin as plugin; plugin.collects_suite = lambda config: False; "
               "import pytest; sys.exit(pytest.main(sys.argv[1:]))")


def test_suite_reached_unseen_is_still_checked_before_it_runs(tmp_path):
    base = ["benchmarks", "-p", "kvcache.plugin", "-p", "no:cacheprovider", "--co", "-q", "-m", "counted",
            "--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-baseline", "none"]
    good = subprocess.run([sys.executable, "-c", UNPREDICTED, *base], cwd=ROOT, env=environment(),
                          capture_output=True, text=True, timeout=300)
    assert good.returncode == 0 and "test_traffic[dynamic]" in good.stdout, describe(good)
    bad = subprocess.run([sys.executable, "-c", UNPREDICTED, *base, "--kv-device", "nonsense"], cwd=ROOT,
                         env=environment(), capture_output=True, text=True, timeout=300)
    assert bad.returncode == 4, describe(bad)
    assert "Traceback" not in output(bad) and "ERROR: --kv-device 'nonsense'" in bad.stderr, describe(bad)
