"""kvcache.report on synthetic runs (tests/fakerun.py): all four outputs, runs missing parts, bad input,
and report.html in headless Chromium (skipped when no Chromium is installed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakerun import make_run, without, write_run

from kvcache import report
from kvcache.records import Run, load_run, points_from_benchmarks

OUTPUTS = ("report.md", "report.html", "latency.png", "traffic.png")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def render_dicts(tmp_path: Path, *runs: dict, out: str = "out") -> Path:
    paths = [write_run(tmp_path / f"run{i}.json", run) for i, run in enumerate(runs)]
    written = report.render([load_run(p) for p in paths], tmp_path / out)
    assert sorted(p.name for p in written) == sorted(OUTPUTS)
    for name in OUTPUTS:
        assert (tmp_path / out / name).stat().st_size > 0, name
    for name in ("latency.png", "traffic.png"):
        assert (tmp_path / out / name).read_bytes().startswith(PNG_MAGIC)
    return tmp_path / out


def embedded_data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def drop_points(run: dict, cache: str, context: int) -> dict:
    out = without(run)
    out["benchmarks"] = [b for b in out["benchmarks"]
                         if not (b["extra_info"]["cache"] == cache and b["extra_info"]["context"] == context)]
    return out


def test_one_run_all_outputs(tmp_path):
    out = render_dicts(tmp_path, make_run())
    md = (out / "report.md").read_text()
    assert "| cache | intercept ms | effective GB/s |" in md
    assert "| dynamic | 30.00 | 6.67 | 3.00 [2.85, 3.15]" in md
    assert "| static | 30.00 | 20.00 | 1.00 [0.95, 1.05]" in md
    for text in ("transformers 5.24.0", "torch 2.13.0+cpu", "smollm2-135m", "bfloat16", "CPU test cpu",
                 "start 20.00 GB/s, end 20.00 GB/s", "Drift: dynamic at 512 tokens", "native-gqa", "1×3×1024×64",
                 "counted no-baseline: no baseline for this device", "aten.cat 2.00"):
        assert text in md, text
    assert "no counted traffic" not in md and "no fit" not in md
    page = (out / "report.html").read_text()
    for ident in ('id="latency-chart"', 'id="context-slider"', 'id="slider-readout"'):
        assert page.count(ident) == 1, ident
    assert "<table>" in page and "aten.cat 2.00" in page
    # self-contained: no external scripts, styles, images or fonts
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page
    data = embedded_data(page)
    assert data["contexts"] == [512, 1024, 2048, 4096, 8192]
    assert [s["cache"] for s in data["series"]] == ["dynamic", "static"]
    assert data["trained"] == [8192]
    assert 'max="4"' in page


def test_two_runs(tmp_path):
    a = make_run()
    b = make_run({"dynamic": 2.5, "static": 1.0, "quantized": 0.6}, transformers="5.25.0", rounds=2, seed=1)
    out = render_dicts(tmp_path, a, b)
    md = (out / "report.md").read_text()
    assert "## transformers 5.24.0 on cpu: test machine" in md
    assert "## transformers 5.25.0 on cpu: test machine" in md
    assert md.count("| cache | intercept ms |") == 2
    assert "| quantized | 30.00 | 33.33 |" in md
    data = embedded_data((out / "report.html").read_text())
    assert len(data["series"]) == 5
    assert {s["run"] for s in data["series"]} == {"transformers 5.24.0 on cpu: test machine",
                                                  "transformers 5.25.0 on cpu: test machine"}


def test_same_label_runs_are_told_apart_by_file(tmp_path):
    out = render_dicts(tmp_path, make_run(), make_run(seed=3))
    md = (out / "report.md").read_text()
    assert "## transformers 5.24.0 on cpu: test machine (run0.json)" in md
    assert "## transformers 5.24.0 on cpu: test machine (run1.json)" in md


def test_without_traffic(tmp_path):
    out = render_dicts(tmp_path, without(make_run(), "traffic"))
    md = (out / "report.md").read_text()
    assert "no counted traffic in this run" in md
    assert "| dynamic | 30.00 | 6.67 | 3.00 [2.85, 3.15] | 0.990 | — | — |" in md
    assert "no counted traffic in this run" in (out / "report.html").read_text()


def test_traffic_for_one_class_only(tmp_path):
    run = make_run()
    del run["kv"]["traffic"]["static"]
    md = (render_dicts(tmp_path, run) / "report.md").read_text()
    assert "no counted traffic for static in this run" in md
    assert "| static | no counted traffic |" in md


def test_without_fit_refits_the_line(tmp_path):
    md = (render_dicts(tmp_path, without(make_run(), "fit")) / "report.md").read_text()
    assert "no fit in this run" in md
    assert "| dynamic | no fit (chart line refit from points) |" in md


def test_refit_recovers_the_line():
    run_dict = without(make_run(noise=0.0), "fit")
    run = Run(path="x.json", points=points_from_benchmarks(run_dict["benchmarks"]), kv=run_dict["kv"])
    pts = report.points_by_cache(run)["dynamic"]
    line = report.fit_line(run, "dynamic", pts)
    assert line is not None and line["source"] == "refit from points"
    assert line["intercept_ms"] == pytest.approx(30.0, rel=1e-6)
    assert 1 / (line["ms_per_byte"] * 1e6) == pytest.approx(20.0 / 3.0, rel=1e-6)


def test_single_cache_class(tmp_path):
    out = render_dicts(tmp_path, make_run({"dynamic": 3.0}))
    md = (out / "report.md").read_text()
    assert "| dynamic |" in md and "| static |" not in md
    assert len(embedded_data((out / "report.html").read_text())["series"]) == 1


def test_class_missing_a_context(tmp_path):
    skipped = drop_points(make_run(), "static", 8192)
    skipped["kv"]["skipped"] = [{"cache": "static", "context": 8192, "reason": "out of memory"}]
    silent = drop_points(make_run(transformers="5.25.0"), "static", 4096)
    out = render_dicts(tmp_path, skipped, silent)
    md = (out / "report.md").read_text()
    assert "| static | 8,192 | out of memory |" in md
    assert "| static | 4,096 | not measured (no skip reason recorded) |" in md
    data = embedded_data((out / "report.html").read_text())
    static = [s for s in data["series"] if s["cache"] == "static"]
    assert static[0]["skipped"] == {"8192": "out of memory"}
    assert 8192 not in [m["context"] for m in static[0]["medians"]]


def test_whole_class_skipped(tmp_path):
    run = make_run()
    run["benchmarks"] = [b for b in run["benchmarks"] if b["extra_info"]["cache"] != "static"]
    run["kv"]["skipped"] = [{"cache": "static", "context": None, "reason": "not supported on cpu"}]
    md = (render_dicts(tmp_path, run) / "report.md").read_text()
    assert "| static | whole class | not supported on cpu |" in md


def test_no_points_and_nothing_else(tmp_path):
    run = without(make_run(), "fit", "traffic", "probe", "drift", "verdict", "copy", "copy_gbps", "model", "skipped")
    run["benchmarks"] = []
    out = render_dicts(tmp_path, run)
    md = (out / "report.md").read_text()
    for text in ("no timed points in this run", "no fit in this run", "no counted traffic in this run",
                 "no attention probe in this run", "no drift check in this run", "no verdict in this run",
                 "no copy bandwidth in this run", "no model description in this run"):
        assert text in md, text
    page = (out / "report.html").read_text()
    assert embedded_data(page)["contexts"] == []
    assert 'id="context-slider" min="0" max="0" step="1" value="0" disabled' in page


def test_drift_not_checked(tmp_path):
    run = make_run()
    run["kv"]["drift"] = {"reason": "only one round"}
    md = (render_dicts(tmp_path, run) / "report.md").read_text()
    assert "Drift: not checked (only one round)" in md


def test_main_writes_into_out(tmp_path, capsys):
    from kvcache import cli

    path = write_run(tmp_path / "run.json", make_run())
    assert cli.main(["report", str(path), "--out", str(tmp_path / "rep")]) == 0
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == sorted(OUTPUTS)
    assert "report.md" in capsys.readouterr().out


@pytest.mark.parametrize("content", [None, "{not json", '{"benchmarks": []}', "[]"])
def test_bad_input_exits_2_naming_the_file(tmp_path, capsys, content):
    good = write_run(tmp_path / "good.json", make_run())
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    assert report.main([str(good), str(bad), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err


def test_without_matplotlib_md_and_html_are_still_written(tmp_path, capsys, monkeypatch):
    path = write_run(tmp_path / "run.json", make_run())
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert report.main([str(path), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "matplotlib is not installed" in err
    assert (tmp_path / "rep" / "report.md").exists() and (tmp_path / "rep" / "report.html").exists()


def test_report_does_not_import_torch():
    code = "import sys, kvcache.report; sys.exit('torch' in sys.modules or 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1]).returncode == 0


# ----------------------------------------------------------------------------------------------- browser

CHROMIUM = os.environ.get("CHROMIUM") or next(
    (p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium, isolated profile, no network features; console messages logged to stderr."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--hide-scrollbars", "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line and re.search(r"Uncaught|rror", line)]


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium); CI installs it")
def test_html_in_headless_chromium(tmp_path):
    a = make_run()
    a["kv"]["skipped"] = [{"cache": "static", "context": 8192, "reason": "out of memory"}]
    a = drop_points(a, "static", 8192)
    b = make_run({"dynamic": 2.5, "static": 1.0, "quantized": 0.6}, transformers="5.25.0", rounds=2, seed=1)
    page = render_dicts(tmp_path, a, b) / "report.html"

    dom = chromium(tmp_path, "--dump-dom", page.as_uri() + "#selftest")
    m = re.search(r'<pre id="selftest">(.*?)</pre>', dom.stdout, re.S)
    assert m, f"no self-test result in the DOM (rc {dom.returncode}): {dom.stderr[-2000:]}"
    result = json.loads(m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    assert result["errors"] == [] and console_errors(dom.stderr) == []
    assert result["chart"] and result["svg"] == 1
    assert result["points"] == 9 + 30  # run a: 10 points less one skipped; run b: 3 classes x 5 contexts x 2 rounds
    assert result["lines"] == 5 and result["trained"] == 1 and result["contexts"] == 5
    assert result["changed"], result
    assert "context 8,192 tokens" in result["before"] and "skipped: out of memory" in result["before"]
    assert "context 512 tokens" in result["after"]
    assert "median" in result["tooltip"] and "KV cache" in result["tooltip"] and "counted" in result["tooltip"]

    shot = tmp_path / "report-screenshot.png"
    run = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,900", page.as_uri())
    assert shot.exists() and shot.read_bytes().startswith(PNG_MAGIC), run.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a drawn chart, not a blank page
    assert console_errors(run.stderr) == []
    if os.environ.get("KVCACHE_SCREENSHOT_DIR"):  # CI keeps the screenshot as an artifact
        Path(os.environ["KVCACHE_SCREENSHOT_DIR"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(os.environ["KVCACHE_SCREENSHOT_DIR"]) / shot.name)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium); CI installs it")
def test_html_without_points_in_headless_chromium(tmp_path):
    run = without(make_run(), "fit", "traffic")
    run["benchmarks"] = []
    page = render_dicts(tmp_path, run) / "report.html"
    dom = chromium(tmp_path, "--dump-dom", page.as_uri() + "#selftest")
    m = re.search(r'<pre id="selftest">(.*?)</pre>', dom.stdout, re.S)
    assert m, f"no self-test result in the DOM (rc {dom.returncode}): {dom.stderr[-2000:]}"
    result = json.loads(m.group(1))
    assert result["errors"] == [] and console_errors(dom.stderr) == []
    assert result["chart"] and result["points"] == 0
    assert result["after"] == "no measured contexts in this run"
