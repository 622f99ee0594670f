"""kvcache.analysing.report: no figure where a fit gives none (no number, line or crossover), the crossovers, and the
PNG charts (titles, legends, rows of bars)."""

from __future__ import annotations

import re

import pytest
from fakerun import BYTES_PER_TOKEN, WEIGHT_BYTES, analysed, make_run, without
from test_report import PNG_MAGIC, render_dicts

from kvcache.analysing import report
from kvcache.analysing.records import KV, Run, points_from_benchmarks

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
    """The class's row of the (first run's) fit table."""
    fit = md.split("### Fit", 1)[1].split("###", 1)[0]
    return next(line for line in fit.splitlines() if line.startswith(f"| {cache} |"))


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
    loaded = Run(path="x.json", points=points_from_benchmarks(run["benchmarks"]), record=KV.from_json(run["kv"]))
    groups = report.points_by_cache(loaded)
    assert report.fit_line(loaded, "dynamic", groups["dynamic"]) is None
    assert report.fit_line(loaded, "static", groups["static"]) is not None
    render_dicts(tmp_path, run)
    assert not any(t.startswith("dynamic fit") or "/-" in t for t in legends), legends
    assert any(t.startswith("static fit:") and "refit from points" in t for t in legends), legends


def test_refit_needs_three_contexts(tmp_path, legends):
    run = without(make_run(contexts=(512, 1024)), "fit")
    loaded = Run(path="x.json", points=points_from_benchmarks(run["benchmarks"]), record=KV.from_json(run["kv"]))
    assert report.fit_line(loaded, "dynamic", report.points_by_cache(loaded)["dynamic"]) is None
    md = (render_dicts(tmp_path, run) / "report.md").read_text()
    assert "| dynamic | no fit |" in md
    assert not any(" fit: " in t for t in legends), legends


# ----------------------------------------------------------------------------------------------- crossovers

WEIGHTS_HELD_AT = WEIGHT_BYTES / BYTES_PER_TOKEN  # 11,677 tokens: the cache holds as many bytes as the weights


def test_crossovers_worked_out_from_the_run():
    kv = make_run({"dynamic": 3.0, "static": 1.0})["kv"]
    del kv["crossovers"]  # a run written before the analysis recorded them
    out = report.run_crossovers(KV.from_json(kv))
    assert out.cache_holds_weights_tokens == pytest.approx(WEIGHTS_HELD_AT) and round(WEIGHTS_HELD_AT) == 11_677
    dynamic = out.by_cache["dynamic"]
    assert dynamic.counted_tokens == pytest.approx(WEIGHT_BYTES / (3.0 * BYTES_PER_TOKEN))
    assert round(dynamic.counted_tokens) == 3_892
    assert dynamic.timed_tokens == pytest.approx(dynamic.counted_tokens)  # timed passes 3.0 too
    kv["traffic"]["static"]["passes"] = 0.0
    out = report.run_crossovers(KV.from_json(kv))
    assert out.by_cache["static"].counted_tokens is None  # no crossover without a positive passes figure
    del kv["model"]["weight_bytes"]
    out = report.run_crossovers(KV.from_json(kv))
    assert out.cache_holds_weights_tokens is None and out.by_cache["dynamic"].timed_tokens is None


def test_recorded_crossovers_are_preferred():
    kv = make_run()["kv"]
    kv["crossovers"] = {"cache_holds_weights_tokens": 123.0, "dynamic": {"timed_tokens": 45.0, "counted_tokens": 67.0}}
    record = KV.from_json(kv)
    assert report.run_crossovers(record) is record.crossovers and record.crossovers.cache_holds_weights_tokens == 123.0


def test_fit_table_shows_timed_and_counted_crossovers(tmp_path):
    run = make_run({"dynamic": 6.0, "static": 1.0}, counted={"dynamic": 3.0, "static": 1.0})
    out = render_dicts(tmp_path, run)
    md = (out / "report.md").read_text()
    assert "| timed/counted | crossover tokens (timed) | crossover tokens (counted) |\n" in md
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
    return [Run(path=f"run{i}.json", points=points_from_benchmarks(r["benchmarks"]), record=KV.from_json(r["kv"]))
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


