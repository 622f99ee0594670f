"""kvcache.analysing.report on synthetic runs (tests/fakerun.py): all four outputs, runs missing parts, bad input,
and report.html in headless Chromium (skipped when no Chromium is installed)."""

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
from fakerun import BYTES_PER_TOKEN, WEIGHT_BYTES, analysed, make_run, without, write_run

from kvcache.analysing import report, tables
from kvcache.analysing.records import Run, load_run, points_from_benchmarks

OUTPUTS = ("report.md", "report.html", "latency.png", "traffic.png")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def render_dicts(tmp_path: Path, *runs: dict, out: str = "out") -> Path:
    paths = [write_run(tmp_path / f"run{i}.json", run) for i, run in enumerate(runs)]
    written = report.render([load_run(p) for p in paths], tmp_path / out)
    ledger = ("ledger.png",) if any(run["kv"].get("ledger") for run in runs) else ()
    ledger += ("memory.png",) if any(run["kv"].get("memory") for run in runs) else ()
    assert sorted(p.name for p in written) == sorted(OUTPUTS + ledger)
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
    assert "| dynamic | 30.00 | 6.67 | 3.00 \\[2.85, 3.15\\]" in md
    assert "| static | 30.00 | 20.00 | 1.00 \\[0.95, 1.05\\]" in md
    for text in ("transformers 5.24.0", "torch 2.13.0+cpu", "smollm2-135m", "bfloat16", "CPU test cpu",
                 "start 20.00 GB/s, end 20.00 GB/s", "Drift: dynamic at 512 tokens", "native gqa (enable_gqa)",
                 "1×3×1024×64", "counted no-baseline: no baseline for", "cat 2.00"):
        assert text in md, text
    assert "no counted traffic" not in md and "no fit" not in md
    page = (out / "report.html").read_text()
    for ident in ('id="latency-chart"', 'id="context-slider"', 'id="slider-readout"'):
        assert page.count(ident) == 1, ident
    assert "<table>" in page and "cat 2.00" in page
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
    assert "| dynamic | 30.00 | 6.67 | 3.00 \\[2.85, 3.15\\] | 0.990 | — | — |" in md
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
    code = "import sys, kvcache.analysing.report; sys.exit('torch' in sys.modules or 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2]).returncode == 0


# ----------------------------------------------------------------------------------------------- no nonsense

NEGATIVE = re.compile(r"(?<![\w.])[-\u2212]\d")  # a minus sign before a digit, not a hyphen inside a word


@pytest.fixture
def legends(monkeypatch):
    """Every legend text of the PNGs drawn while the test runs."""
    import matplotlib.axes

    texts: list[str] = []
    original = matplotlib.axes.Axes.legend

    def spy(self, *args, **kwargs):
        legend = original(self, *args, **kwargs)
        texts.extend(t.get_text() for t in legend.get_texts())
        return legend

    monkeypatch.setattr(matplotlib.axes.Axes, "legend", spy)
    return texts


def fit_row(md: str, cache: str) -> str:
    rows = [line for line in md.splitlines() if line.startswith(f"| {cache} |") and "passes by op" not in line]
    return rows[0]


def decreasing_run() -> dict:
    """dynamic's latency falls with context (its fit says why there is no passes figure), static's grows."""
    return analysed(make_run({"dynamic": -3.0, "static": 1.0}, counted={"dynamic": 3.0, "static": 1.0}))


def test_fit_error_gives_no_number_line_or_crossover(tmp_path, legends):
    run = decreasing_run()
    error = run["kv"]["fit"]["dynamic"]["error"]
    assert error.startswith("slope is not positive")
    out = render_dicts(tmp_path, run)
    md = (out / "report.md").read_text()
    row = fit_row(md, "dynamic")
    assert f"— ({error})" in row and "no passes figure" in row, row
    cells = [c.strip() for c in row.strip("|").split("|")]
    # intercept, effective GB/s, R², timed/counted and crossover: none; counted passes stay
    assert cells[1] == cells[2] == cells[4] == cells[6] == cells[7] == "—", row
    assert cells[5] == "3.00"
    static = [c.strip() for c in fit_row(md, "static").strip("|").split("|")]
    assert float(static[3].split()[0]) == pytest.approx(1.0, rel=0.05) and int(static[7].replace(",", "")) > 0
    # the reason may quote the slope it refused; nothing else in the report is negative
    assert not NEGATIVE.search(md.replace(error, "")), [line for line in md.splitlines() if NEGATIVE.search(line)]
    page = (out / "report.html").read_text()
    tables = page.split('<div id="slider-readout"', 1)[1].split("<script", 1)[0]
    assert error in tables and not NEGATIVE.search(tables.replace(error, ""))
    fits = [t for t in legends if " fit: " in t]
    assert len(fits) == 1 and re.fullmatch(r"static fit: 30\.\d ms \+ KV/(19|20|21)\.\d\d GB/s", fits[0]), legends
    assert any(t.startswith("dynamic (median") for t in legends), legends  # its points are still drawn


def legacy_run(fit: dict, contexts: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)) -> dict:
    """A run written before fits were checked: kv.fit holds whatever the line gave."""
    run = make_run({"dynamic": 3.0, "static": 1.0}, contexts=contexts)
    run["kv"]["fit"]["dynamic"] = {"n_points": len(contexts), "contexts": list(contexts), **fit}
    run["kv"]["fit"]["static"].pop("contexts")  # a record that does not name its contexts is judged by its passes
    return run


@pytest.mark.parametrize(("fit", "contexts", "reason"), [
    ({"intercept_ms": 41.2, "effective_gbps": None, "passes": -1318.49, "passes_ci": [-3327.26, 729.96], "r2": 0.31,
      "crossover_tokens": None, "slope_ms_per_gb": -1.41}, (512, 1024, 2048), "slope is not positive"),
    ({"intercept_ms": 40.0, "effective_gbps": -0.71, "passes": -28.2, "passes_ci": [-30.0, -26.0], "r2": 0.9,
      "crossover_tokens": None}, (512, 1024, 2048), "slope is not positive"),
    ({"intercept_ms": 12.0, "effective_gbps": 1.4e-05, "passes": 1379849.0, "passes_ci": [1379849.0, 1379849.0],
      "r2": 1.0, "crossover_tokens": 11.0}, (1, 2), "needs at least 3 distinct contexts"),
])
def test_old_run_with_a_nonsense_fit_shows_the_reason(tmp_path, legends, fit, contexts, reason):
    out = render_dicts(tmp_path, legacy_run(fit, contexts))
    md = (out / "report.md").read_text()
    row = fit_row(md, "dynamic")
    assert reason in row and "no passes figure" in row, row
    for figure in ("1318", "1,379,849", "1379849", "| 11 |", "28.20", "0.71", "41.20"):
        assert figure not in row, (figure, row)
    assert not NEGATIVE.search(md), [line for line in md.splitlines() if NEGATIVE.search(line)]
    assert not any(t.startswith("dynamic fit") or "/-" in t for t in legends), legends
    assert any(t.startswith("static fit:") for t in legends), legends


def test_refit_is_skipped_when_latency_falls(tmp_path, legends):
    """No kv.fit at all: the chart's own line from the points is drawn only where fit.py would give passes."""
    run = without(make_run({"dynamic": -3.0, "static": 1.0}, counted={"dynamic": 3.0, "static": 1.0}), "fit")
    loaded = Run(path="x.json", points=points_from_benchmarks(run["benchmarks"]), kv=run["kv"])
    groups = report.points_by_cache(loaded)
    assert report.fit_line(loaded, "dynamic", groups["dynamic"]) is None
    assert report.fit_line(loaded, "static", groups["static"]) is not None
    render_dicts(tmp_path, run)
    assert not any(t.startswith("dynamic fit") or "/-" in t for t in legends), legends
    assert any(t.startswith("static fit:") and "refit from points" in t for t in legends), legends


def test_refit_needs_three_contexts(tmp_path, legends):
    run = without(make_run(contexts=(512, 1024)), "fit")
    loaded = Run(path="x.json", points=points_from_benchmarks(run["benchmarks"]), kv=run["kv"])
    assert report.fit_line(loaded, "dynamic", report.points_by_cache(loaded)["dynamic"]) is None
    md = (render_dicts(tmp_path, run) / "report.md").read_text()
    assert "| dynamic | no fit |" in md
    assert not any(" fit: " in t for t in legends), legends


# ----------------------------------------------------------------------------------------------- crossovers

WEIGHTS_HELD_AT = WEIGHT_BYTES / BYTES_PER_TOKEN  # 11,677 tokens: the cache holds as many bytes as the weights


def test_crossovers_worked_out_from_the_run():
    kv = make_run({"dynamic": 3.0, "static": 1.0})["kv"]
    del kv["crossovers"]  # a run written before the analysis recorded them
    out = report.crossovers(kv)
    assert out["cache_holds_weights_tokens"] == pytest.approx(WEIGHTS_HELD_AT) and round(WEIGHTS_HELD_AT) == 11_677
    assert out["dynamic"]["counted_tokens"] == pytest.approx(WEIGHT_BYTES / (3.0 * BYTES_PER_TOKEN))
    assert round(out["dynamic"]["counted_tokens"]) == 3_892
    assert out["dynamic"]["timed_tokens"] == pytest.approx(out["dynamic"]["counted_tokens"])  # timed passes 3.0 too
    kv["traffic"]["static"]["passes"] = 0.0
    out = report.crossovers(kv)
    assert out["static"]["counted_tokens"] is None  # no crossover without a positive passes figure
    del kv["model"]["weight_bytes"]
    out = report.crossovers(kv)
    assert out["cache_holds_weights_tokens"] is None and out["dynamic"]["timed_tokens"] is None


def test_recorded_crossovers_are_preferred():
    kv = make_run()["kv"]
    kv["crossovers"] = {"cache_holds_weights_tokens": 123.0, "dynamic": {"timed_tokens": 45.0, "counted_tokens": 67.0}}
    assert report.crossovers(kv) is kv["crossovers"]


def test_fit_table_shows_timed_and_counted_crossovers(tmp_path):
    run = make_run({"dynamic": 6.0, "static": 1.0}, counted={"dynamic": 3.0, "static": 1.0})
    out = render_dicts(tmp_path, run)
    md = (out / "report.md").read_text()
    assert "| timed/counted | crossover tokens (timed) | crossover tokens (counted) | verdict |" in md
    dynamic = [c.strip() for c in fit_row(md, "dynamic").strip("|").split("|")]
    assert dynamic[7:9] == [f"{WEIGHT_BYTES / (6 * BYTES_PER_TOKEN):,.0f}", "3,892"], dynamic
    assert [c.strip() for c in fit_row(md, "static").strip("|").split("|")][7:9] == ["11,677", "11,677"]
    assert "holds as many bytes as the weights at 11,677 tokens" in md
    page = (out / "report.html").read_text()
    assert "<th>crossover tokens (counted)</th>" in page and "<td>3,892</td>" in page
    assert "holds as many bytes as the weights at 11,677 tokens" in page


def test_counted_crossover_stays_when_the_fit_gives_no_figure(tmp_path):
    md = (render_dicts(tmp_path, decreasing_run()) / "report.md").read_text()
    cells = [c.strip() for c in fit_row(md, "dynamic").strip("|").split("|")]
    assert cells[7] == "—" and cells[8] == "3,892", cells


# ----------------------------------------------------------------------------------------------- charts


def loaded(*runs: dict) -> list[Run]:
    return [Run(path=f"run{i}.json", points=points_from_benchmarks(r["benchmarks"]), kv=r["kv"])
            for i, r in enumerate(runs)]


def test_chart_titles_name_the_model_and_dtype():
    from matplotlib import pyplot as plt

    one = loaded(make_run())
    for fig in (report.latency_figure(one), report.traffic_figure(one)):
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
        assert titles and all("smollm2-135m, bfloat16" in t for t in titles), titles
        plt.close(fig)
    fig = report.traffic_figure(loaded(make_run(), make_run(transformers="5.25.0")))
    labels = [t.get_text() for ax in fig.axes for t in ax.texts if "transformers" in t.get_text()]
    assert len(labels) == 2 and all("smollm2-135m, bfloat16" in t for t in labels), labels
    plt.close(fig)


def test_latency_legend_lies_outside_the_axes():
    from matplotlib import pyplot as plt

    fig = report.latency_figure(loaded(make_run(), make_run(transformers="5.25.0")))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [(ax, ax.get_legend()) for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 2
    for ax, legend in legends:
        box = legend.get_window_extent(renderer)
        assert not box.overlaps(ax.get_window_extent(renderer)), (box, ax.get_window_extent(renderer))
        assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1)
    plt.close(fig)


def test_traffic_png_wraps_24_runs_into_rows(tmp_path):
    from matplotlib import pyplot as plt

    def bar_panels(fig) -> list:
        return [ax for ax in fig.axes if ax.patches]

    few = report.traffic_figure(loaded(*(make_run(transformers=f"5.{i}.0") for i in range(4))))
    many_runs = loaded(*(make_run(transformers=f"5.{i}.0") for i in range(24)))
    many = report.traffic_figure(many_runs)
    assert len(bar_panels(few)) == 1 and len(bar_panels(many)) == 6  # 4 runs of 2 classes a row
    assert max(len(ax.get_xticks()) for ax in bar_panels(many)) <= 12
    width_few, height_few = few.get_size_inches()
    width_many, height_many = many.get_size_inches()
    assert width_many == pytest.approx(width_few) and height_many > 4 * height_few
    annotated = {t.get_text().split("\n")[0] for ax in many.axes for t in ax.texts}
    assert annotated >= {f"transformers 5.{i}.0 on cpu: test machine" for i in range(24)}
    plt.close(few)
    plt.close(many)
    path = report.plot_traffic(many_runs, tmp_path / "traffic.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


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


def test_recorded_run_report(tmp_path):
    """The report of a real run as the analysis writes it (tests/data/tiny-run.json): every section present,
    the counted breakdown under the real op names, the crossovers from the run's own geometry."""
    from fakerun import recorded_run

    run = recorded_run(resamples=300)
    kv = run["kv"]
    out = render_dicts(tmp_path, run)
    md = (out / "report.md").read_text()
    assert "tiny" in md and "cat 2.00" in md and "scaled_dot_product_attention 1.00" in md
    held = kv["model"]["weight_bytes"] / kv["model"]["bytes_per_token"]
    assert kv["crossovers"]["cache_holds_weights_tokens"] == pytest.approx(held)
    assert f"{held:,.0f}" in md
    for name in ("latency.png", "traffic.png", "report.html"):
        assert (out / name).stat().st_size > 0


# ----------------------------------------------------------------------------------------------- injection

# What every string of the poisoned run starts with: HTML that runs script, a comment opener that swallows the page's
# own script, a script-element breakout, attribute breakouts, Markdown table, link, image, code, emphasis and
# strikethrough syntax, an entity, mathtext that matplotlib cannot parse, and a JavaScript line terminator.
PAYLOAD = ("<img src=x onerror=alert(1)><!--<script></script><script>alert(1)</script>| x |\"'><svg onload=alert(1)>"
           "[l](javascript:alert(1))![i](x)`c`*e*_u_~s~&lt;$\\frac$\u2028 ")
# Every element report.html (with the test's hooks) is made of; an injected <img>, <b>, <a>... is none of these.
PAGE_TAGS = {"html", "head", "meta", "title", "style", "script", "body", "h1", "h2", "h3", "h4", "section", "p", "div",
             "label", "input", "span", "svg", "g", "line", "text", "path", "circle", "button", "table", "thead",
             "tbody", "tr", "th", "td", "ul", "li", "strong", "pre"}


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
    assert len(tables_md) == 6 and len(widths) == sum(len(t.splitlines()) for t in tables_md)
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
