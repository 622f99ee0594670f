"""scripts/check_wheel.py without building or installing: the README steps it runs are found in the README as
written, and a distribution that lacks a file of the checkout, or whose metadata is wrong, fails with one line
naming it. (The whole script, build to README steps, runs in .ci/run and the release workflow.)"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import check_wheel  # noqa: E402

METADATA = """Metadata-Version: 2.1
Name: kvcache-passes
Version: 0.1.0
Summary: s
Requires-Python: >=3.9
Description-Content-Type: text/markdown
Provides-Extra: bench
Provides-Extra: report
Provides-Extra: quantized
Provides-Extra: test

# kvcache-passes
"""


def fake_wheel(tmp_path: Path, files: list[str], metadata: str = METADATA, points: str = "") -> Path:
    path = tmp_path / "kvcache_passes-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name in files:
            z.writestr(name, "")
        z.writestr("kvcache_passes-0.1.0.dist-info/METADATA", metadata)
        z.writestr("kvcache_passes-0.1.0.dist-info/entry_points.txt",
                   points or "\n".join(check_wheel.ENTRY_POINTS))
    return path


def test_the_readme_steps_are_found_as_written():
    steps = check_wheel.readme_steps()
    assert 'register_cache("mine"' in steps["caches"]
    assert "--pyargs kvcache.benchmarks" in steps["baseline"] and "--kv-update-baseline" in steps["baseline"]
    assert steps["commit"].startswith("git add my_caches.py kv-baseline.json")
    assert "--pyargs kvcache.benchmarks" in steps["gate"] and "--kv-update-baseline" not in steps["gate"]


def test_a_file_missing_from_the_wheel_is_named(tmp_path):
    sources = ["kvcache/__init__.py", "kvcache/analysing/report/report.css", "benchmarks/test_traffic.py"]
    wheel = fake_wheel(tmp_path, ["kvcache/__init__.py", "kvcache/benchmarks/test_traffic.py"])
    with pytest.raises(check_wheel.CheckFailed, match=r"lacks 1 file\(s\) of the checkout: "
                                                      r"kvcache/analysing/report/report.css$"):
        check_wheel.check_contents(wheel, sources)
    check_wheel.check_contents(wheel, [s for s in sources if not s.endswith(".css")])


def test_metadata_is_read_and_its_faults_named(tmp_path):
    assert check_wheel.check_metadata(fake_wheel(tmp_path, [])) == "0.1.0"
    broken = METADATA.replace("Provides-Extra: quantized\n", "").replace("text/markdown", "text/x-rst")
    with pytest.raises(check_wheel.CheckFailed, match="Description-Content-Type is 'text/x-rst'.*extras missing: "
                                                      "quantized; entry_points.txt lacks '\\[pytest11\\]'"):
        check_wheel.check_metadata(fake_wheel(tmp_path, [], broken, points="[console_scripts]\n"))
