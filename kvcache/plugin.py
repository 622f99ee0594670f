"""The pytest plugin (loaded by the root ``conftest.py``): ``--kv-*`` options, parametrization and order
of the benchmarks, fixtures, and the session-end analysis, report and gate.

Order of a session: counted traffic of every class (deterministic), then the copy bandwidth, then
``--kv-rounds`` rounds of timed points (interleaved across classes and contexts, the copy bandwidth
measured again at each round's start), the copy bandwidth at the end, and last the first timed point
measured again for the drift check.

Each item's measurements travel as records in its report (``user_properties``), so the session-end
analysis sees every item, from xdist workers too, whatever pytest-benchmark keeps or saves.
"""

from __future__ import annotations

import datetime
import json
import random
from pathlib import Path
from typing import Any

import pytest

from kvcache.analysing import analysis, gate, summary
from kvcache.analysing import baseline as baselines
from kvcache.settings import FILLS, ORDERS, Settings, SettingsError, check_choice, number, parse_ints

STATE = pytest.StashKey["KVState"]()
RECORD = "kv_record"  # the user_properties name of a measurement record


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("kvcache-passes", "KV-cache passes per decode step")
    add = g.addoption
    add("--kv-model", default="smollm2-135m",
        help="smollm2-135m (default), smollm2-135m-mha, tiny, a local directory with config.json, or a hub id")
    add("--kv-device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda or mps")
    add("--kv-dtype", default="bfloat16", help="bfloat16 (default), float16 or float32")
    add("--kv-caches", default="dynamic,static", help="cache classes, comma-separated, or 'all'")
    add("--kv-contexts", default="512,1024,2048,4096,8192,16384,32768", help="context lengths in tokens")
    add("--kv-counted-contexts", default="256,512", help="the two contexts counted traffic is taken at")
    add("--kv-fill", default="synthetic", help="synthetic (random K/V written into every layer) or prefill")
    add("--kv-warmup", default=5, help="untimed decode steps before the timed ones (default 5)")
    add("--kv-steps", default=50, help="timed decode steps per point (default 50)")
    add("--kv-rounds", default=5, help="rounds over all points (default 5)")
    add("--kv-order", default="interleaved", help="interleaved (default: seeded order per round) or ascending")
    add("--kv-seed", default=0, help="seed for weights, fills and the interleaved order")
    add("--kv-copy-mib", default=1024, help="size of the copy-bandwidth tensor in MiB (default 1024)")
    add("--kv-max-drift", default=0.10, help="largest change of the re-measured first point before timed verdicts "
                                              "are inconclusive (the build fails on it only with --kv-strict)")
    add("--kv-baseline", default="kv-baseline.json", help="baseline file of passes per device (default "
                                                           "kv-baseline.json in the root directory)")
    add("--kv-update-baseline", action="store_true", help="write this run's passes into the baseline file")
    add("--kv-tolerance", default=0.10, help="allowed relative rise of timed passes (default 0.10)")
    add("--kv-counted-tolerance", default=0.05, help="allowed rise of counted passes (default 0.05)")
    add("--kv-max-passes", default="", help="absolute bounds, e.g. dynamic=3.5,static=7")
    add("--kv-min-r2", default=0.90, help="fits below this R² are inconclusive (default 0.90)")
    add("--kv-no-gate", action="store_true", help="report everything without failing the build")
    add("--kv-strict", action="store_true", help="inconclusive timed verdicts (drift beyond --kv-max-drift "
                                                  "included) fail the build too")
    add("--kv-remeasure", default=0, help="after the rounds, measure the N noisiest points once more (default 0)")
    add("--kv-remeasure-seconds", default=120, help="time bound of those re-measurements (default 120 s)")


def settings_from(config: pytest.Config) -> Settings:
    """Validated settings; any bad value is a one-line SettingsError."""
    from kvcache.measuring import caches, models

    opt = config.getoption
    try:
        caches_ = tuple(caches.parse_caches(opt("kv_caches")))
    except caches.CacheError as exc:
        raise SettingsError(str(exc)) from None
    try:
        max_passes = gate.parse_max_passes(opt("kv_max_passes"))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    for name in max_passes:
        if name not in caches.registry():
            raise SettingsError(f"--kv-max-passes: unknown cache class {name!r}; known: "
                                f"{', '.join(caches.registry())}")
    counted = parse_ints("--kv-counted-contexts", opt("kv_counted_contexts"))
    if len(counted) != 2:
        raise SettingsError(f"--kv-counted-contexts {opt('kv_counted_contexts')!r}: give two different contexts")
    models.torch_dtype(opt("kv_dtype"))
    return Settings(
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
        max_passes=max_passes, min_r2=number("--kv-min-r2", opt("kv_min_r2"), low=0, high=1),
        gate=not opt("kv_no_gate"), strict=bool(opt("kv_strict")),
        remeasure=int(number("--kv-remeasure", opt("kv_remeasure"), low=0, whole=True)),
        remeasure_seconds=number("--kv-remeasure-seconds", opt("kv_remeasure_seconds"), low=0),
    )


class KVState:
    """Per-session state: settings, the measuring session (built on first use), the analysis."""

    def __init__(self, settings: Settings, baseline: dict[str, Any], worker: bool = False) -> None:
        self.settings = settings
        self.baseline = baseline
        self.worker = worker  # an xdist worker: measures and reports records, never analyses
        self._session: Any = None
        self.records: list[dict[str, Any]] = []
        self.failed: list[str] = []
        self.exit: dict[str, Any] = {"interrupted": False, "exit": "running"}
        self.kv: dict[str, Any] | None = None
        self.failures: list[str] = []
        self.notes: list[str] = []

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
        if self.kv is None:
            session = {**self.exit, "failed": sorted(set(self.failed))}
            self.kv = analysis.analyse(self.records, self.settings.to_dict(), self.baseline, session)
        return self.kv


def pytest_configure(config: pytest.Config) -> None:
    from kvcache.measuring import preflight
    from kvcache.measuring.devices import DeviceError, resolve
    from kvcache.measuring.models import ModelError, load_config

    try:
        settings = settings_from(config)
        resolve(settings.device)
        preflight.check(config, settings)  # paths the run writes, copy tensor against free memory
        load_config(settings.model)
        baseline = baselines.load(settings.baseline)
        problem = xdist_problem(config)
        if problem:
            raise SettingsError(problem)
    except (SettingsError, DeviceError, ModelError, baselines.BaselineError) as exc:
        raise pytest.UsageError(str(exc)) from None
    state = KVState(settings, baseline, worker=hasattr(config, "workerinput"))
    config.stash[STATE] = state
    if not state.worker:
        config.pluginmanager.register(RecordGatherer(state), "kvcache-records")


def xdist_problem(config: pytest.Config) -> str | None:
    """Timed points under pytest-xdist are refused: workers timing on the same cores measure each other.
    A counted-only run (``-m`` deselecting timed items) works: every worker's records reach one analysis."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") == "no" or not config.getoption("tx", None):
        return None
    if not _collects_suite(config):
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


def _collects_suite(config: pytest.Config) -> bool:
    """Whether the run's arguments reach the suite's benchmarks (this plugin's items)."""
    suite = (config.rootpath / "benchmarks").resolve()
    for arg in config.args or ["."]:
        path = Path(config.invocation_params.dir, str(arg).split("::")[0]).resolve()
        if path == suite or suite in path.parents or path in suite.parents:
            return True
    return False


def _state(config: pytest.Config) -> KVState:
    return config.stash[STATE]


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


def copy_labels(settings: Settings) -> list[str]:
    return ["start", *(f"round-{r}" for r in range(1, settings.rounds)), "end"]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Without ``--kv-remeasure`` there is nothing to re-measure: its test file is not collected."""
    if collection_path.name == "test_remeasure.py" and STATE in config.stash:
        return True if _state(config).settings.remeasure == 0 else None
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = _state(metafunc.config)
    s = state.settings
    if "kv_point" in metafunc.fixturenames:
        points = timed_points(s)
        metafunc.parametrize("kv_point", points, ids=[p.test_id(s.rounds) for p in points])
    if "kv_cache" in metafunc.fixturenames:
        metafunc.parametrize("kv_cache", list(s.caches))
    if "kv_copy_label" in metafunc.fixturenames:
        metafunc.parametrize("kv_copy_label", copy_labels(s))
    if "kv_remeasure" in metafunc.fixturenames:
        metafunc.parametrize("kv_remeasure", list(range(s.remeasure)), ids=[f"noisiest-{k + 1}"
                                                                          for k in range(s.remeasure)])


def _role(item: pytest.Item) -> tuple[str, Any]:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "kv_cache" in params:
        return "counted", params["kv_cache"]
    if "kv_copy_label" in params:
        return "copy", params["kv_copy_label"]
    if "kv_point" in params:
        return "point", params["kv_point"]
    if "kv_remeasure" in getattr(item, "fixturenames", ()):
        return "remeasure", params.get("kv_remeasure")
    if "kv_drift" in getattr(item, "fixturenames", ()):
        return "drift", None
    return "other", None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the suite's items in measuring order (after any deselection by -k/-m)."""
    s = _state(config).settings
    roles = [(_role(item), item) for item in items]
    others = [item for (role, _), item in roles if role == "other"]
    counted = [item for (role, _), item in roles if role == "counted"]
    copies = {key: item for (role, key), item in roles if role == "copy"}
    points = {key: item for (role, key), item in roles if role == "point"}
    drift = [item for (role, _), item in roles if role == "drift"]
    remeasure = [item for (role, _), item in roles if role == "remeasure"]
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
        ordered += remeasure
        if "end" in copies:
            ordered.append(copies.pop("end"))
        ordered += drift
    else:
        ordered += remeasure + drift
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
    report = outcome.get_result()
    state = item.config.stash.get(STATE, None)
    if state is None or state._session is None:
        return
    for record in state.session.take_records():
        report.user_properties.append((RECORD, record))
    role, key = _role(item)
    if report.failed and role in ("point", "counted", "copy", "remeasure", "drift"):
        cache = getattr(key, "cache", key if role == "counted" else None)
        report.user_properties.append((RECORD, {"type": "failed", "role": role, "cache": cache,
                                                "nodeid": item.nodeid}))


class RecordGatherer:
    """Gathers the records of every report (this process's items, or each xdist worker's on the
    controller) into the session's state; registered by :func:`pytest_configure`."""

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
        code = int(exitstatus)
        name = pytest.ExitCode(code).name.lower() if code in {int(c) for c in pytest.ExitCode} else str(code)
        self.state.exit = {"interrupted": code in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR),
                           "exit": name}
        yield


# --- session end ------------------------------------------------------------------------------------

def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Analyse, record the baseline when asked, judge, and set the exit status (before the terminal summary)."""
    state = session.config.stash.get(STATE, None)
    if state is None or not state.used:
        return
    config = session.config
    kv = state.analyse()
    _write_json_if_missing(config, kv)
    s = state.settings
    if s.update_baseline:
        recorded = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        try:
            entries, refused = baselines.record(s.baseline, kv, recorded)
        except (OSError, baselines.BaselineError) as exc:
            state.notes.append(f"baseline NOT written to {s.baseline}: {baselines.one_line(exc)}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        else:
            state.notes += [f"baseline: {line}" for line in refused]
            written = ", ".join(f"{key} ({', '.join(by_cache)})" for key, by_cache in entries.items()) or "nothing"
            state.notes.append(f"baseline written to {s.baseline}: {written}")
    state.failures = analysis.failures(kv)
    if state.failures and s.gate and not s.update_baseline:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_benchmark_update_json(config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]) -> None:
    state = _state(config)
    if state.used:
        output_json["kv"] = state.analyse()


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """The device and library facts, the same whenever asked: pytest-benchmark asks once at configure time to
    compare with a saved run (``--benchmark-compare``, before anything is measured) and once at the end to
    save, and warns when the two dicts differ. Run-dependent values belong in the ``kv`` section."""
    if STATE in config.stash:
        machine_info["kv_environment"] = _state(config).session.machine()


@pytest.hookimpl(wrapper=True)
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
    Path(path).write_text(json.dumps(doc, indent=4))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = _state(config)
    if not state.used or state.kv is None:
        return
    tr = terminalreporter
    tr.section("kvcache-passes")
    for line in summary.lines(state.kv):
        tr.write_line(line)
    for note in state.notes:
        tr.write_line(note)
    for line in analysis.warnings(state.kv):
        tr.write_line(line, yellow=True, bold=True)
    if state.failures:
        mode = ("" if state.settings.gate and not state.settings.update_baseline else
                " (not failing: --kv-no-gate)" if not state.settings.gate else " (not failing: baseline updated)")
        for line in state.failures:
            tr.write_line(line + mode, red=bool(not mode), bold=True)
