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
