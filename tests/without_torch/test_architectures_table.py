"""docs/architectures.md's table (kvcache/analysing/architectures_table.py): figures from a run's JSON, bold above a
plain step's passes, a skip's reason in one line, escaped cells, the measured share, and the page's hand-written part
kept around the generated one."""

from __future__ import annotations

from kvcache.analysing import architectures_table as at


def run(passes: dict[str, float], by_op: dict[str, dict[str, float]], skipped=()) -> dict:
    traffic = {cache: {"passes": value, "by_op": by_op[cache]} for cache, value in passes.items()}
    return {"kv": {"model": {"attention": "eager", "changes": ["layers 24->2"], "bytes_per_token": 1024},
                   "traffic": traffic, "memory": {"dynamic": {"allocated_passes": 3.0}},
                   "skipped": [{"cache": c, "reason": r} for c, r in skipped]}}


def test_figures_ops_and_extra_passes():
    result = at.result_from_run("jetmoe", run({"dynamic": 7.0, "static": 5.0},
                                              {"dynamic": {"repeat": 3.0, "cat": 2.0, "sdpa": 2.0},
                                               "static": {"repeat": 3.0, "sdpa": 2.0}}))
    assert result.measured and result.attention == "eager" and result.memory == {"dynamic": 3.0}
    row = at.table([result]).splitlines()[-1]
    assert "**7.00** (repeat 3.00, cat 2.00, sdpa 2.00)" in row and "**5.00**" in row
    assert [(kind, cache) for kind, cache, _, _ in at.above([result])] == [("jetmoe", "dynamic"), ("jetmoe", "static")]
    findings = at.findings_table([result], {"jetmoe": 2**30}, 32768)
    assert "| 4.00 |" in findings and "4.00 GiB" in findings


def test_a_plain_step_is_not_bold_and_a_skip_says_why():
    plain = at.result_from_run("llama", run({"dynamic": 3.0}, {"dynamic": {"cat": 2.0, "sdpa": 1.0}},
                                            skipped=[("static", "needs | a pipe <b>")]))
    row = at.table([plain]).splitlines()[-1]
    assert "| 3.00 (cat 2.00, sdpa 1.00) |" in row and "needs \\| a pipe &lt;b&gt;" in row
    nothing = at.result_from_run("bamba", {"kv": {"skipped": [{"cache": "dynamic", "reason": "no K/V\nat all"}]}})
    assert not nothing.measured and nothing.reason == "no K/V at all"


def test_share_counts_decoder_only_types_and_the_page_keeps_its_text(tmp_path):
    results = [at.ArchResult("llama", figures={"dynamic": (3.0, {})}), at.ArchResult("x", reason="failed"),
               at.ArchResult("bert", reason="refused: an encoder", refused=True)]
    assert at.share_line(results).startswith("1 of 2 decoder-only causal-LM types measured (50%); 1 more")
    page = tmp_path / "architectures.md"
    page.write_text(f"# Title\n\nhand text\n\n{at.BEGIN}\nold\n{at.END}\n\nafter\n", encoding="utf-8")
    at.write_doc(page, results, release="5.25.0", caches="dynamic,static", wall_s=60.0)
    text = page.read_text(encoding="utf-8")
    assert "hand text" in text and text.endswith("after\n") and "old" not in text and "`bert`" in text
    assert "wall time 1.0 min" in text
