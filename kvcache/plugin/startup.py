"""Start-up: the session's state made (with the record gatherer registered) and everything checked before anything
runs: the device, the files the run reads and writes, the copy tensor, the model's config, the baseline, timed
points under xdist. Every problem is a one-line ``pytest.UsageError`` (exit 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcache.analysing.settings import Settings, SettingsError
from kvcache.plugin.options import settings_from
from kvcache.plugin.signals import Stopper
from kvcache.plugin.state import PROBLEM, STATE, KVState
from kvcache.plugin.transport import RecordGatherer

#: pytest options naming a file a run writes, besides the baseline: (option, dest).
OUTPUT_OPTIONS = (("--benchmark-json", "benchmark_json"), ("--junitxml", "xmlpath"), ("--report-log", "report_log"))


def new_state(config: pytest.Config, settings: Settings) -> KVState:
    """The session's state, stashed; outside xdist workers the records of every report are gathered into it."""
    state = KVState(settings, worker=hasattr(config, "workerinput"))
    config.stash[STATE] = state
    if not state.worker:
        config.pluginmanager.register(RecordGatherer(state), "kvcache-records")
    return state


def state_for_suite(config: pytest.Config) -> KVState | None:
    """The state, made on first need when the suite turns up though the arguments did not show it (its
    checks then run once its items are collected); None when an option is bad (that problem is raised as a
    usage error once collection ends)."""
    if STATE in config.stash:
        return config.stash[STATE]
    if PROBLEM in config.stash:
        return None
    try:
        return new_state(config, settings_from(config))
    except SettingsError as exc:
        config.stash[PROBLEM] = str(exc)
        return None


def check_before_running(config: pytest.Config, state: KVState) -> None:
    """What would otherwise fail part-way or after the sweep: the device, the paths the run writes, the copy
    tensor against free memory, the model's config, the baseline (a path given must exist:
    :func:`baseline_problem`), timed points under xdist. A problem is a one-line ``pytest.UsageError``. Then SIGINT
    and SIGTERM are handled by a :class:`Stopper`."""
    from kvcache.analysing.judge import baseline as baselines
    from kvcache.analysing.presets import ModelError
    from kvcache.measuring import preflight
    from kvcache.measuring.configs import load_config
    from kvcache.measuring.devices import DeviceError, resolve_device

    settings = state.settings
    try:
        resolve_device(settings.device)
        check_files(config, settings)  # no two outputs on one file; each output really writable
        preflight.check(config, settings)  # paths the run writes, copy tensor against free memory
        load_config(settings.model)
        problem = baseline_problem(config, settings)
        if problem:
            raise SettingsError(problem)
        state.baseline = baselines.load(settings.baseline)
        problem = xdist_problem(config)
        if problem:
            raise SettingsError(problem)
    except (SettingsError, DeviceError, ModelError, baselines.BaselineError) as exc:
        raise pytest.UsageError(str(exc)) from None
    state.checked = True
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:transformers.*")
    if not state.worker and state.stopper is None:
        state.stopper = Stopper(state)
        config.pluginmanager.register(state.stopper, "kvcache-signals")
        config.add_cleanup(state.stopper.restore)  # whatever happens, the previous handlers come back
        state.stopper.install()


def run_files(config: pytest.Config, settings: Settings) -> list[tuple[str, Path, bool]]:
    """``(option, path, written)`` of every file the run reads or writes: the baseline (written with
    ``--kv-update-baseline``, read always) and the output files of :data:`OUTPUT_OPTIONS` that are given."""
    from kvcache.analysing.judge.baseline import NO_BASELINE

    out = [] if settings.baseline == NO_BASELINE else [
        ("--kv-baseline", Path(settings.baseline), bool(settings.update_baseline))]
    for option, dest in OUTPUT_OPTIONS:
        value = config.getoption(dest, None)
        if value:
            out.append((option, Path(config.invocation_params.dir, value), True))
    return out


def baseline_problem(config: pytest.Config, settings: Settings) -> str | None:
    """A ``--kv-baseline`` given (not the default) that names no file, unless ``--kv-update-baseline`` creates it: a
    mistyped path judged every class "no-baseline" and exited 0. ``none`` is no baseline, and then there is nothing
    for ``--kv-update-baseline`` to write to. The default file may be absent (a first run: the summary says how to
    record one)."""
    from kvcache.analysing.judge.baseline import NO_BASELINE
    from kvcache.plugin.options import given_options

    if settings.baseline == NO_BASELINE:
        if settings.update_baseline:
            return (f"--kv-update-baseline with --kv-baseline {NO_BASELINE}: no file to write the baseline to; give "
                    "the baseline file's path")
        return None
    path = Path(settings.baseline)
    if settings.update_baseline or "--kv-baseline" not in given_options(config) or path.exists() or path.is_symlink():
        return None
    given = config.getoption("kv_baseline")
    shown = given if str(given) == str(path) else f"{given} ({path})"
    return (f"--kv-baseline {shown}: no such file; give an existing baseline file, --kv-update-baseline to create "
            f"it, or --kv-baseline {NO_BASELINE} to run without one")


def check_files(config: pytest.Config, settings: Settings) -> None:
    """Before anything runs: no file the run writes is also another file it writes or the baseline it reads
    (compared after symlinks, and by inode: hard links), and every file it writes can be written, found by a
    real probe (:func:`kvcache.analysing.files.write_problem`: an immutable or append-only file is caught here,
    root or not). A problem is a one-line SettingsError naming the options and files."""
    from kvcache.analysing import files

    problem = files.outputs_problem(run_files(config, settings))
    if problem:
        raise SettingsError(problem)


def xdist_problem(config: pytest.Config) -> str | None:
    """Timed points under pytest-xdist are refused: workers timing on the same cores measure each other.
    A counted-only run (``-m`` deselecting timed items) works: every worker's records reach one analysis."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") == "no" or not config.getoption("tx", None):
        return None
    markexpr = config.getoption("markexpr", "") or ""
    if markexpr:
        from _pytest.mark.expression import Expression

        try:
            if not Expression.compile(markexpr).evaluate(lambda name, **_: name == "timed"):
                return None
        except Exception:  # noqa: BLE001 - pytest reports a bad -m itself
            return None
    workers = config.getoption("numprocesses", None) or len(config.getoption("tx"))
    return (f"-n {workers}: timed points cannot run under pytest-xdist (workers timing on the same cores measure "
            "each other); run them without -n, or select the counted suite alone with -m counted")
