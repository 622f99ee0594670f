"""``kvcache compare`` on recorded runs made with tests/fakerun.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakerun import make_run, write_run

from kvcache.analysing.compare import IMPROVED, INCONCLUSIVE, REGRESSED, SAME, compare
from kvcache.analysing.records import load_run
from kvcache.cli import main


def recorded(tmp_path: Path, name: str, **kwargs) -> str:
    return str(write_run(tmp_path / name, make_run(**kwargs)))


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_planted_counted_regression_exits_1(tmp_path, capsys):
    base = recorded(tmp_path, "old.json", transformers="4.45.2")
    new = recorded(tmp_path, "new.json", transformers="5.24.0", counted={"dynamic": 5.0, "static": 1.0})
    assert main(["compare", base, new]) == 1
    out = capsys.readouterr().out
    assert "5.00 ▲ +2.00" in out
    (line,) = [x for x in out.splitlines() if x.startswith("regression:")]
    assert "dynamic" in line and "5.24.0" in line and "counted passes 5 is above the allowed 3.05" in line
    assert "grew: cat +2.00" in line  # the ops that grew, from the per-op breakdown


def test_identical_runs_exit_0(tmp_path, capsys):
    a = recorded(tmp_path, "a.json")
    b = recorded(tmp_path, "b.json")
    assert main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "No regressions" in out and "regression:" not in out
    assert "(a.json)" in out and "(b.json)" in out  # same release twice: labels tell the files apart
    assert out.splitlines()[0].endswith("(a.json).") and out.count("(a.json) (a.json)") == 0  # named once


def test_the_baseline_is_named_with_its_path_when_its_label_does_not_name_it(tmp_path, capsys):
    base = recorded(tmp_path, "old.json", transformers="4.45.2")
    assert main(["compare", base, recorded(tmp_path, "new.json")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"Baseline: transformers 4.45.2 on cpu: test machine ({base})."


def test_single_run_is_shown(tmp_path, capsys):
    assert main(["compare", recorded(tmp_path, "a.json")]) == 0
    out = capsys.readouterr().out
    assert "dynamic" in out and "static" in out and "nothing to compare" in out


def test_device_mismatch_refused_unless_allowed(tmp_path, capsys):
    a = recorded(tmp_path, "a.json", device_name="cpu: machine one")
    b = recorded(tmp_path, "b.json", device_name="cpu: machine two")
    assert main(["compare", a, b]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = one_line(captured.err)
    assert "device_name (a.json: cpu: machine one, b.json: cpu: machine two)" in line and "--allow-mismatch" in line
    assert main(["compare", a, b, "--allow-device-mismatch"]) == 0  # the old name stays as an alias
    out = capsys.readouterr().out
    assert "machine one" in out and "machine two" in out
    assert main(["compare", a, b, "--allow-mismatch"]) == 0


def test_corrupt_file_is_one_line_naming_it(tmp_path, capsys):
    good = recorded(tmp_path, "good.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"benchmarks": [')
    assert main(["compare", good, str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(bad) in one_line(captured.err)


def test_missing_file_is_one_line_naming_it(tmp_path, capsys):
    missing = tmp_path / "missing.json"
    assert main(["compare", str(missing)]) == 2
    assert str(missing) in one_line(capsys.readouterr().err)


def test_foreign_json_is_one_line(tmp_path, capsys):
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"machine_info": {}, "benchmarks": []}))
    assert main(["compare", str(foreign)]) == 2
    line = one_line(capsys.readouterr().err)
    assert str(foreign) in line and "kv" in line


def test_markdown_header_names_both_releases(tmp_path, capsys):
    a = recorded(tmp_path, "a.json", transformers="4.45.2")
    b = recorded(tmp_path, "b.json", transformers="5.24.0")
    assert main(["compare", a, b, "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| cache |"))
    assert "4.45.2" in lines[header] and "5.24.0" in lines[header]
    assert set(lines[header + 1].replace("|", "").split()) <= {":---", "---:"}
    assert any(line.startswith("| dynamic |") for line in lines)


def test_missing_class_shows_skip_reason(tmp_path, capsys):
    a = recorded(tmp_path, "a.json", caches={"dynamic": 3.0, "quantized": 2.0})
    run = make_run({"dynamic": 3.0})
    run["kv"]["skipped"] = [{"cache": "quantized", "context": None, "reason": "needs optimum-quanto"}]
    b = str(write_run(tmp_path / "b.json", run))
    assert main(["compare", a, b]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("quantized")]
    assert "skipped: needs optimum-quanto" in row


def test_counted_only_runs_show_no_timed_columns(tmp_path, capsys):
    runs = []
    for name in ("a.json", "b.json"):
        run = make_run()
        run["benchmarks"] = []
        run["kv"].pop("fit")
        runs.append(str(write_run(tmp_path / name, run)))
    assert main(["compare", *runs, "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "counted passes" in out and "timed passes" not in out


def test_timed_noise_is_not_a_regression(tmp_path):
    base = make_run()
    noisy = make_run()
    # Point 40% above the baseline but the interval reaches back below ×1.25: inconclusive.
    noisy["kv"]["fit"]["dynamic"].update(passes=4.2, passes_ci=[3.5, 4.9])
    # Interval entirely above ×1.25: a regression.
    noisy["kv"]["fit"]["static"].update(passes=1.6, passes_ci=[1.3, 1.9])
    runs = [load_run(write_run(tmp_path / n, r)) for n, r in (("a.json", base), ("b.json", noisy))]
    comparison = compare(runs, tolerance=0.25, counted_tolerance=0.05)
    dynamic, static = comparison.cells["dynamic"][1], comparison.cells["static"][1]
    assert dynamic.changes["timed"] == INCONCLUSIVE
    assert static.changes["timed"] == REGRESSED
    assert [(r.cache, r.measure) for r in comparison.regressions] == [("static", "timed passes")]
    assert "interval [1.3, 1.9]" in comparison.regressions[0].reason


def test_counted_tolerance_and_improvement(tmp_path):
    runs = [
        load_run(write_run(tmp_path / "a.json", make_run())),
        load_run(write_run(tmp_path / "b.json", make_run(counted={"dynamic": 3.04, "static": 0.5}))),
    ]
    comparison = compare(runs, counted_tolerance=0.05)
    assert comparison.cells["dynamic"][1].changes["counted"] == SAME
    assert comparison.cells["static"][1].changes["counted"] == IMPROVED
    assert comparison.regressions == []


def test_compare_runs_without_torch(tmp_path):
    import subprocess
    import sys

    run = recorded(tmp_path, "a.json")
    code = ("import sys; sys.modules['torch'] = None; from kvcache.cli import main; "
            f"sys.exit(main(['compare', {run!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "dynamic" in done.stdout


def test_model_or_dtype_mismatch_is_refused_naming_the_fields(tmp_path, capsys):
    a = make_run()
    b = make_run()
    b["kv"]["settings"].update(model="tiny", dtype="float32")
    paths = [str(write_run(tmp_path / n, r)) for n, r in (("a.json", a), ("b.json", b))]
    assert main(["compare", *paths]) == 2
    line = one_line(capsys.readouterr().err)
    assert "model (a.json: smollm2-135m, b.json: tiny)" in line and "dtype (a.json: bfloat16, b.json: float32)" in line
    assert main(["compare", *paths, "--allow-mismatch"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m, bfloat16" in out and "tiny, float32" in out  # column headers name model and dtype


def test_counted_only_runs_ignore_the_machine(tmp_path, capsys):
    """Counted passes key on the device type: two CPUs compare without --allow-mismatch."""
    runs = []
    for name, device in (("a.json", "cpu: machine one"), ("b.json", "cpu: machine two")):
        run = make_run(device_name=device)
        run["kv"]["fit"] = {}
        run["benchmarks"] = []
        runs.append(str(write_run(tmp_path / name, run)))
    assert main(["compare", *runs]) == 0


@pytest.mark.parametrize("option", ["--counted-tolerance", "--tolerance"])
@pytest.mark.parametrize("value", ["nan", "inf", "-0.1"])
def test_tolerances_must_be_finite_and_non_negative(tmp_path, capsys, option, value):
    a = recorded(tmp_path, "a.json")
    b = recorded(tmp_path, "b.json", counted={"dynamic": 9.0, "static": 1.0})
    assert main(["compare", a, b, f"{option}={value}"]) == 2
    line = one_line(capsys.readouterr().err)
    assert option in line and value in line


def test_poor_fit_and_drift_are_inconclusive(tmp_path):
    base = make_run()
    poor = make_run()
    poor["kv"]["fit"]["static"].update(passes=1.6, passes_ci=[1.3, 1.9], r2=0.3)
    drifted = make_run()
    drifted["kv"]["fit"]["static"].update(passes=1.6, passes_ci=[1.3, 1.9])
    drifted["kv"]["drift"].update(fraction=0.2, ok=False)
    runs = [load_run(write_run(tmp_path / n, r)) for n, r in (("a.json", base), ("b.json", poor), ("c.json", drifted))]
    comparison = compare(runs, tolerance=0.25)
    assert comparison.regressions == []
    poor_cell, drift_cell = comparison.cells["static"][1], comparison.cells["static"][2]
    assert poor_cell.changes["timed"] == drift_cell.changes["timed"] == INCONCLUSIVE
    assert "poor fit" in poor_cell.judged["timed"].reason
    assert "drift" in drift_cell.judged["timed"].reason


def test_gate_and_compare_give_identical_verdicts(tmp_path):
    """The same recorded runs judged by the session-end gate (first run recorded as the baseline file)
    and by compare (first run as the baseline) give the same verdict for every class and measure."""
    from kvcache.analysing import analysis
    from kvcache.analysing.judge import baseline

    base = make_run(counted={"dynamic": 3.0, "static": 1.0})
    others = [make_run(counted={"dynamic": 5.0, "static": 1.0}), make_run()]
    others[1]["kv"]["fit"]["static"].update(passes=1.6, passes_ci=[1.3, 1.9])
    others[1]["kv"]["fit"]["dynamic"].update(passes=3.5, passes_ci=[2.9, 4.1])
    path = tmp_path / "baseline.json"
    base_run = load_run(write_run(tmp_path / "base.json", base))
    baseline.record(path, base_run.record, "2026-11-29T00:00:00")
    doc = baseline.load(path)
    for i, other in enumerate(others):
        run = load_run(write_run(tmp_path / f"run{i}.json", other))
        comparison = compare([base_run, run], tolerance=0.10, counted_tolerance=0.05)
        at_gate = analysis.run_verdicts(run.record, doc, tolerance=0.10, counted_tolerance=0.05)
        for cache, measures in at_gate.items():
            judged = comparison.cells[cache][1].judged
            for measure, verdict in measures.items():
                assert judged[measure].status == verdict.status, (cache, measure)
                assert judged[measure].value == verdict.value
                assert judged[measure].allowed == verdict.allowed
    assert {c.judged["timed"].status for c in (comparison.cells["static"][1], comparison.cells["dynamic"][1])} \
        == {"regression", "inconclusive"}


def test_recorded_run_against_itself_and_a_planted_copy(tmp_path, capsys):
    """Real-analysis output of a recorded run: identical counts pass, a planted +2 copy is a regression naming
    the op that grew; timed figures of the same run judged against themselves never regress."""
    from fakerun import recorded_run

    base = str(write_run(tmp_path / "base.json", recorded_run(resamples=300)))
    same = str(write_run(tmp_path / "same.json", recorded_run(transformers="5.25.0", resamples=300)))
    planted = str(write_run(tmp_path / "planted.json", recorded_run(counted={"dynamic": 5.0}, resamples=300)))
    assert main(["compare", base, same]) == 0
    capsys.readouterr()
    assert main(["compare", base, planted]) == 1
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("regression:")]
    assert "dynamic" in line and "counted passes" in line and "grew: clone +2.00" in line


# --- compare judges each run by the rules its gate judged it with (issue 21, section 6) ---

OWN_RULES = {"tolerance": 0.3, "counted_tolerance": 0.5, "ops_tolerance": 2.0, "weight_passes_tolerance": 0.2,
             "ledger_tolerance": 1.0, "min_r2": 0.5, "max_drift": 0.3}


def with_ledger(run: dict, *, weights_ms: float, **ops: tuple[float, float, float]) -> dict:
    """``run`` with a profiled decode speed and a per-op ledger of ``dynamic`` ({op: (timed, lo, hi)}), every fit
    with an intercept interval (so that the intercept is judged)."""
    kv = run["kv"]
    kv["speed"] = {"weights_ms": weights_ms}
    kv["ledger"] = {"dynamic": {op: {"timed": v, "timed_ci": [lo, hi]} for op, (v, lo, hi) in ops.items()}}
    for fit in kv["fit"].values():
        fit["intercept_ci"] = [fit["intercept_ms"] - 1, fit["intercept_ms"] + 1]
    return run


def test_gate_and_compare_agree_on_runs_judged_with_their_own_rules(tmp_path, capsys):
    """A run judged with non-default rules for every measure (tolerance, counted, ops, weight passes, ledger, R²,
    drift): compare, given no option, gives the verdicts its gate gave. It took min_r2 from the run but every
    tolerance from its own defaults and had no ledger tolerance, so here it called four measures regressions."""
    from fakerun import planted

    from kvcache.analysing import analysis
    from kvcache.analysing.judge import baseline, gate

    base = with_ledger(make_run(), weights_ms=60.0, cat=(2.0, 1.9, 2.1), scaled_dot_product_attention=(1.0, 0.9, 1.1))
    run = with_ledger(make_run(), weights_ms=75.0, cat=(2.0, 1.9, 2.1), scaled_dot_product_attention=(1.0, 0.9, 1.1),
                      clone=(0.8, 0.7, 0.9))  # a new op, 0.9 within 0 + 1.0 passes, not within 0 + 0.5
    kv = run["kv"]
    kv["settings"].update(OWN_RULES)
    kv["fit"]["dynamic"].update(passes=3.6, passes_ci=[3.4, 3.8], r2=0.7, intercept_ms=35.0, intercept_ci=[34.0, 36.0])
    dynamic = planted(kv["traffic"]["dynamic"], 3.3)  # clone +0.3 counted passes
    dynamic.update(ops_per_step=1680 + 30, weight_passes=kv["traffic"]["dynamic"]["weight_passes"] + 0.1)
    kv["traffic"]["dynamic"] = dynamic
    path = tmp_path / "baseline.json"
    base_run = load_run(write_run(tmp_path / "base.json", base))
    baseline.record(path, base_run.record, "2026-11-29T00:00:00")
    judged_run = load_run(write_run(tmp_path / "run.json", run))
    at_gate = analysis.run_verdicts(judged_run.record, baseline.load(path))
    assert {m: v.status for m, v in at_gate["dynamic"].items()} == dict.fromkeys(at_gate["dynamic"], "pass")
    defaults = {name: getattr(gate.Rules(), name) for name in OWN_RULES}
    by_default = analysis.run_verdicts(judged_run.record, baseline.load(path), **defaults)  # what compare judged by
    assert {m for m, v in by_default["dynamic"].items() if v.status != "pass"} == set(at_gate["dynamic"])
    comparison = compare([base_run, judged_run])
    for cache, measures in at_gate.items():
        judged = comparison.cells[cache][1].judged
        for measure, verdict in measures.items():
            assert judged[measure].status == verdict.status, (cache, measure, judged[measure].reason)
            assert judged[measure].allowed == verdict.allowed, (cache, measure)
    assert comparison.regressions == []
    assert main(["compare", str(tmp_path / "base.json"), str(tmp_path / "run.json")]) == 0
    out = capsys.readouterr().out
    assert "each run's own (as its gate judged it): timed ×1.30" in out and "+1 passes per op" in out
    assert main(["compare", str(tmp_path / "base.json"), str(tmp_path / "run.json"), "--ledger-tolerance", "0.5",
                 "--counted-tolerance", "0.05"]) == 1  # told otherwise: an option replaces the run's rule
    out = capsys.readouterr().out
    assert "with --counted-tolerance, --ledger-tolerance as given" in out
    regressions = [line for line in out.splitlines() if line.startswith("regression:")]
    assert len(regressions) == 2 and "): counted passes: " in regressions[0] and "): per-op ledger: " in regressions[1]


def test_rules_first_judges_a_later_run_by_the_first_runs_rules(tmp_path, capsys):
    """A pull request's head that raises its own counted tolerance must not pass its own regression: with
    ``--rules first`` (what the PR gate runs) the head is judged by the base's recorded rules."""
    base = recorded(tmp_path, "base.json")
    run = make_run(counted={"dynamic": 5.0, "static": 1.0})
    run["kv"]["settings"]["counted_tolerance"] = 5.0  # the head loosens its own gate
    head = str(write_run(tmp_path / "head.json", run))
    assert main(["compare", base, head]) == 0  # judged by its own rules, as its gate judged it
    capsys.readouterr()
    assert main(["compare", base, head, "--rules", "first"]) == 1
    out = capsys.readouterr().out
    assert "the first run's (as its gate judged it)" in out and "counted passes 5 is above the allowed 3.05" in out
    assert main(["compare", base, head, "--rules", "last"]) == 2
    assert "invalid choice: 'last'" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(("setting", "value"), [("min_r2", float("nan")), ("min_r2", 1.5), ("tolerance", -0.1),
                                                ("max_drift", float("inf"))])
def test_a_run_whose_own_rules_cannot_judge_is_one_line(tmp_path, capsys, setting, value):
    """settings.min_r2 NaN in a run let an R² of 0.01 through (NaN compares false); compare then raised."""
    a = recorded(tmp_path, "a.json")
    run = make_run()
    run["kv"]["settings"][setting] = value
    run["kv"]["fit"]["dynamic"]["r2"] = 0.01
    b = str(write_run(tmp_path / "b.json", run))
    assert main(["compare", a, b]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("kvcache compare: ") and b in line and f"{setting} {value}" in line


@pytest.mark.parametrize("option", ["--ledger-tolerance", "--min-r2"])
def test_new_rule_options_are_checked(tmp_path, capsys, option):
    a = recorded(tmp_path, "a.json")
    assert main(["compare", a, a, option, "nan"]) == 2
    line = one_line(capsys.readouterr().err)
    assert option in line and "nan" in line


def test_a_negative_intercept_in_the_first_run_is_no_baseline_for_the_intercept(tmp_path, capsys):
    """The first run's fit had intercept -0.697 ms (R² 0.95): compare called a clean run a regression against
    an allowed -0.767. Now the first run's intercept is no baseline; its passes still are."""
    first = make_run()
    first["kv"]["fit"]["dynamic"].update(intercept_ms=-0.697, intercept_ci=[-0.9, -0.5], r2=0.95)
    clean = make_run(intercept_ms=0.5)
    clean["kv"]["fit"]["dynamic"].update(intercept_ci=[0.4, 0.6])
    runs = [str(write_run(tmp_path / n, r)) for n, r in (("first.json", first), ("clean.json", clean))]
    assert main(["compare", *runs]) == 0
    comparison = compare([load_run(p) for p in runs])
    judged = comparison.cells["dynamic"][1].judged
    assert judged["intercept"].status == "no-baseline" and judged["timed"].status == "pass"


def test_environment_variables_are_shown_where_runs_differ(tmp_path, capsys):
    """kv.environment.variables ({NAME: value}, the variables known to change what runs): a line names each that
    differs, with every run's value; none when they agree."""
    runs = []
    for name, variables in (("a.json", {}), ("b.json", {"TRANSFORMERS_SDPA_FORCE_GQA": "1"}),
                            ("c.json", {"TRANSFORMERS_SDPA_FORCE_GQA": "1"})):
        run = make_run()
        run["kv"]["environment"]["variables"] = variables
        runs.append(str(write_run(tmp_path / name, run)))
    assert main(["compare", *runs, "--allow-mismatch"]) == 0
    out = capsys.readouterr().out
    assert "Environment variable TRANSFORMERS_SDPA_FORCE_GQA differs (a.json: unset, b.json: 1, c.json: 1)." in out
    assert main(["compare", *runs, "--allow-mismatch", "--markdown"]) == 0
    markdown = capsys.readouterr().out
    assert "TRANSFORMERS" in markdown and "FORCE" in markdown and "(a.json: unset, b.json: 1, c.json: 1)" in markdown
    assert main(["compare", runs[1], runs[2]]) == 0
    assert "Environment variable" not in capsys.readouterr().out


def test_an_environment_variable_is_part_of_the_identity_and_the_unset_side_says_unset(tmp_path, capsys):
    """By default compare refuses runs that differ in an identity variable (exit 2), naming the side without it
    ``unset``, not an empty string; the line that names the variable comes with --allow-mismatch."""
    runs = []
    for name, variables in (("a.json", {}), ("b.json", {"TRANSFORMERS_SDPA_FORCE_GQA": "1"})):
        run = make_run()
        run["kv"]["environment"]["variables"] = variables
        runs.append(str(write_run(tmp_path / name, run)))
    assert main(["compare", *runs]) == 2
    line = one_line(capsys.readouterr().err)
    assert "differ in env (a.json: unset, b.json: TRANSFORMERS_SDPA_FORCE_GQA=1)" in line, line


def test_the_first_run_is_a_baseline_by_its_own_min_r2_as_when_it_is_recorded(tmp_path):
    """The first run (R² 0.8, its own min_r2 0.9) could not be recorded as a timed baseline; a later run judged with
    min_r2 0.5 does not make it one, at the gate or in compare; --min-r2 given makes it one for both."""
    from kvcache.analysing import analysis
    from kvcache.analysing.judge import baseline

    first = make_run()
    first["kv"]["fit"]["dynamic"]["r2"] = 0.8
    later = make_run()
    later["kv"]["settings"]["min_r2"] = 0.5
    runs = [load_run(write_run(tmp_path / n, r)) for n, r in (("first.json", first), ("later.json", later))]
    path = tmp_path / "b.json"
    baseline.record(path, runs[0].record, "now")
    at_gate = analysis.run_verdicts(runs[1].record, baseline.load(path))
    judged = compare(runs).cells["dynamic"][1].judged
    assert at_gate["dynamic"]["timed"].status == judged["timed"].status == "no-baseline"
    assert "R² 0.8 < 0.9" in judged["timed"].reason
    assert compare(runs, min_r2=0.5).cells["dynamic"][1].judged["timed"].status == "pass"


def test_the_rule_options_are_the_option_tables_rules():
    """One home: compare's rule options are the table's rules (Option.rule), in its order, named without ``kv-``,
    with the table's help (its default replaced by each run's own setting)."""
    from kvcache.analysing import arguments
    from kvcache.analysing.options import OPTIONS, RULE_DEFAULTS
    from kvcache.commands.compare import parser

    rules = [o for o in OPTIONS if o.rule]
    actions = [a for a in parser()._actions if a.dest in RULE_DEFAULTS]
    assert [a.option_strings for a in actions] == [[o.compare_flag] for o in rules]
    for action, option in zip(actions, rules):
        assert (action.dest, action.default, action.type) == (option.setting, None, float)
        assert action.help == arguments.rule_help(option)
        assert option.help.split(" (default")[0] in action.help
        assert f"(default: each run's own {option.flag} setting, as its gate judged it)" in action.help


def test_max_drift_is_a_compare_option(tmp_path):
    """--max-drift came with the table: given, it replaces each run's own max_drift."""
    runs = [load_run(write_run(tmp_path / n, make_run())) for n in ("a.json", "b.json")]
    assert compare(runs, max_drift=0.3).rules[0].max_drift == 0.3
    assert compare(runs).rules[0].max_drift == (runs[1].record.settings.max_drift or 0.10)
    with pytest.raises(TypeError, match="not_a_rule"):
        compare(runs, not_a_rule=1.0)
