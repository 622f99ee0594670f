"""scripts/versions.py: argument parsing and release lists (no network, no installs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kvcache.analysing import releases

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "versions.py"
spec = importlib.util.spec_from_file_location("versions_script", SCRIPT)
versions = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = versions  # dataclasses look the module up while the class is made
spec.loader.exec_module(versions)

PIP_INDEX = """\
transformers (5.24.0)
Available versions: 5.24.0, 5.10.4, 5.10.2, 5.0.0, 5.0.0rc1, 4.57.6, 4.57.5, 4.46.3, 4.46.2, 4.45.2, 4.45.1, \
4.44.2, 4.9.2, 3.5.1
  INSTALLED: 5.24.0
  LATEST:    5.24.0
"""


def test_parse_pip_index_keeps_final_releases():
    found = releases.parse_pip_index(PIP_INDEX)
    assert "5.0.0rc1" not in found
    assert found[:3] == ["5.24.0", "5.10.4", "5.10.2"] and found[-1] == "3.5.1"


def test_parse_pip_index_rejects_other_output():
    with pytest.raises(ValueError):
        releases.parse_pip_index("ERROR: No matching distribution found for transformers")


def test_newest_patch_per_minor_since_4_45_numeric_order():
    newest = versions.newest_per_minor(releases.parse_pip_index(PIP_INDEX))
    # 5.10 sorts after 5.0 and 4.9/4.44 are before 4.45, numerically not lexically.
    assert newest == ["4.45.2", "4.46.3", "4.57.6", "5.0.0", "5.10.4", "5.24.0"]
    assert versions.newest_per_minor(["4.9.2", "4.45.2"], since="4.9") == ["4.9.2", "4.45.2"]


def test_default_releases_come_from_the_one_installer(monkeypatch):
    """The release list is kvcache.analysing.releases.published's (versions.py no longer runs pip index itself); the
    built-in list when it cannot be had."""
    monkeypatch.setattr(versions, "published", lambda: releases.parse_pip_index(PIP_INDEX)[::-1])
    assert versions.default_releases() == (["4.45.2", "4.46.3", "4.57.6", "5.0.0", "5.10.4", "5.24.0"],
                                           "pip index versions transformers")

    def offline():
        raise releases.ReleaseError("cannot list the releases of transformers")

    monkeypatch.setattr(versions, "published", offline)
    assert versions.default_releases() == (list(versions.RELEASES), "built-in list (pip index versions failed)")


def test_fallback_list_is_newest_per_minor_and_ordered():
    assert versions.newest_per_minor(versions.RELEASES) == versions.RELEASES
    assert versions.RELEASES[0] == "4.45.2"


def test_releases_option_sorted_deduplicated_validated():
    args = versions.parse_args(["--releases", "5.10.4, 4.48.3,5.0.0,4.48.3"])
    assert args.releases == ["4.48.3", "5.0.0", "5.10.4"]
    with pytest.raises(SystemExit):
        versions.parse_args(["--releases", "4.48.x"])
    with pytest.raises(SystemExit):
        versions.parse_args(["--releases", "5.0.0rc1"])


def test_short_release_is_read_as_its_dot_zero_and_said_before_installing(tmp_path, monkeypatch, capsys):
    """``--releases 4.45`` used to install 4.45.0 (pip pads ``==4.45``) and then fail: the release imported as
    ``4.45.0``, not ``4.45``. It is read as 4.45.0, said before anything runs, and deduplicated against 4.45.0."""
    args = versions.parse_args(["--releases", "4.45,5.0.0,4.45.0"])
    assert args.releases == ["4.45.0", "5.0.0"] and args.releases.notes == ["4.45 is read as 4.45.0"]
    asked = []

    def fake_run_release(release, args, constraints, installed, model=None):
        asked.append(release)
        assert "--releases: 4.45 is read as 4.45.0" in capsys.readouterr().out  # said before installing
        return versions.Outcome(release, "skipped", "no install here")

    monkeypatch.setattr(versions, "run_release", fake_run_release)
    versions.main(["--releases", "4.45", "--out", str(tmp_path / "out"), "--dir", str(tmp_path / "dir")])
    assert asked == ["4.45.0"]


@pytest.mark.parametrize(("argv", "says"), [
    (["--models", "tiny,qwen3"], "--kv-model 'qwen3' is not a preset (smollm2-135m"),
    (["--models", "gemma3-270m@layers=4"], "layers 4 is not a positive multiple of 6"),
    (["--jobs", "abc"], "argument --jobs: 'abc' is not a whole number of at least 1"),
    (["--jobs", "0"], "argument --jobs: '0' is not a whole number of at least 1"),
    (["--since", "4.x"], "argument --since: not a final release number: '4.x'"),
])
def test_bad_arguments_are_one_line_errors_before_anything_runs(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_info:
        versions.parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and "Traceback" not in "".join(err), err


def test_defaults_and_pytest_args_after_double_dash(tmp_path):
    args = versions.parse_args([])
    assert args.releases is None and args.jobs == 1 and args.pytest_args == []
    assert args.out == versions.ROOT / ".versions" / "results"
    args = versions.parse_args(["--out", str(tmp_path), "--jobs", "3", "--", "--kv-model", "tiny", "-x"])
    assert args.out == tmp_path and args.jobs == 3
    assert args.pytest_args == ["--kv-model", "tiny", "-x"]
    with pytest.raises(SystemExit):
        versions.parse_args(["--jobs", "0"])


def test_constraints_pin_all_but_the_transformers_family(tmp_path):
    installed = {"numpy": "2.4.6", "transformers": "5.24.0", "huggingface-hub": "2.4.0", "tokenizers": "0.23.3",
                 "safetensors": "0.8.0", "hf-xet": "1.8.0", "kvcache-passes": "0.1.0", "pyyaml": "6.0.4"}
    text = versions.write_constraints(tmp_path / "c.txt", installed).read_text()
    assert text.split() == ["numpy==2.4.6", "pyyaml==6.0.4"]


def test_main_compares_ran_releases_oldest_first(tmp_path, monkeypatch, capsys):
    from fakerun import make_run, write_run

    def fake_run_release(release, args, constraints, installed, model=None):
        if release == "4.46.3":
            return versions.Outcome(release, "skipped", "pip install failed: no matching distribution")
        counted = {"dynamic": 5.0, "static": 1.0} if release == "5.10.4" else None
        path = write_run(args.out / f"counted-{release}.json", make_run(counted=counted, transformers=release))
        return versions.Outcome(release, "ran", json=path, seconds=1.0)

    monkeypatch.setattr(versions, "run_release", fake_run_release)
    status = versions.main(["--releases", "5.10.4,4.46.3,5.0.0", "--out", str(tmp_path / "out"),
                            "--dir", str(tmp_path / "dir")])
    assert status == 1  # counted 3 -> 5 in 5.10.4
    out = capsys.readouterr().out
    compare_md = (tmp_path / "out" / "compare.md").read_text()
    assert "Baseline: transformers 5.0.0" in compare_md and "5.10.4" in compare_md
    assert "ran (2): 5.0.0; 5.10.4" in out
    assert "skipped (1): 4.46.3 (pip install failed: no matching distribution)" in out
    counted_md = (tmp_path / "out" / "counted.md").read_text()
    assert counted_md.splitlines()[0] == "| releases | dynamic | static |"
    assert "| 5.0.0 | 3.00 · 1680 ops · 1.010 w | 1.00 · 1680 ops · 1.010 w |" in counted_md
    assert "| 5.10.4 | 5.00 · 1680 ops · 1.010 w |" in counted_md


def test_models_run_per_release_with_absent_and_failed_cells(tmp_path, monkeypatch, capsys):
    """``--models``: one run per release and model; a release that lacks a model's architecture is skipped with the
    suite's reason (one cell across), a class whose count failed shows the log's message."""
    from fakerun import make_run, write_run

    def fake_run_release(release, args, constraints, installed, model=None):
        stem = versions._stem(release, model)
        if model == "gemma3-270m@layers=6" and release == "4.46.3":
            reason = f"--kv-model 'gemma3-270m@layers=6': model_type 'gemma3_text' {versions.ABSENT_ARCHITECTURE}"
            (args.out / f"{stem}.log").write_text(f"ERROR: {reason}\n")
            return versions.Outcome(release, reason=reason, model=model)
        run = make_run(transformers=release)
        if release == "5.0.0":
            del run["kv"]["traffic"]["static"]  # its count failed: no figure, the class in kv.session.failed
            run["kv"]["session"]["failed"] = ["static"]
            if model == "tiny":  # its message as the plugin records it; the other model's run is an older one
                run["kv"]["session"]["reasons"] = {"static": "RuntimeError: index_copy_(): shapes differ"}
        path = write_run(args.out / f"counted-{stem}.json", run)
        if release == "5.0.0" and model != "tiny":  # a run without kv.session.reasons: the message in its log
            (args.out / f"{stem}.log").write_text("FAILED benchmarks/test_traffic.py::test_traffic[static] - "
                                                  "RuntimeError: index_copy_(): shapes differ\n")
        return versions.Outcome(release, "ran", json=path, seconds=1.0, model=model)

    monkeypatch.setattr(versions, "run_release", fake_run_release)
    assert versions.parse_models("families")[:2] == ["qwen3-0.6b@layers=4", "mistral-7b@layers=1"]
    status = versions.main(["--releases", "4.46.3,5.0.0", "--models", "tiny,gemma3-270m@layers=6",
                            "--out", str(tmp_path / "out"), "--dir", str(tmp_path / "dir")])
    assert status == 0
    counted_md = (tmp_path / "out" / "counted.md").read_text()
    assert "## tiny" in counted_md and "## gemma3-270m@layers=6" in counted_md
    gemma = counted_md.split("## gemma3-270m@layers=6")[1]
    # the table is Markdown through kvcache.analysing.tables: "@" cannot mention anyone, a trailing "_" is escaped
    assert "| 4.46.3 | skipped: --kv-model 'gemma3-270m@&#8203;layers=6': model_type 'gemma3_text' is not in" in gemma
    assert "failed: RuntimeError: index_copy\\_(): shapes differ" in gemma
    assert "failed: RuntimeError: index_copy\\_(): shapes differ" in counted_md.split("## gemma3-270m")[0]  # tiny
    assert "skipped (1): 4.46.3 gemma3-270m@layers=6" in capsys.readouterr().out
    (tmp_path / "out" / "counted.md").unlink()
    monkeypatch.setattr(versions, "run_release", None)  # --tabulate runs nothing
    versions.main(["--releases", "4.46.3,5.0.0", "--models", "tiny,gemma3-270m@layers=6", "--tabulate",
                   "--out", str(tmp_path / "out"), "--dir", str(tmp_path / "dir")])
    assert (tmp_path / "out" / "counted.md").read_text() == counted_md
    for release in ("4.46.3", "5.0.0"):  # without --releases: the releases whose logs are there
        (tmp_path / "out" / f"{versions._stem(release, 'tiny')}.log").touch()
    assert versions.recorded_releases(tmp_path / "out") == ["4.46.3", "5.0.0"]
    monkeypatch.setattr(versions, "default_releases", None)  # nor asks the package index
    versions.main(["--models", "tiny,gemma3-270m@layers=6", "--tabulate", "--out", str(tmp_path / "out"),
                   "--dir", str(tmp_path / "dir")])
    assert (tmp_path / "out" / "counted.md").read_text() == counted_md


def test_families_are_the_presets():
    from kvcache.analysing import presets

    assert sorted(m.split("@")[0] for m in versions.FAMILIES) == sorted(presets.FAMILY_PRESETS)
    for name in versions.FAMILIES:
        presets.split_layers(name)  # a depth the preset accepts (a multiple of its layer pattern)


def test_run_release_checks_the_install_through_the_one_installer(tmp_path):
    """A release installed in ``--dir`` that imports as another version is skipped with
    kvcache.analysing.releases.ensure's reason (no pytest run)."""
    target = tmp_path / "dir" / "5.0.0"
    (target / "transformers").mkdir(parents=True)
    (target / "transformers" / "__init__.py").write_text("__version__ = '5.0.1'\n")
    (target / releases.INSTALLED_MARKER).write_text("transformers==5.0.0\n")
    args = versions.parse_args(["--out", str(tmp_path / "out"), "--dir", str(tmp_path / "dir")])
    args.out.mkdir()
    outcome = versions.run_release("5.0.0", args, tmp_path / "unused-constraints.txt", {})
    assert (outcome.status, outcome.reason) == ("skipped", "imported transformers 5.0.1 instead of 5.0.0")
    assert "import transformers" in (args.out / "5.0.0.log").read_text()


def test_the_decoding_run_adds_its_keys_as_columns(tmp_path, monkeypatch):
    """A release's ``decoding-<release>.json`` (the default model's ``dynamic#beam:4`` and
    ``dynamic#assisted:self:4``) puts a column per key beside the classes; per generated token where a step yields
    several; a release without one shows the missing mark."""
    from fakerun import make_run, write_run

    assert versions.parse_args([]).decoding == "beam:4,assisted:self:4"
    assert versions.parse_args(["--decoding", "none"]).decoding == "none"

    def fake_run_release(release, args, constraints, installed, model=None):
        path = write_run(args.out / f"counted-{release}.json", make_run(transformers=release))
        if release == "5.25.0":
            run = make_run(caches={"dynamic#beam:4": 5.0, "dynamic#assisted:self:4": 27.0}, transformers=release)
            run["kv"]["traffic"]["dynamic#assisted:self:4"].update(strategy="assisted:self:4", tokens_per_step=5,
                                                                    passes_per_token=5.4)
            run["kv"]["traffic"]["dynamic#beam:4"].update(strategy="beam:4", tokens_per_step=1, passes_per_token=5.0)
            write_run(args.out / f"decoding-{release}.json", run)
        return versions.Outcome(release, "ran", json=path, seconds=1.0)

    monkeypatch.setattr(versions, "run_release", fake_run_release)
    versions.main(["--releases", "5.24.0,5.25.0", "--out", str(tmp_path / "out"), "--dir", str(tmp_path / "d")])
    counted_md = (tmp_path / "out" / "counted.md").read_text()
    header = "| releases | dynamic | static | dynamic\\#beam:4 | dynamic\\#assisted:self:4 |"  # "#" escaped
    assert counted_md.splitlines()[0] == header
    row = next(line for line in counted_md.splitlines() if line.startswith("| 5.25.0 |"))
    assert "| 5.00 · " in row and "27.00 · 5.40 per token (5 a step)" in row, row
    assert next(line for line in counted_md.splitlines() if line.startswith("| 5.24.0 |")).endswith("| — | — |")
