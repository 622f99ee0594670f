"""The pytest plugin (loaded by the root ``conftest.py``): ``--kv-*`` options, parametrization and order
of the benchmarks, fixtures, and the session-end analysis, report and gate.

Order of a session: counted traffic of every class (deterministic), then the copy bandwidth, then
``--kv-rounds`` rounds of timed points (interleaved across classes and contexts, the copy bandwidth
measured again at each round's start), the copy bandwidth at the end, and last the first timed point
measured again for the drift check.
"""

from __future__ import annotations

import datetime
import json
import random
from pathlib import Path
from typing import Any

import pytest

from kvcache import analysis, gate, summary
from kvcache.settings import FILLS, ORDERS, Settings, SettingsError, check_choice, number, parse_ints

STATE = pytest.StashKey["KVState"]()


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
    add("--kv-max-drift", default=0.10, help="largest allowed change of the re-measured first point")
    add("--kv-baseline", default="kv-baseline.json", help="baseline file of passes per device (default "
                                                           "kv-baseline.json in the root directory)")
    add("--kv-update-baseline", action="store_true", help="write this run's passes into the baseline file")
    add("--kv-tolerance", default=0.10, help="allowed relative rise of timed passes (default 0.10)")
    add("--kv-counted-tolerance", default=0.05, help="allowed rise of counted passes (default 0.05)")
    add("--kv-max-passes", default="", help="absolute bounds, e.g. dynamic=3.5,static=7")
    add("--kv-min-r2", default=0.90, help="fits below this R² are inconclusive (default 0.90)")
    add("--kv-no-gate", action="store_true", help="report everything, drift included, without failing")
    add("--kv-remeasure", default=0, help="after the rounds, measure the N noisiest points once more (default 0)")
    add("--kv-remeasure-seconds", default=120, help="time bound of those re-measurements (default 120 s)")


def settings_from(config: pytest.Config) -> Settings:
    """Validated settings; any bad value is a one-line SettingsError."""
    from kvcache import caches, models

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
        gate=not opt("kv_no_gate"),
        remeasure=int(number("--kv-remeasure", opt("kv_remeasure"), low=0, whole=True)),
        remeasure_seconds=number("--kv-remeasure-seconds", opt("kv_remeasure_seconds"), low=0),
    )


class KVState:
    """Per-session state: settings, the measuring session (built on first use), the analysis."""

    def __init__(self, settings: Settings, baseline: dict[str, Any]) -> None:
        self.settings = settings
        self.baseline = baseline
        self._session: Any = None
        self.kv: dict[str, Any] | None = None
        self.failures: list[str] = []
        self.notes: list[str] = []

    @property
    def session(self) -> Any:
        if self._session is None:
            from kvcache.devices import Device
            from kvcache.session import KVSession

            self._session = KVSession(self.settings, Device.from_choice(self.settings.device))
        return self._session

    @property
    def used(self) -> bool:
        return self._session is not None and self._session.used

    def analyse(self, benchmarks: list[dict[str, Any]]) -> dict[str, Any]:
        if self.kv is None:
            self.kv = analysis.analyse(benchmarks, self.session.raw(), self.settings.to_dict(), self.baseline)
        return self.kv


def pytest_configure(config: pytest.Config) -> None:
    from kvcache import preflight
    from kvcache.devices import DeviceError, resolve
    from kvcache.models import ModelError, load_config

    try:
        settings = settings_from(config)
        resolve(settings.device)
        preflight.check(config, settings)  # paths the run writes, copy tensor against free memory
        load_config(settings.model)
        baseline = gate.load_baseline(settings.baseline)
    except (SettingsError, DeviceError, ModelError, gate.BaselineError) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[STATE] = KVState(settings, baseline)


def _state(config: pytest.Config) -> KVState:
    return config.stash[STATE]


def timed_points(settings: Settings) -> list[Any]:
    """Every (cache, context, round), in the order they are measured."""
    from kvcache.session import PointId

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
    """The measuring session (:class:`kvcache.session.KVSession`)."""
    return _state(request.config).session


@pytest.fixture
def kv_drift(kv: Any) -> Any:
    """The first timed point measured this session (skips when none was)."""
    if kv.first_point is None:
        pytest.skip("drift: no timed point was measured before this test")
    return kv.first_point


# --- session end ------------------------------------------------------------------------------------

def _benchmark_dicts(config: pytest.Config) -> list[dict[str, Any]]:
    bs = getattr(config, "_benchmarksession", None)
    out = []
    for bench in getattr(bs, "benchmarks", None) or []:
        try:
            out.append(bench.as_dict(include_data=True))
        except Exception:  # noqa: BLE001 - a benchmark without stats (disabled) is not a timed point
            continue
    return out


def pytest_benchmark_update_json(config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]) -> None:
    state = _state(config)
    if state.used:
        output_json["kv"] = state.analyse(output_json.get("benchmarks", []))


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    state = _state(config)
    if state.used:
        machine_info["kv_environment"] = state.session.environment()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = _state(config)
    if not state.used:
        return
    kv = state.analyse(_benchmark_dicts(config))
    _write_json_if_missing(config, kv)
    s = state.settings
    if s.update_baseline:
        recorded = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        analysis.record_baseline(s.baseline, kv, recorded)
        state.notes.append(f"baseline written to {s.baseline}")
    state.failures = analysis.failures(kv)
    if state.failures and s.gate and not s.update_baseline:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
    if state.failures:
        mode = "" if state.settings.gate and not state.settings.update_baseline else " (not failing: --kv-no-gate)"
        for line in state.failures:
            tr.write_line(line + mode, red=bool(not mode), bold=True)
