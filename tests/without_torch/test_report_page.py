"""report.html itself: its assets and looks, `make bench` writing it, the page in headless Chromium (skipped when no
Chromium is installed) and a run whose every string is an injection attempt."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from fakerun import make_run, without
from test_report import PNG_MAGIC, drop_points, embedded_data, render_dicts

from kvcache.analysing import tables

# ----------------------------------------------------------------------------------------------- the page


def css_rule(page: str, selector: str) -> dict[str, str]:
    m = re.search(r"(?:^|[}\s])" + re.escape(selector) + r"\{([^}]*)\}", page)
    assert m, selector
    return dict(decl.split(":", 1) for decl in m.group(1).split(";") if decl.strip())


def test_slider_cursor_and_trained_context_look_different(tmp_path):
    page = (render_dicts(tmp_path, make_run()) / "report.html").read_text()
    cursor, trained = css_rule(page, ".cursor"), css_rule(page, ".trained")
    assert cursor["stroke"] != trained["stroke"]
    assert "stroke-dasharray" in trained and cursor.get("stroke-dasharray", "none") == "none"  # solid against dashed
    assert float(cursor["stroke-width"]) >= 1.5 * float(trained["stroke-width"])
    assert "Grey dashed vertical line: the model's trained context" in page
    assert "Solid blue vertical line: the context picked with the slider" in page


def test_page_inlines_its_assets_and_ships_no_test_hook(tmp_path):
    from kvcache.analysing.report import page as page_module

    page = (render_dicts(tmp_path, make_run()) / "report.html").read_text()
    for name in page_module.ASSETS:
        assert page_module.asset(name).strip() in page, name
    assert "selftest" not in page and "__kvErrors" not in page
    assert "<h2>Median step time against context — smollm2-135m, bfloat16</h2>" in page


def test_wheel_carries_the_report_assets(tmp_path):
    """The wheel built from pyproject.toml holds report.css and report.js beside the report modules."""
    setuptools = pytest.importorskip("setuptools")
    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (70, 1):  # bdist_wheel built in from 70.1
        pytest.importorskip("wheel", reason=f"setuptools {setuptools.__version__} builds wheels only with `wheel`")
    root = Path(__file__).parents[2]
    project = tmp_path / "project"
    for folder in ("kvcache", "benchmarks"):
        shutil.copytree(root / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, project / name)
    code = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    built = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dist")], cwd=project, capture_output=True,
                           text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    with zipfile.ZipFile(tmp_path / "dist" / built.stdout.strip().splitlines()[-1]) as wheel:
        names = set(wheel.namelist())
    from kvcache.analysing.report import page as page_module

    for name in page_module.ASSETS:
        assert f"kvcache/analysing/report/{name}" in names, sorted(n for n in names if "report" in n)
    assert "kvcache/analysing/report/__init__.py" in names


def test_report_package_is_not_git_ignored():
    """`make bench` writes report/ at the root, ignored; the package of the same name must not be."""
    root = Path(__file__).parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    files = [str(p.relative_to(root)) for p in (root / "kvcache" / "analysing" / "report").iterdir() if p.is_file()
             and p.suffix in (".py", ".css", ".js")]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *files], cwd=root, capture_output=True, text=True)
    assert ignored.stdout == "", ignored.stdout
    assert subprocess.run(["git", "check-ignore", "-q", "--no-index", "report/report.md"], cwd=root).returncode == 0


# ----------------------------------------------------------------------------------------------- make bench

FAKE_PYTHON = """#!/bin/sh
# Stands in for the venv's python: `-m pytest` writes results.json only when RESULTS=1, then fails;
# `-m kvcache.cli report` records that the report was rebuilt.
case "$2" in
  pytest) [ "$RESULTS" = 1 ] && echo '{}' > results.json; exit 1 ;;
  kvcache.cli) echo "$@" >> report-calls.log; exit 0 ;;
esac
exit 0
"""


@pytest.fixture
def bench_dir(tmp_path: Path) -> Path:
    """A directory where ``make bench`` runs the fake python of an already-installed venv."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    (tmp_path / "pyproject.toml").write_text("")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    stamp = tmp_path / "venv" / ".bench"
    stamp.write_text("")
    os.utime(tmp_path / "pyproject.toml", (0, 0))  # the venv is newer than pyproject.toml: nothing to install
    (tmp_path / "results.json").write_text('{"stale": true}')  # an older run's results
    os.utime(tmp_path / "results.json", (0, 0))
    return tmp_path


def make_bench(where: Path, **env: str) -> subprocess.CompletedProcess:
    makefile = Path(__file__).parents[2] / "Makefile"
    return subprocess.run(["make", "--no-print-directory", "-f", str(makefile), "bench", "VENV=venv"], cwd=where,
                          capture_output=True, text=True, env={**os.environ, **env})


def test_failed_bench_does_not_rebuild_the_report_from_older_results(bench_dir):
    done = make_bench(bench_dir, RESULTS="0")
    assert done.returncode != 0, done.stdout + done.stderr
    assert not (bench_dir / "results.json").exists()
    assert not (bench_dir / "report-calls.log").exists(), "report rebuilt from the older results.json"


def test_bench_with_failures_but_new_results_still_reports(bench_dir):
    done = make_bench(bench_dir, RESULTS="1")
    assert done.returncode != 0  # pytest's status is kept
    assert (bench_dir / "results.json").read_text().strip() == "{}"
    assert "report results.json --out report" in (bench_dir / "report-calls.log").read_text()


# ----------------------------------------------------------------------------------------------- browser

CHROMIUM = os.environ.get("CHROMIUM") or next(
    (p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium, isolated profile, no network features; console messages logged to stderr."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--hide-scrollbars", "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=120)


# Errors and console errors go to window.__kvErrors; so does any alert/confirm/prompt (what an injected handler
# would call), which also leaves a <pre class="kv-alert"> in the DOM however late it fires.
CAPTURE_ERRORS = ("window.__kvErrors=[];window.addEventListener('error',function(e){window.__kvErrors.push(String("
                  "e.message||e.type));});(function(){var o=console.error;console.error=function(){"
                  "window.__kvErrors.push(Array.prototype.map.call(arguments,String).join(' '));"
                  "return o.apply(console,arguments);};})();"
                  "window.alert=window.confirm=window.prompt=function(m){window.__kvErrors.push('alert: '+m);"
                  "var p=document.createElement('pre');p.className='kv-alert';p.textContent=String(m);"
                  "(document.body||document.documentElement).appendChild(p);};")


def with_selftest(page: Path) -> Path:
    """A copy of report.html with the test's hooks injected: an error catcher before anything runs and
    report_selftest.js after the page's own script (the shipped page carries neither)."""
    text = page.read_text(encoding="utf-8")
    hook = (Path(__file__).with_name("report_selftest.js")).read_text(encoding="utf-8")
    text = text.replace("<head>", f"<head>\n<script>{CAPTURE_ERRORS}</script>", 1)
    text = text.replace("</body>", f"<script>{hook}</script>\n</body>", 1)
    out = page.with_name("report-selftest.html")
    out.write_text(text, encoding="utf-8")
    return out


def selftest_result(dom: str) -> re.Match | None:
    """The last ``<pre id="selftest">`` of a dumped DOM: what report_selftest.js wrote."""
    found = list(re.finditer(r'<pre id="selftest">(.*?)</pre>', dom, re.S))
    return found[-1] if found else None


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line and re.search(r"Uncaught|rror", line)]


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium); CI installs it")
def test_html_in_headless_chromium(tmp_path):
    a = make_run()
    a["kv"]["skipped"] = [{"cache": "static", "context": 8192, "reason": "out of memory"}]
    a = drop_points(a, "static", 8192)
    b = make_run({"dynamic": 2.5, "static": 1.0, "quantized": 0.6}, transformers="5.25.0", rounds=2, seed=1)
    page = render_dicts(tmp_path, a, b) / "report.html"

    dom = chromium(tmp_path, "--dump-dom", with_selftest(page).as_uri())
    m = selftest_result(dom.stdout)
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
    dom = chromium(tmp_path, "--dump-dom", with_selftest(page).as_uri())
    m = selftest_result(dom.stdout)
    assert m, f"no self-test result in the DOM (rc {dom.returncode}): {dom.stderr[-2000:]}"
    result = json.loads(m.group(1))
    assert result["errors"] == [] and console_errors(dom.stderr) == []
    assert result["chart"] and result["points"] == 0
    assert result["after"] == "no measured contexts in this run"


# ----------------------------------------------------------------------------------------------- injection

# What every string of the poisoned run starts with: HTML that runs script, a comment opener that swallows the page's
# own script, a script-element breakout, attribute breakouts, Markdown table, link, image, code, emphasis and
# strikethrough syntax, an entity, mathtext that matplotlib cannot parse, and a JavaScript line terminator.
PAYLOAD = ("<img src=x onerror=alert(1)><!--<script></script><script>alert(1)</script>| x |\"'><svg onload=alert(1)>"
           "[l](javascript:alert(1))![i](x)`c`*e*_u_~s~&lt;$\\frac$\u2028 ")
# Every element report.html (with the test's hooks) is made of; an injected <img>, <b>, <a>... is none of these.
PAGE_TAGS = {"html", "head", "meta", "title", "style", "script", "body", "h1", "h2", "h3", "h4", "section", "p", "div",
             "label", "input", "span", "svg", "g", "line", "text", "path", "circle", "button", "table", "thead",
             "tbody", "tr", "th", "td", "ul", "ol", "li", "strong", "pre"}


def poisoned_run() -> dict:
    """A run with every part the report shows (fakerun.make_run plus a per-op ledger, a ledger error and a skipped
    point) in which every string value, and every key that names a cache class or an op, starts with PAYLOAD. Only
    ``extra_info.kind`` is kept: it says which benchmarks are timed points."""
    run = drop_points(make_run(), "static", 8192)
    kv = run["kv"]
    kv["skipped"] = [{"cache": "static", "context": 8192, "reason": "out of memory"}]
    kv["ledger"] = {"dynamic": {"cat": {"timed": 2.1, "timed_ci": [1.9, 2.3], "ms": 1.5},
                                "(unattributed)": {"timed": 0.2, "timed_ci": [0.1, 0.3], "ms": 0.4}}}
    kv["ledger_errors"] = {"static": "the profiler failed"}
    names = set(kv["fit"]) | {op for t in kv["traffic"].values() for op in t["by_op"]} | {
        op for rows in kv["ledger"].values() for op in rows} | {m for p in kv["probe"].values() for m in p["modes"]}

    def poison(value, key=None):
        if isinstance(value, dict):
            return {(PAYLOAD + k if k in names else k): poison(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [poison(v, key) for v in value]
        return PAYLOAD + value if isinstance(value, str) and key != "kind" else value

    return poison(run)


LONG_NAMES = pytest.mark.filterwarnings("ignore:.*layout not applied:UserWarning")  # PAYLOAD-long tick labels


@LONG_NAMES
def test_poisoned_run_markdown_is_escaped(tmp_path):
    """report.md of a run whose every string is an injection attempt: no raw < > of the run survives, no table
    gains a column, no Markdown syntax of the run is left unescaped; each string is there, escaped once."""
    md = (render_dicts(tmp_path, poisoned_run()) / "report.md").read_text(encoding="utf-8")
    assert "<" not in md and ">" not in md
    assert re.findall(r"(?<!\\)[`*~$\[\]]", md.replace("- **", "").replace("**: ", "")) == []
    for name in ("smollm2-135m", "dynamic", "static", "cat", "out of memory", "the profiler failed", "5.24.0",
                 "cpu: test machine", "bfloat16", "test cpu"):
        assert tables.escape_markdown(PAYLOAD + name) in md, name
    widths = [len(re.findall(r"(?<!\\)\|", line)) for line in md.splitlines() if line.startswith("|")]
    tables_md = [block for block in md.split("\n\n") if block.startswith("|")]
    assert len(tables_md) == 7 and len(widths) == sum(len(t.splitlines()) for t in tables_md)
    for block in tables_md:
        assert len({len(re.findall(r"(?<!\\)\|", line)) for line in block.splitlines()}) == 1, block[:200]


@LONG_NAMES
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium); CI installs it")
def test_poisoned_run_in_headless_chromium(tmp_path):
    """report.html of a run whose every string is an injection attempt, in headless Chromium: nothing injected (no
    element the page does not make, no handler, no extra script, no alert), the data intact, the chart drawn with
    every name shown literally."""
    page = render_dicts(tmp_path, poisoned_run()) / "report.html"
    text = page.read_text(encoding="utf-8")
    for raw in ("<img", "<svg onload", "<!--", "<script>alert"):
        assert raw not in text.replace('<script type="application/json" id="report-data">', ""), raw
    data = embedded_data(text)
    assert [s["label"] for s in data["series"]] == [PAYLOAD + "dynamic", PAYLOAD + "static"]
    assert data["series"][1]["skipped"] == {"8192": PAYLOAD + "out of memory"}

    dom = chromium(tmp_path, "--dump-dom", with_selftest(page).as_uri())
    assert 'class="kv-alert"' not in dom.stdout
    m = selftest_result(dom.stdout)
    assert m, f"no self-test result in the DOM (rc {dom.returncode}): {dom.stderr[-2000:]}"
    result = json.loads(html.unescape(m.group(1)))
    assert result["errors"] == [] and console_errors(dom.stderr) == []
    assert result["handlers"] == [] and set(result["tags"]) <= PAGE_TAGS, result["tags"]
    assert result["scripts"] == 4  # the test's two hooks, the page's data and report.js
    assert result["svg"] == 1 and result["points"] == 9 and result["lines"] == 2 and result["contexts"] == 5
    assert result["changed"] and f"skipped: {PAYLOAD}out of memory" in result["before"]
    assert f"— {PAYLOAD}smollm2-135m, {PAYLOAD}bfloat16" in result["title"]
    assert result["legend"] == [PAYLOAD + "dynamic", PAYLOAD + "static"]
    assert result["tooltip"].startswith(PAYLOAD + "dynamic")
