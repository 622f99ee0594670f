"""The pytest plugin, installed as the ``pytest11`` entry point ``kvcache.plugin``: ``--kv-*`` options,
parametrization and order of the benchmarks, fixtures, and the session-end analysis, report and gate.

Installed, it loads in every pytest run of the environment, so it costs nothing and checks nothing unless the
run is the suite's (:func:`pytest_configure`): options and markers are declared, nothing else is imported.
With a ``--kv-*`` option given, the options are checked at start-up; when the run's arguments reach the
suite (``pytest benchmarks`` here, ``pytest --pyargs kvcache.benchmarks`` anywhere), so are the device, the
paths the run writes, the copy tensor, the model's config and the baseline. Every bad input is a one-line
usage error (exit 4) before anything runs.

Order of a session: counted traffic of every class (deterministic), then the copy bandwidth, then
``--kv-rounds`` rounds of timed points (interleaved across classes and contexts, the copy bandwidth
measured again at each round's start), the copy bandwidth at the end, and last the first timed point
measured again for the drift check.

Each item's measurements travel as records in its report (``user_properties``), so the session-end
analysis sees every item, from xdist workers too, whatever pytest-benchmark keeps or saves.

Files and signals: no two outputs (nor an output and the baseline) may be one file, and every output is probed
before the run (:func:`check_files`); outputs are written atomically, through symlinks. SIGTERM stops a run as
Ctrl-C does, and a second signal cannot spoil the files or the interrupted mark (:class:`Stopper`).
"""

from __future__ import annotations

import datetime
import fnmatch
import importlib.util
import json
import os
import random
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from kvcache.settings import (
    COMPILE_MODES,
    DRIVERS,
    FILLS,
    ORDERS,
    Settings,
    SettingsError,
    check_choice,
    number,
    parse_ints,
    parse_threads,
)

STATE = pytest.StashKey["KVState"]()
SUITE_DIRS = pytest.StashKey["tuple[Path, ...]"]()
PROBLEM = pytest.StashKey[str]()  # a bad option found when the suite turned up during collection
RECORD = "kv_record"  # the user_properties name of a measurement record
SUITE_PACKAGE = "kvcache.benchmarks"  # the suite, shipped in the package (benchmarks/ in a checkout)
MARKERS = ("timed: a timed decode point of the kvcache-passes suite (pytest-benchmark)",
           "counted: counted traffic of one decode step, kvcache-passes suite (deterministic)")

# option -> (default, help); flags (store_true) have no default. The README's Options table lists every one.
OPTIONS: dict[str, tuple[Any, str]] = {
    "--kv-model": ("smollm2-135m", "smollm2-135m (default), smollm2-135m-mha, tiny, a local directory with "
                                   "config.json, or a hub id"),
    "--kv-device": ("auto", "auto (cuda, then mps, then cpu), cpu, cuda or mps"),
    "--kv-dtype": ("bfloat16", "bfloat16 (default), float16 or float32"),
    "--kv-caches": ("dynamic,static", "cache classes, comma-separated, or 'all'"),
    "--kv-contexts": ("1024,2048,4096,8192,16384", "context lengths in tokens"),
    "--kv-counted-contexts": ("256,512", "the two contexts counted traffic is taken at"),
    "--kv-fill": ("synthetic", "synthetic (random K/V written into every layer) or prefill"),
    "--kv-warmup": (3, "untimed decode steps before the timed ones (default 3)"),
    "--kv-steps": (12, "timed decode steps per point (default 12)"),
    "--kv-rounds": (3, "rounds over all points (default 3)"),
    "--kv-order": ("interleaved", "interleaved (default: seeded order per round) or ascending"),
    "--kv-seed": (0, "seed for weights, fills and the interleaved order (default 0)"),
    "--kv-copy-mib": (1024, "size of the copy-bandwidth tensor in MiB (default 1024)"),
    "--kv-max-drift": (0.10, "largest change of the re-measured first point before timed verdicts are "
                             "inconclusive (the build fails on it only with --kv-strict)"),
    "--kv-baseline": ("kv-baseline.json", "baseline file of passes per device (default kv-baseline.json in the "
                                          "root directory)"),
    "--kv-tolerance": (0.10, "allowed relative rise of timed passes (default 0.10)"),
    "--kv-counted-tolerance": (0.05, "allowed rise of counted passes (default 0.05)"),
    "--kv-memory-tolerance": (0.05, "allowed rise of counted memory: allocated, peak and held passes each (default "
                                    "0.05)"),
    "--kv-ops-tolerance": (0.5, "allowed rise of ATen ops per step, per layer (default 0.5: +1 op in every "
                                "layer fails)"),
    "--kv-weight-passes-tolerance": (0.05, "allowed rise of weight passes per step (default 0.05)"),
    "--kv-ledger-tolerance": (0.5, "timed passes an op of the ledger may rise by besides --kv-tolerance "
                                   "(default 0.5; a new op is judged against it)"),
    "--kv-max-passes": ("", "absolute bounds, e.g. dynamic=3.5,static=7"),
    "--kv-min-r2": (0.90, "fits below this R² are inconclusive (default 0.90)"),
    "--kv-remeasure": (0, "after the rounds, measure the N noisiest points once more (default 0)"),
    "--kv-remeasure-seconds": (120, "time bound of those re-measurements (default 120 s)"),
    "--kv-threads": ("1", "torch CPU threads for the whole session, copy bandwidth included: a number (default 1) "
                          "or auto (torch's default); part of the timed run identity"),
    "--kv-ledger-steps": (8, "profiled steps per (class, context) for the per-op timed ledger, after the timed "
                             "rounds (default 8; 0: no ledger)"),
    "--kv-compile": ("off", "off (default), default, reduce-overhead or max-autotune: the decode forward under "
                            "torch.compile in that mode"),
    "--kv-driver": ("loop", "loop (default: the suite's own decode loop) or generate (the decode steps of a real "
                            "model.generate() call); part of the run identity"),
    "--kv-batch": (1, "sequences per decode step (default 1); passes are per KV byte the whole batch holds"),
    "--kv-attn": ("sdpa", "attention implementations, comma-separated, crossed with the cache classes (default sdpa, "
                          "the release default: records keyed by class name; others keyed <cache>@<attention>)"),
}
FLAGS: dict[str, str] = {
    "--kv-update-baseline": "write this run's passes into the baseline file",
    "--kv-no-gate": "report everything without failing the build",
    "--kv-strict": "inconclusive timed verdicts (drift beyond --kv-max-drift included) fail the build too",
    "--kv-ragged": "with --kv-batch N: sequence lengths spread evenly over the context (left padding); passes "
                   "per live KV byte (gated) and per allocated byte",
}


def _dest(option: str) -> str:
    return option[2:].replace("-", "_")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcache-passes", "KV-cache passes per decode step")
    for option, (default, help_) in OPTIONS.items():
        group.addoption(option, default=default, help=help_)
    for option, help_ in FLAGS.items():
        group.addoption(option, action="store_true", help=help_)


def given_options(config: pytest.Config) -> list[str]:
    """The ``--kv-*`` options set to something other than their default (command line, addopts or
    PYTEST_ADDOPTS)."""
    changed = [o for o, (default, _) in OPTIONS.items() if str(config.getoption(_dest(o))) != str(default)]
    return changed + [o for o in FLAGS if config.getoption(_dest(o))]


def settings_from(config: pytest.Config) -> Settings:
    """Validated settings; any bad value is a one-line SettingsError. Imports no torch: the registry and the
    model presets are plain Python until something is built."""
    from kvcache.analysing import gate
    from kvcache.measuring import caches, models

    opt = config.getoption
    try:
        caches_ = tuple(caches.parse_caches(opt("kv_caches")))
    except caches.CacheError as exc:
        raise SettingsError(str(exc)) from None
    caches_ = _crossed_with_attention(caches_, str(opt("kv_attn")))
    try:
        max_passes = gate.parse_max_passes(opt("kv_max_passes"))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    for name in max_passes:
        if name not in caches.registry() and name not in caches_:
            raise SettingsError(f"--kv-max-passes: unknown cache class {name!r}; known: "
                                f"{', '.join(caches.registry())}")
    counted = parse_ints("--kv-counted-contexts", opt("kv_counted_contexts"))
    if len(counted) != 2:
        raise SettingsError(f"--kv-counted-contexts {opt('kv_counted_contexts')!r}: give two different contexts")
    check_choice("--kv-dtype", opt("kv_dtype"), models.DTYPES)  # the same words as models.torch_dtype, no torch
    settings = Settings(
        model=opt("kv_model"), device=opt("kv_device"), dtype=opt("kv_dtype"), caches=caches_,
        contexts=parse_ints("--kv-contexts", opt("kv_contexts")), counted_contexts=tuple(sorted(counted)),
        fill=check_choice("--kv-fill", opt("kv_fill"), FILLS),
        warmup=int(number("--kv-warmup", opt("kv_warmup"), low=0, whole=True)),
        steps=int(number("--kv-steps", opt("kv_steps"), low=3, whole=True)),
        rounds=int(number("--kv-rounds", opt("kv_rounds"), low=1, whole=True)),
        order=check_choice("--kv-order", opt("kv_order"), ORDERS),
        seed=int(number("--kv-seed", opt("kv_seed"), low=0, whole=True)),
        copy_bytes=int(number("--kv-copy-mib", opt("kv_copy_mib"), low=1, whole=True)) << 20,
        max_drift=number("--kv-max-drift", opt("kv_max_drift"), low=0),
        baseline=str(Path(config.rootpath, opt("kv_baseline"))), update_baseline=opt("kv_update_baseline"),
        tolerance=number("--kv-tolerance", opt("kv_tolerance"), low=0),
        counted_tolerance=number("--kv-counted-tolerance", opt("kv_counted_tolerance"), low=0),
        memory_tolerance=number("--kv-memory-tolerance", opt("kv_memory_tolerance"), low=0),
        ops_tolerance=number("--kv-ops-tolerance", opt("kv_ops_tolerance"), low=0),
        weight_passes_tolerance=number("--kv-weight-passes-tolerance", opt("kv_weight_passes_tolerance"), low=0),
        ledger_tolerance=number("--kv-ledger-tolerance", opt("kv_ledger_tolerance"), low=0),
        max_passes=max_passes, min_r2=number("--kv-min-r2", opt("kv_min_r2"), low=0, high=1),
        gate=not opt("kv_no_gate"), strict=bool(opt("kv_strict")),
        remeasure=int(number("--kv-remeasure", opt("kv_remeasure"), low=0, whole=True)),
        remeasure_seconds=number("--kv-remeasure-seconds", opt("kv_remeasure_seconds"), low=0),
        ledger_steps=int(number("--kv-ledger-steps", opt("kv_ledger_steps"), low=0, whole=True)),
        threads=parse_threads(opt("kv_threads")),
        compile=check_choice("--kv-compile", opt("kv_compile"), COMPILE_MODES),
        driver=check_choice("--kv-driver", opt("kv_driver"), DRIVERS),
        batch=int(number("--kv-batch", opt("kv_batch"), low=1, whole=True)),
        ragged=bool(opt("kv_ragged")),
    )
    if settings.ragged and settings.batch == 1:
        raise SettingsError("--kv-ragged needs --kv-batch of at least 2 (one sequence has nothing to pad)")
    if settings.driver == "generate" and settings.compile != "off":
        raise SettingsError(f"--kv-driver generate with --kv-compile {settings.compile}: not supported (accepted: "
                            "--kv-compile off with the generate driver, or --kv-driver loop)")
    return settings


def _crossed_with_attention(caches_: tuple[str, ...], text: str) -> tuple[str, ...]:
    """``--kv-attn``: the classes crossed with the implementations (:mod:`kvcache.measuring.attention`). The default
    (``sdpa`` alone) keeps the classes as they are and imports nothing; any other value imports Transformers to check
    each name against the release (one-line SettingsError)."""
    if text.strip() == "sdpa":
        return caches_
    from kvcache.measuring import attention

    try:
        return tuple(attention.cross(caches_, attention.parse(text)))
    except attention.AttentionError as exc:
        raise SettingsError(str(exc)) from None


class KVState:
    """Per-session state: settings, the measuring session (built on first use), the analysis."""

    def __init__(self, settings: Settings, worker: bool = False) -> None:
        self.settings = settings
        self.baseline: dict[str, Any] = {}  # loaded by check_before_running
        self.checked = False  # check_before_running passed: the suite runs in this session
        self.worker = worker  # an xdist worker: measures and reports records, never analyses
        self._session: Any = None
        self.records: list[dict[str, Any]] = []
        self.failed: list[str] = []
        self.exit: dict[str, Any] = {"interrupted": False, "exit": "running"}
        self.kv: dict[str, Any] | None = None
        self.failures: list[str] = []
        self.notes: list[str] = []
        self.stopper: Stopper | None = None  # installed by check_before_running (not on xdist workers)
        self.unwritten: list[str] = []  # outputs that could not be written at the end (each a one-line reason)

    @property
    def session(self) -> Any:
        if self._session is None:
            from kvcache.measuring.devices import Device
            from kvcache.measuring.session import KVSession

            self._session = KVSession(self.settings, Device.from_choice(self.settings.device))
        return self._session

    @property
    def used(self) -> bool:
        """Whether any item of the suite reported a record (here or on an xdist worker)."""
        return not self.worker and bool(self.records)

    def analyse(self) -> dict[str, Any]:
        from kvcache.analysing import analysis

        if self.kv is None:
            session = {**self.exit, "failed": sorted(set(self.failed))}
            self.kv = analysis.analyse(self.records, self.settings.to_dict(), self.baseline, session)
        return self.kv


def pytest_configure(config: pytest.Config) -> None:
    """Declare the suite's markers; then nothing more unless a ``--kv-*`` option is given (its values are
    checked) or the arguments reach the suite (then everything the run needs is checked too)."""
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if config.getoption("help", False):
        return
    suite = collects_suite(config)
    if not suite and not given_options(config):
        return  # not the suite's run: nothing imported, nothing checked
    try:
        state = _new_state(config, settings_from(config))
    except SettingsError as exc:
        raise pytest.UsageError(str(exc)) from None
    if suite:
        check_before_running(config, state)


def _new_state(config: pytest.Config, settings: Settings) -> KVState:
    state = KVState(settings, worker=hasattr(config, "workerinput"))
    config.stash[STATE] = state
    if not state.worker:
        config.pluginmanager.register(RecordGatherer(state), "kvcache-records")
    return state


def check_before_running(config: pytest.Config, state: KVState) -> None:
    """What would otherwise fail part-way or after the sweep: the device, the paths the run writes, the copy
    tensor against free memory, the model's config, the baseline, timed points under xdist. A problem is a
    one-line ``pytest.UsageError``."""
    from kvcache.analysing import baseline as baselines
    from kvcache.measuring import preflight
    from kvcache.measuring.devices import DeviceError, resolve
    from kvcache.measuring.models import ModelError, load_config

    settings = state.settings
    try:
        resolve(settings.device)
        check_files(config, settings)  # no two outputs on one file; each output really writable
        preflight.check(config, settings)  # paths the run writes, copy tensor against free memory
        load_config(settings.model)
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


# --- files the run reads and writes --------------------------------------------------------------------

#: pytest options naming a file a run writes, besides the baseline: (option, dest).
OUTPUT_OPTIONS = (("--benchmark-json", "benchmark_json"), ("--junitxml", "xmlpath"), ("--report-log", "report_log"))


def run_files(config: pytest.Config, settings: Settings) -> list[tuple[str, Path, bool]]:
    """``(option, path, written)`` of every file the run reads or writes: the baseline (written with
    ``--kv-update-baseline``, read always) and the output files of :data:`OUTPUT_OPTIONS` that are given."""
    out = [("--kv-baseline", Path(settings.baseline), bool(settings.update_baseline))]
    for option, dest in OUTPUT_OPTIONS:
        value = config.getoption(dest, None)
        if value:
            out.append((option, Path(config.invocation_params.dir, value), True))
    return out


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


# --- where the suite is -------------------------------------------------------------------------------

def suite_dirs(config: pytest.Config) -> tuple[Path, ...]:
    """The directories of the suite's test files: the ``kvcache.benchmarks`` package (installed, or mapped
    by an editable install) and, in a source checkout, ``benchmarks/`` beside the ``kvcache`` package.
    Found once per session, each as given and resolved."""
    dirs = config.stash.get(SUITE_DIRS, None)
    if dirs is None:
        import kvcache

        found = [Path(p) for p in _package_locations(SUITE_PACKAGE)]
        checkout = Path(kvcache.__file__).resolve().parent.parent
        if (checkout / "pyproject.toml").is_file() and (checkout / "benchmarks" / "conftest.py").is_file():
            found.append(checkout / "benchmarks")
        dirs = config.stash[SUITE_DIRS] = tuple(dict.fromkeys([*found, *(p.resolve() for p in found)]))
    return dirs


def _package_locations(name: str) -> list[str]:
    """A module's file or a package's directories, without running it (its parent packages are imported)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)
    return [spec.origin] if spec.origin and spec.origin not in ("built-in", "frozen") else []


def in_suite(config: pytest.Config, path: Path) -> bool:
    """Whether ``path`` (a test file or directory) is part of the suite."""
    path = Path(path)
    return any(path == d or d in path.parents for d in suite_dirs(config))


def collects_suite(config: pytest.Config) -> bool:
    """Whether the run's arguments reach the suite: a path in it (``pytest benchmarks``, a node id), a
    ``--pyargs`` module name in it (``pytest --pyargs kvcache.benchmarks``), or a directory above it from
    which pytest would recurse into it (the repository's root, but not a project whose virtual environment
    holds the installed suite). No arguments: pytest's own choice (``testpaths`` or the current directory)."""
    dirs = suite_dirs(config)
    if not dirs:
        return False
    base = config.invocation_params.dir
    ignored = [Path(base, p).resolve() for p in (config.getoption("ignore", None) or [])]
    skip = config.getini("norecursedirs")
    for arg in config.args:
        target = str(arg).split("::")[0]
        located = _package_locations(target) if config.option.pyargs else []
        path = Path(base, located[0] if located else target).resolve()
        for suite in dirs:
            if path == suite or suite in path.parents:
                return True
            if path in suite.parents and not any(p == suite or p in suite.parents for p in ignored):
                between = [suite, *suite.parents[:len(suite.parents) - len(path.parents) - 1]]
                if not any(any(fnmatch.fnmatch(d.name, pattern) for pattern in skip) or (d / "pyvenv.cfg").exists()
                           for d in between):
                    return True
    return False


def _state(config: pytest.Config) -> KVState:
    state = config.stash.get(STATE, None)
    if state is None:
        raise pytest.UsageError("the kvcache-passes fixtures belong to its suite (pytest benchmarks, or "
                                "pytest --pyargs kvcache.benchmarks)")
    return state


def _state_for_suite(config: pytest.Config) -> KVState | None:
    """The state, made on first need when the suite turns up though the arguments did not show it (its
    checks then run once its items are collected); None when an option is bad (that problem is raised as a
    usage error once collection ends)."""
    if STATE in config.stash:
        return config.stash[STATE]
    if PROBLEM in config.stash:
        return None
    try:
        return _new_state(config, settings_from(config))
    except SettingsError as exc:
        config.stash[PROBLEM] = str(exc)
        return None


def timed_points(settings: Settings) -> list[Any]:
    """Every (cache, context, round), in the order they are measured."""
    from kvcache.measuring.session import PointId

    out = []
    for r in range(settings.rounds):
        contexts = list(settings.contexts)
        if settings.order == "ascending":
            out += [PointId(c, n, r) for c in settings.caches for n in sorted(contexts)]
            continue
        random.Random(settings.seed * 1000 + r).shuffle(contexts)
        for i, n in enumerate(contexts):
            rotated = settings.caches[i % len(settings.caches):] + settings.caches[:i % len(settings.caches)]
            out += [PointId(c, n, r) for c in rotated]
    return out


def ledger_points(settings: Settings) -> list[Any]:
    """One profiled (cache, context) per class and context (none with --kv-ledger-steps 0), contexts in a seeded
    shuffled order with the classes rotated, like a timed round: a machine slowing down during the ledger must not
    read as time growing with context."""
    from kvcache.measuring.session import PointId

    if not settings.profiles_ledger:
        return []
    contexts = list(settings.contexts)
    random.Random(settings.seed * 1000 + 999).shuffle(contexts)
    out = []
    for i, n in enumerate(contexts):
        rotated = settings.caches[i % len(settings.caches):] + settings.caches[:i % len(settings.caches)]
        out += [PointId(c, n, 0) for c in rotated]
    return out


def copy_labels(settings: Settings) -> list[str]:
    return ["start", *(f"round-{r}" for r in range(1, settings.rounds)), "end"]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Without ``--kv-remeasure`` there is nothing to re-measure, with ``--kv-ledger-steps 0`` or ``--kv-compile``
    no ledger: their test files are not collected."""
    off = {"test_remeasure.py": lambda s: s.remeasure == 0,
           "test_ledger.py": lambda s: not s.profiles_ledger}
    if collection_path.name not in off or not in_suite(config, collection_path):
        return None
    state = _state_for_suite(config)
    return True if state is not None and off[collection_path.name](state.settings) else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not in_suite(metafunc.config, metafunc.definition.path):
        return  # a fixture of the same name elsewhere is not the suite's
    state = _state_for_suite(metafunc.config)
    if state is None:
        return
    s = state.settings
    if "kv_point" in metafunc.fixturenames:
        points = timed_points(s)
        metafunc.parametrize("kv_point", points, ids=[p.test_id(s.rounds) for p in points])
    if "kv_cache" in metafunc.fixturenames:
        metafunc.parametrize("kv_cache", list(s.caches))
    if "kv_copy_label" in metafunc.fixturenames:
        metafunc.parametrize("kv_copy_label", copy_labels(s))
    if "kv_ledger" in metafunc.fixturenames:
        points = ledger_points(s)
        metafunc.parametrize("kv_ledger", points, ids=[f"{p.cache}-{p.context}" for p in points])
    if "kv_remeasure" in metafunc.fixturenames:
        metafunc.parametrize("kv_remeasure", list(range(s.remeasure)), ids=[f"noisiest-{k + 1}"
                                                                          for k in range(s.remeasure)])


def _role(item: pytest.Item) -> tuple[str, Any]:
    """What a suite item measures (``other`` for anything else)."""
    if not in_suite(item.config, item.path):
        return "other", None
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "kv_cache" in params:
        return "counted", params["kv_cache"]
    if "kv_copy_label" in params:
        return "copy", params["kv_copy_label"]
    if "kv_point" in params:
        return "point", params["kv_point"]
    if "kv_ledger" in params:
        return "ledger", params["kv_ledger"]
    if "kv_remeasure" in getattr(item, "fixturenames", ()):
        return "remeasure", params.get("kv_remeasure")
    if "kv_drift" in getattr(item, "fixturenames", ()):
        return "drift", None
    return "other", None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """When the suite's items are collected: the checks, if the arguments did not show the suite at start-up,
    then the items in measuring order (after any deselection by -k/-m)."""
    if STATE not in config.stash and PROBLEM not in config.stash:
        return  # every suite item passed pytest_generate_tests, which makes one of them
    if not any(in_suite(config, item.path) for item in items):
        return
    if PROBLEM in config.stash:
        raise pytest.UsageError(config.stash[PROBLEM])
    state = _state(config)
    if not state.checked:
        check_before_running(config, state)
    s = state.settings
    roles = [(_role(item), item) for item in items]
    others = [item for (role, _), item in roles if role == "other"]
    counted = [item for (role, _), item in roles if role == "counted"]
    copies = {key: item for (role, key), item in roles if role == "copy"}
    points = {key: item for (role, key), item in roles if role == "point"}
    drift = [item for (role, _), item in roles if role == "drift"]
    remeasure = [item for (role, _), item in roles if role == "remeasure"]
    ledgers = [item for (role, _), item in roles if role == "ledger"]
    ordered = others + counted
    if points:
        if "start" in copies:
            ordered.append(copies.pop("start"))
        current_round = 0
        for point in timed_points(s):
            if point.round != current_round:  # each later round starts with the copy bandwidth again
                current_round = point.round
                if f"round-{current_round}" in copies:
                    ordered.append(copies.pop(f"round-{current_round}"))
            if point in points:
                ordered.append(points[point])
        ordered += remeasure + ledgers
        if "end" in copies:
            ordered.append(copies.pop("end"))
        ordered += drift
    else:
        ordered += remeasure + ledgers + drift
    items[:] = ordered + list(copies.values())  # anything selected is kept, in order or not


# --- fixtures ---------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def kv(request: pytest.FixtureRequest) -> Any:
    """The measuring session (:class:`kvcache.measuring.session.KVSession`)."""
    return _state(request.config).session


@pytest.fixture
def kv_drift(kv: Any) -> Any:
    """The first timed point measured this session (skips when none was)."""
    if kv.first_point is None:
        pytest.skip("drift: no timed point was measured before this test")
    return kv.first_point


# --- records: from each item's report to one place ----------------------------------------------------

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Attach the records the item produced (and a failed point's class) to its report."""
    outcome = yield
    state = item.config.stash.get(STATE, None)
    if state is None or state._session is None:
        return
    report = outcome.get_result()
    for record in state.session.take_records():
        report.user_properties.append((RECORD, record))
    if not report.failed:
        return
    role, key = _role(item)
    if role in ("point", "counted", "copy", "remeasure", "drift"):
        cache = getattr(key, "cache", key if role == "counted" else None)
        report.user_properties.append((RECORD, {"type": "failed", "role": role, "cache": cache,
                                                "nodeid": item.nodeid}))


class RecordGatherer:
    """Gathers the records of every report (this process's items, or each xdist worker's on the
    controller) into the session's state; registered with the state."""

    def __init__(self, state: KVState) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in getattr(report, "user_properties", ()):
            if name != RECORD:
                continue
            if value.get("type") == "failed":
                if value.get("cache"):
                    self.state.failed.append(value["cache"])
            else:
                self.state.records.append(value)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> Any:
        """Note how the session ended before anything is analysed or saved: pytest-benchmark writes its JSON,
        with the ``kv`` section, in its own (inner) wrapper of this hook."""
        stopper = self.state.stopper
        if stopper is not None:
            stopper.finishing(session)
        code = int(exitstatus)
        name = pytest.ExitCode(code).name.lower() if code in {int(c) for c in pytest.ExitCode} else str(code)
        self.state.exit = {"interrupted": code in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR),
                           "exit": name}
        if stopper is not None and stopper.received:  # pytest may not know: a second signal cut its handling short
            self.state.exit = {"interrupted": True, "exit": f"interrupted by {stopper.received[0]}"}
        _write_benchmark_json_atomically(session.config, self.state)
        yield
        if self.state.unwritten and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if stopper is not None and stopper.received and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.INTERRUPTED  # a signal while the results were written


class Stopper:
    """SIGTERM (what ``timeout``, ``docker stop`` and CI cancellation send) stops the suite as Ctrl-C does, and
    neither signal can lose or spoil what was measured.

    The first SIGINT or SIGTERM while the session runs raises KeyboardInterrupt: pytest ends the session as
    interrupted, the finished points are analysed and written (``kv.session.interrupted`` true, ``exit``
    "interrupted by SIGTERM"), no timed baseline is recorded, and pytest exits 2. Any later signal, and one that
    arrives once the session's results are being written, only prints a line: the writes finish (the JSON and
    the baseline are whole files, the interrupted mark stays) and the exit status is not 0. SIGKILL still stops
    at once, losing what was not written. Installed from the main thread, only over Python's default handlers;
    the previous handlers come back at unconfigure."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self, state: KVState) -> None:
        self.state = state
        self.received: list[str] = []  # signal names, in the order they came
        self.session: pytest.Session | None = None  # set once the session's results are being written
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for name in self.SIGNALS:
            signum = getattr(signal, name, None)
            if signum is None or signal.getsignal(signum) not in (signal.SIG_DFL, signal.default_int_handler):
                continue  # ignored (nohup) or someone else's handler: left alone
            self.previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self.handle)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()

    def finishing(self, session: pytest.Session) -> None:
        """The session's results are being written from now on: no signal interrupts that any more."""
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """A signal can land on an instruction that maps to no source line: CPython 3.11 then gives that traceback
        entry ``tb_lineno`` None, and pytest's report of the interrupt raises TypeError (a traceback, exit 1, no
        JSON). Such entries are unlinked from the traceback before pytest reports it."""
        tb = excinfo.tb
        while tb is not None and tb.tb_next is not None:
            if tb.tb_next.tb_lineno is None:
                tb.tb_next = tb.tb_next.tb_next
            else:
                tb = tb.tb_next

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        """Mark finishing as soon as the test loop ends, however it ends: a first signal between its end and
        session finish would otherwise raise out of pytest's own clean-up, with no JSON written."""
        try:
            return (yield)
        finally:
            self.finishing(session)

    def handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        first = not self.received
        self.received.append(name)
        if first and self.session is None:
            raise KeyboardInterrupt(f"{name}: writing the points measured so far")
        if self.state.kv is None:  # not analysed yet: the run is marked interrupted
            self.state.exit = {"interrupted": True, "exit": f"interrupted by {self.received[0]}"}
        again = "" if first else " again (SIGKILL stops at once and loses them)"
        # os.write, not sys.stderr: the signal may land inside a write to sys.stderr (a reentrant call raises)
        os.write(2, f"\nkvcache: {name}{again}: stopping once the measured points are written\n".encode())

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.restore()
        if self.received and self.session is not None and self.session.exitstatus == pytest.ExitCode.OK:
            self.session.exitstatus = pytest.ExitCode.INTERRUPTED


def _write_benchmark_json_atomically(config: pytest.Config, state: KVState) -> None:
    """pytest-benchmark writes ``--benchmark-json`` in place (``open(path, "wb")``): a signal or a full disk
    mid-write leaves half a file, and a symlink's target is truncated first. Have it written through
    :func:`kvcache.analysing.files.write_text_atomically` instead, with the same text; a file that cannot be
    written is a one-line note and a failed exit, not a traceback."""
    bench = getattr(config, "_benchmarksession", None)
    if bench is None or not getattr(bench, "json", None) or not callable(getattr(bench, "save_json", None)):
        return
    from pytest_benchmark.utils import safe_dumps

    def save_json(output_json: dict[str, Any]) -> None:
        if _write_json(state, bench.json, safe_dumps(output_json, ensure_ascii=True, indent=4)):
            bench.logger.info(f"Wrote benchmark data in: {bench.json}", purple=True)

    bench.save_json = save_json


# --- session end ------------------------------------------------------------------------------------

def _used_state(config: pytest.Config) -> KVState | None:
    """The state when the suite measured something in this session (here or on xdist workers), else None."""
    state = config.stash.get(STATE, None)
    return state if state is not None and state.used else None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Analyse, record the baseline when asked, judge, and set the exit status (before the terminal summary)."""
    state = _used_state(session.config)
    if state is None:
        return
    from kvcache.analysing import analysis
    from kvcache.analysing import baseline as baselines

    config = session.config
    kv = state.analyse()
    _write_json_if_missing(config, kv)
    s = state.settings
    late = state.stopper is not None and state.stopper.received and not (kv.get("session") or {}).get("interrupted")
    if s.update_baseline and late:  # a signal after the analysis said the session finished: record nothing
        state.notes.append(f"baseline NOT written to {s.baseline}: {state.stopper.received[0]} arrived while the "
                           "results were being written")
    elif s.update_baseline:
        recorded = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        try:
            entries, refused = baselines.record(s.baseline, kv, recorded)
        except (OSError, baselines.BaselineError) as exc:
            reason = exc if isinstance(exc, baselines.BaselineError) else f"{s.baseline}: {baselines.one_line(exc)}"
            state.notes.append(f"baseline NOT written: {reason}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        else:
            state.notes += [f"baseline: {line}" for line in refused]
            written = ", ".join(f"{key} ({', '.join(by_cache)})" for key, by_cache in entries.items()) or "nothing"
            state.notes.append(f"baseline written to {s.baseline}: {written}")
    state.failures = analysis.failures(kv)
    if state.failures and s.gate:  # judged against the baseline as it was: recording new values is no pass
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# pytest-benchmark's hooks: optional, so that the plugin loads where pytest-benchmark is not installed.

@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]) -> None:
    state = _used_state(config)
    if state is not None:
        output_json["kv"] = state.analyse()


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """The device and library facts, the same whenever asked: pytest-benchmark asks once at configure time to
    compare with a saved run (``--benchmark-compare``, before anything is measured) and once at the end to
    save, and warns when the two dicts differ. Run-dependent values belong in the ``kv`` section."""
    state = config.stash.get(STATE, None)
    if state is not None and state.checked:
        machine_info["kv_environment"] = state.session.machine()


@pytest.hookimpl(wrapper=True, optionalhook=True)
def pytest_benchmark_compare_machine_info(config: pytest.Config, benchmarksession: Any, machine_info: Any,
                                          compared_benchmark: Any) -> Any:
    """pytest-benchmark 5.3.1 words its "machine_info is different" warning with the storage path relative to
    the working directory, which raises ValueError for a ``--benchmark-storage`` outside it (INTERNALERROR).
    Give that warning with the absolute path instead."""
    try:
        return (yield)
    except ValueError:
        from pytest_benchmark.utils import consistent_dumps

        benchmarksession.logger.warning(
            f"Benchmark machine_info is different. Current: {consistent_dumps(machine_info)} VS saved: "
            f"{consistent_dumps(compared_benchmark.get('machine_info'))} (location: {benchmarksession.storage}).")
        return None


def _write_json_if_missing(config: pytest.Config, kv: dict[str, Any]) -> None:
    """pytest-benchmark writes no JSON when no benchmark ran (counted-only, --benchmark-disable); write one
    of the same shape so the counted results are not lost."""
    path = config.getoption("benchmark_json", None)
    if not path or getattr(getattr(config, "_benchmarksession", None), "benchmarks", None):
        return  # none asked for, or pytest-benchmark wrote it, with the kv section from update_json
    doc = {"machine_info": {"kv_environment": kv.get("environment")}, "commit_info": {}, "benchmarks": [],
           "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(), "version": None, "kv": kv}
    _write_json(config.stash[STATE], path, json.dumps(doc, indent=4))


def _write_json(state: KVState, path: str | Path, text: str) -> bool:
    """Write the ``--benchmark-json`` run atomically (through symlinks); a file that cannot be written is a red
    line at the end and a failed exit (``state.unwritten``), not a traceback. Whether it was written."""
    from kvcache.analysing import files

    try:
        files.write_text_atomically(path, text)
    except OSError as exc:
        state.unwritten.append(f"--benchmark-json {files.shown(path)} NOT written ({exc.strerror or exc})")
        return False
    return True


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = _used_state(config)
    if state is None or state.kv is None:
        return
    from kvcache.analysing import analysis, summary

    tr = terminalreporter
    tr.section("kvcache-passes")
    for line in summary.lines(state.kv):
        tr.write_line(line)
    for note in state.notes:
        tr.write_line(note)
    for line in state.unwritten:
        tr.write_line(line, red=True, bold=True)
    for line in analysis.warnings(state.kv):
        tr.write_line(line, yellow=True, bold=True)
    if state.failures:
        mode = "" if state.settings.gate else " (not failing: --kv-no-gate)"
        for line in state.failures:
            tr.write_line(line + mode, red=bool(not mode), bold=True)
