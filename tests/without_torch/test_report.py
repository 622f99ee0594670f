"""kvcache.analysing.report on synthetic runs (tests/fakerun.py): all its outputs, the verdicts and the title,
runs missing parts, an A/B file, bad input and a recorded run. Fit errors, crossovers and the charts:
test_report_figures.py; report.html itself (assets, make bench, headless Chromium, injection): test_report_page.py."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fakerun import make_run, without, write_run

from kvcache.analysing import report, tables
from kvcache.analysing.records import KV, Run, load_run, points_from_benchmarks
from kvcache.commands import report as report_command

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
                 "1×3×1024×64", "cat 2.00, scaled_dot_product_attention 1.00"):
        assert text in md, text
    assert "no counted traffic" not in md and "no fit" not in md
    page = (out / "report.html").read_text()
    for ident in ('id="latency-chart"', 'id="context-slider"', 'id="slider-readout"'):
        assert page.count(ident) == 1, ident
    assert "<table>" in page and "cat 2.00, scaled_dot_product_attention 1.00" in page
    # self-contained: no external scripts, styles, images or fonts
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page
    data = embedded_data(page)
    assert data["contexts"] == [512, 1024, 2048, 4096, 8192]
    assert [s["cache"] for s in data["series"]] == ["dynamic", "static"]
    assert data["trained"] == [8192]
    assert 'max="4"' in page


def test_verdicts_are_statuses_and_each_reason_is_said_once(tmp_path):
    """One verdict table per run: a status per class and measure, the number of its reason beside it, and each reason
    once, as a numbered note under the table (Markdown list, HTML <ol>), however many cells share it."""
    run = make_run()
    out = render_dicts(tmp_path, run)
    md = (out / "report.md").read_text()
    section = md.split("### Verdicts", 1)[1].split("###", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert table[0] == ("| cache | counted verdict | timed verdict | intercept verdict | overhead verdict "
                        "| ledger verdict |")
    rows = {row.split("|")[1].strip(): [c.strip() for c in row.strip("|").split("|")[1:]] for row in table[2:]}
    assert rows["dynamic"][0] == rows["static"][0] == "no-baseline \\[1\\]", rows
    reasons = list(dict.fromkeys(v["reason"] for verdicts in run["kv"]["verdict"].values() for v in verdicts.values()
                                 if v["reason"]))
    numbered = [line.split(". ", 1) for line in section.splitlines() if line[:1].isdigit()]
    assert [n for n, _ in numbered] == [str(i) for i in range(1, len(reasons) + 1)]
    assert sorted(text for _, text in numbered) == sorted(tables.escape_markdown(r) for r in reasons)
    assert numbered[0][1].startswith("no baseline for")
    page = (out / "report.html").read_text()
    assert page.count('<ol class="notes">') == 1
    items = re.findall(r"<li>(.*?)</li>", page.split('<ol class="notes">', 1)[1].split("</ol>", 1)[0])
    assert sorted(items) == sorted(html.escape(r) for r in reasons)


def test_the_title_is_said_once(tmp_path):
    out = render_dicts(tmp_path, make_run())
    md = (out / "report.md").read_text()
    assert md.startswith("# KV-cache passes report\n") and md.count("KV-cache passes report") == 1
    body = (out / "report.html").read_text().split("<body>", 1)[1]
    assert body.count("<h1>") == 1 and body.count("KV-cache passes report") == 1
    assert "<h2>transformers 5.24.0 on cpu: test machine</h2>" in body and "<h3>Fit</h3>" in body


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
    run = Run(path="x.json", points=points_from_benchmarks(run_dict["benchmarks"]), record=KV.from_json(run_dict["kv"]))
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
    assert report_command.main([str(good), str(bad), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err


def test_an_ab_file_gets_its_pair_section_and_chart(tmp_path):
    """``kvcache ab --json`` output: both sides reported as runs, then the pair's section (each side's releases,
    drift and failure, escaped; the paired verdicts) appended to report.md, and ab.png."""
    side_a, side_b = make_run(), make_run(transformers="5.25.0", seed=1)
    verdict = {"status": "regression", "reason": "B is slower", "a": 3.0, "b": 3.6, "ratio": 1.2,
               "ratio_ci": [1.15, 1.25]}
    doc = {**side_b, "side_a": side_a, "ab": {"dynamic": {"timed": verdict}},
           "ab_run": {"tolerance": 0.1, "sides": {
               "a": {"transformers": "5.24.0", "torch": "2.13.0+cpu", "drift": 0.01, "failed": None},
               "b": {"transformers": "5.25.0", "torch": "2.13.0+cpu", "drift": None, "failed": "worker <b>died</b>"}}}}
    path = write_run(tmp_path / "ab.json", doc)
    assert report_command.main([str(path), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.count("## transformers") == 2 and "## A/B: B against A, paired" in md
    assert "- **A**: transformers 5.24.0, torch 2.13.0+cpu, drift +1.0%" in md
    assert f"- **B**: transformers 5.25.0, torch 2.13.0+cpu, drift {tables.MISSING}, failed: worker &lt;b&gt;died" in md
    assert "| dynamic | timed | 3.00 | 3.60 | ×1.200 \\[1.150, 1.250\\] | regression |" in md
    assert (tmp_path / "rep" / "ab.png").read_bytes().startswith(PNG_MAGIC)


def test_without_matplotlib_md_and_html_are_still_written(tmp_path, capsys, monkeypatch):
    path = write_run(tmp_path / "run.json", make_run())
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert report_command.main([str(path), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "matplotlib is not installed" in err
    assert (tmp_path / "rep" / "report.md").exists() and (tmp_path / "rep" / "report.html").exists()


def test_report_does_not_import_torch():
    code = "import sys, kvcache.analysing.report; sys.exit('torch' in sys.modules or 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2]).returncode == 0


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


def test_a_write_that_fails_leaves_the_report_folder_as_it_was(tmp_path, capsys, monkeypatch):
    """A full disk while the PNGs are drawn: the folder keeps the last whole report (no report.md of one run beside
    the PNGs of another, no 0-byte file), no temp folder is left, and the one-line error names --out (exit 2)."""
    import errno

    out = tmp_path / "rep"
    first = write_run(tmp_path / "first.json", make_run())
    assert report_command.main([str(first), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / "memory.png").write_bytes(b"an older run's chart")  # a file of the command's own, from an older run
    before["memory.png"] = (out / "memory.png").read_bytes()

    def full(runs, path):
        Path(path).write_bytes(b"\x89PNG")  # part of a file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(report, "plot_traffic", full)
    second = write_run(tmp_path / "second.json", make_run(transformers="5.25.0", seed=1))
    assert report_command.main([str(second), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"kvcache report: --out {out}: cannot write traffic.png (No space left on device)\n", err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.json", "rep", "second.json"]  # no temp folder

    monkeypatch.undo()
    assert report_command.main([str(second), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)  # the older run's memory.png is gone
    assert "5.25.0" in (out / "report.md").read_text()
