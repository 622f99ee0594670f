"""Running the benchmark suite (``pytest benchmarks ...``) in a subprocess, for tests of the plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300


def environment(pythonpath: Iterable[Path | str] = (), **extra: str) -> dict[str, str]:
    """This process's environment without pytest's own variables (nor pytest-xdist's, when the tests run on its
    workers), plus ``pythonpath`` and ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS") and not k.startswith("PYTEST_XDIST_")}
    env.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the network; never wait for it
    # One thread per run: runs go a few at a time, and torch's OpenMP threads spin-wait for each other when
    # a core is taken (10x slower steps on a busy 2-core machine). Nothing here asserts on timing.
    env.setdefault("OMP_NUM_THREADS", "1")
    paths = [str(p) for p in pythonpath] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


def run_suite(*args: str, pythonpath: Iterable[Path | str] = (), timeout: float = TIMEOUT_S,
              **env: str) -> subprocess.CompletedProcess:
    """``python -m pytest benchmarks -p no:cacheprovider ARGS`` in the project root; output as text.

    ``subprocess.run`` kills the child if it overruns ``timeout``, so nothing is left running."""
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=ROOT, env=environment(pythonpath, **env), capture_output=True, text=True,
                          timeout=timeout)


def run_python(code: str, *, pythonpath: Iterable[Path | str] = (), timeout: float = TIMEOUT_S) -> \
        subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment(pythonpath), capture_output=True,
                          text=True, timeout=timeout)


def run_many(jobs: dict[Any, tuple], workers: int = 3) -> dict[Any, subprocess.CompletedProcess]:
    """``{key: run_suite args}`` run a few at a time (mostly start-up: importing torch and transformers)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {key: pool.submit(run_suite, *args) for key, args in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


# Runs ``pytest benchmarks -p no:cacheprovider ARGS`` once per case inside one Python process (torch and
# transformers are imported once), each a fresh pytest.main with its own stdout/stderr; prints JSON.
MARKER = "@@kvrun-results@@"
BATCH_DRIVER = """
import contextlib, io, json, sys, traceback
import pytest
results = {}
for name, args in json.load(sys.stdin).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = int(pytest.main(["benchmarks", "-p", "no:cacheprovider", *args]))
        except BaseException:  # anything escaping pytest.main is a crash: keep its traceback
            code = None
            traceback.print_exc()
    results[name] = {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
sys.__stdout__.write("\\n" + sys.argv[1] + json.dumps(results))
"""


def run_batch(cases: dict[str, list[str]], *, timeout: float = TIMEOUT_S,
              env: dict[str, str] | None = None,
              pythonpath: Iterable[Path | str] = ()) -> dict[str, subprocess.CompletedProcess]:
    """``{case: args}`` -> ``{case: CompletedProcess-like result}``, every case a ``pytest.main`` of its own in
    one subprocess (``env`` added to its environment), in order: for cheap runs (start-up errors, ``--co``)
    whose cost would be the imports."""
    done = subprocess.run([sys.executable, "-c", BATCH_DRIVER, MARKER], cwd=ROOT,
                          env=environment(pythonpath, **(env or {})), capture_output=True, text=True,
                          timeout=timeout, input=json.dumps(cases))
    if done.returncode != 0:
        raise RuntimeError(f"batch driver failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    results = json.loads(done.stdout.rpartition(MARKER)[2])
    return {name: subprocess.CompletedProcess(["pytest.main", "benchmarks", *cases[name]], r["returncode"],
                                              r["stdout"], r["stderr"]) for name, r in results.items()}


def output(done: subprocess.CompletedProcess) -> str:
    return f"{done.stdout}\n{done.stderr}"


def describe(done: subprocess.CompletedProcess, tail: int = 4000) -> str:
    """The command, exit code and the end of its output, for assertion messages."""
    return f"$ {' '.join(map(str, done.args))}\nexit {done.returncode}\n{output(done)[-tail:]}"


def kvcache_command(command: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``kvcache COMMAND ARGS`` in a subprocess, in ``cwd``, without pytest's variables."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    return subprocess.run([sys.executable, "-m", "kvcache.cli", command, *args], capture_output=True, text=True,
                          cwd=cwd, env=env)


def in_process(main: Any, capsys: Any, *args: str) -> subprocess.CompletedProcess:
    """A command's ``main(args)`` in this process (no interpreter to start: what it checks before its work costs
    milliseconds), its exit status and output as a CompletedProcess."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def load_json(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def check_short_fit(fit: dict[str, Any], n_points: int) -> None:
    """A timed fit of a short run on ``tiny``: computed from every point, and either a positive passes figure or,
    when the noisy line came out flat or falling, a one-line error saying so (never an assertion on timing)."""
    assert fit.get("n_points") == n_points, fit
    if "error" in fit:
        assert set(fit) == {"error", "n_points"} and "\n" not in fit["error"], fit
        assert "slope is not positive" in fit["error"] or "not finite" in fit["error"], fit
    else:
        assert {"intercept_ms", "effective_gbps", "passes", "r2"} <= set(fit), fit
        assert fit["passes"] > 0 and fit["effective_gbps"] > 0 and fit["crossover_tokens"] > 0, fit


def assert_one_line_usage_error(done: subprocess.CompletedProcess, expected: Iterable[str] = ()) -> None:
    """The run stopped with pytest's usage error (exit 4) and printed exactly one line, ``ERROR: ...``, holding each
    of ``expected``, and no traceback."""
    assert done.returncode == 4, describe(done)
    text = output(done)
    assert "Traceback" not in text, describe(done)
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ERROR: "), describe(done)
    for part in expected:
        assert part in lines[0], f"{part!r} not in {lines[0]!r}"
