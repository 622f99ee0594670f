"""Every bad ``--kv-*`` value stops ``pytest benchmarks`` at start-up with exit code 4 (usage error) and one
line, ``ERROR: ...``, naming the bad value and what is accepted: no traceback, nothing else printed.

Every case is a fresh ``pytest.main(["benchmarks", "--co", "-q", ...])``, all of them in one subprocess
(a subprocess each would spend ~3 s apiece importing torch and transformers); two of them also run as
real ``python -m pytest`` command lines, alongside, to pin what a user sees."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from kvrun import assert_one_line_usage_error, describe, output, run_batch, run_suite

torch = pytest.importorskip("torch")

USAGE_ERROR = 4
CASES = [  # the keys of _cases (they need a directory to write files in)
    "device-nonsense", "device-cuda", "dtype", "caches", "caches-empty", "contexts-12x", "contexts-0",
    "contexts-twice", "contexts-twice-spelled", "contexts-empty-item", "contexts-trailing-comma", "fill",
    "order", "max-passes-abc", "max-passes-zero", "max-passes-unknown", "model-missing", "model-no-config",
    "counted-contexts", "steps", "min-r2", "min-r2-nan", "tolerance-nan", "tolerance-inf",
    "counted-tolerance-inf", "max-drift-nan", "baseline-corrupt",
    "baseline-shape", "baseline-nan", "baseline-negative-intercept", "driver", "batch-0", "ragged-alone",
    "generate-compiled", "gpus-unknown", "gpus-release", "baseline-mistyped", "baseline-none-update",
]
COMMAND_LINES = ("dtype", "baseline-corrupt", "baseline-mistyped")  # also run as real command lines


def _cases(tmp) -> dict[str, tuple[list[str], list[str]]]:
    """case -> (arguments, texts the error line must contain)."""
    no_config = tmp / "model-without-config"
    no_config.mkdir()
    (no_config / "weights.bin").write_bytes(b"")
    corrupt = tmp / "corrupt-baseline.json"
    corrupt.write_text('{"schema": 1, "devices": {')
    wrong_shape = tmp / "wrong-shape-baseline.json"
    wrong_shape.write_text('{"schema": 1, "devices": {"cpu | tiny | bfloat16": {"dynamic": {"counted_passes": "3"}}}}')
    nan = tmp / "nan-baseline.json"  # was accepted: "within the allowed nan", the gate then passed anything
    nan.write_text('{"schema": 2, "devices": {"cpu | tiny | bfloat16": {"dynamic": {"counted_passes": NaN}}}}')
    negative = tmp / "negative-intercept-baseline.json"
    negative.write_text('{"schema": 2, "devices": {"cpu: x | tiny | bfloat16": {"static": {"timed_passes": 1.0, '
                        '"timed_intercept_ms": -0.697}}}}')
    return {
        "device-nonsense": (["--kv-device", "nonsense"], ["--kv-device 'nonsense'", "auto, cpu, cuda, mps"]),
        "device-cuda": (["--kv-device", "cuda"], ["--kv-device 'cuda'", "no cuda device", "(available: cpu"]),
        "dtype": (["--kv-dtype", "int7"], ["--kv-dtype 'int7'", "bfloat16, float16, float32"]),
        "caches": (["--kv-caches", "nope"], ["--kv-caches", "'nope'", "known: dynamic, static, inplace", "or all"]),
        "caches-empty": (["--kv-caches", ","], ["--kv-caches ','", "names no cache class", "known: dynamic"]),
        "contexts-12x": (["--kv-contexts", "12x"], ["--kv-contexts '12x'", "'12x' is not a whole number",
                                                    "expected e.g. 512,1024,4k"]),
        "contexts-0": (["--kv-contexts", "0"], ["--kv-contexts '0'", "0 is below the minimum 1"]),
        "contexts-twice": (["--kv-contexts", "512,512"], ["--kv-contexts '512,512'", "512 is given twice",
                                                          "expected e.g. 512,1024,4k, each value once"]),
        "contexts-twice-spelled": (["--kv-contexts", "1k,1024"], ["--kv-contexts '1k,1024'", "1024 is given twice",
                                                                  "'1k' and '1024'"]),
        "contexts-empty-item": (["--kv-contexts", "512,,1024"], ["--kv-contexts '512,,1024'", "empty item",
                                                                 "expected e.g. 512,1024,4k"]),
        "contexts-trailing-comma": (["--kv-contexts", "512,"], ["--kv-contexts '512,'", "empty item"]),
        "fill": (["--kv-fill", "magic"], ["--kv-fill 'magic'", "synthetic, prefill"]),
        "order": (["--kv-order", "random"], ["--kv-order 'random'", "interleaved, ascending"]),
        "max-passes-abc": (["--kv-max-passes", "dynamic=abc"], ["'dynamic=abc'", "expected cache=number"]),
        "max-passes-zero": (["--kv-max-passes", "dynamic=0"], ["'dynamic=0'", "not positive", "cache=number"]),
        "max-passes-unknown": (["--kv-max-passes", "nope=3"], ["--kv-max-passes", "'nope'",
                                                               "known: dynamic, static"]),
        "model-missing": (["--kv-model", "/nonexistent"], ["--kv-model '/nonexistent'",
                                                           "smollm2-135m, smollm2-135m-mha, tiny"]),
        "model-no-config": (["--kv-model", str(no_config)], [f"--kv-model '{no_config}'", "no config.json"]),
        "counted-contexts": (["--kv-counted-contexts", "256"], ["--kv-counted-contexts '256'",
                                                                 "give two different contexts"]),
        "steps": (["--kv-steps", "2"], ["--kv-steps 2", "at least 3"]),
        "min-r2": (["--kv-min-r2", "1.5"], ["--kv-min-r2 1.5", "from 0 to 1"]),
        "min-r2-nan": (["--kv-min-r2", "nan"], ["--kv-min-r2 nan", "from 0 to 1"]),
        "tolerance-nan": (["--kv-tolerance", "nan"], ["--kv-tolerance nan", "at least 0"]),
        "tolerance-inf": (["--kv-tolerance", "inf"], ["--kv-tolerance inf", "a finite number, at least 0"]),
        "counted-tolerance-inf": (["--kv-counted-tolerance", "inf"], ["--kv-counted-tolerance inf", "finite"]),
        "max-drift-nan": (["--kv-max-drift", "nan"], ["--kv-max-drift nan", "at least 0"]),
        "baseline-corrupt": (["--kv-baseline", str(corrupt)], [str(corrupt), "baseline is not JSON"]),
        "driver": (["--kv-driver", "vllm"], ["--kv-driver 'vllm'", "loop, generate"]),
        "batch-0": (["--kv-batch", "0"], ["--kv-batch 0", "at least 1"]),
        "ragged-alone": (["--kv-ragged"], ["--kv-ragged needs --kv-batch of at least 2"]),
        "gpus-unknown": (["--kv-gpus", "t4,v100"], ["--kv-gpus: unknown GPU class 'v100'", "known: t4, a10g, l4"]),
        "gpus-release": (["--kv-gpus", "t4,t4@2.15"], ["--kv-gpus: no SDPA rules transcribed for torch '2.15'",
                                                       "transcribed: 2.5, 2.6"]),
        "generate-compiled": (["--kv-driver", "generate", "--kv-compile", "default"],
                              ["--kv-driver generate with --kv-compile default", "not supported"]),
        "baseline-shape": (["--kv-baseline", str(wrong_shape)], [str(wrong_shape), "not a kvcache baseline",
                                                                 "expected a number or null"]),
        "baseline-nan": (["--kv-baseline", str(nan)], [
            str(nan), "devices['cpu | tiny | bfloat16']['dynamic'].counted_passes is nan", "above 0"]),
        # issue 49 item 5: a mistyped path exited 0 with "no baseline for ..." and never said the file was missing
        "baseline-mistyped": (["--kv-baseline", str(tmp / "kv-baseline.jsn")], [
            f"--kv-baseline {tmp / 'kv-baseline.jsn'}: no such file", "--kv-update-baseline to create it",
            "--kv-baseline none"]),
        "baseline-none-update": (["--kv-baseline", "none", "--kv-update-baseline"], [
            "--kv-update-baseline with --kv-baseline none: no file to write"]),
        "baseline-negative-intercept": (["--kv-baseline", str(negative)], [
            str(negative), "devices['cpu: x | tiny | bfloat16']['static'].timed_intercept_ms is -0.697", "at least 0"]),
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-inputs")
    cases = _cases(tmp)
    assert sorted(cases) == sorted(CASES)
    if torch.cuda.is_available():
        del cases["device-cuda"]
    missing = "none"
    jobs = {}
    for name, (args, _) in cases.items():
        isolate = [] if "--kv-baseline" in args else ["--kv-baseline", missing]  # never read a real baseline
        jobs[name] = ["--co", "-q", "--kv-model", "tiny", *isolate, *args]
    jobs["good"] = ["--co", "-q", "--kv-model", "tiny", "--kv-caches", "dynamic", "--kv-contexts", "512,1k",
                    "--kv-rounds", "1", "--kv-baseline", missing]
    with ThreadPoolExecutor(max_workers=len(COMMAND_LINES) + 1) as pool:
        batch = pool.submit(run_batch, jobs)
        real = {name: pool.submit(run_suite, *jobs[name]) for name in COMMAND_LINES}
        results = batch.result()
        results.update({f"{name} (command line)": future.result() for name, future in real.items()})
    return cases, results


@pytest.mark.parametrize("case", CASES + [f"{name} (command line)" for name in COMMAND_LINES])
def test_bad_input_is_one_line_usage_error(cases, case):
    specs, results = cases
    if case not in results:
        pytest.skip("this machine has a CUDA device")
    _, expected = specs[case.replace(" (command line)", "")]
    done = results[case]
    assert_one_line_usage_error(done, expected)


def test_good_input_collects(cases):
    done = cases[1]["good"]
    assert done.returncode == 0, describe(done)
    # one class: 1 counted test, copy bandwidth at start and end, 2 timed points, 2 ledger points, the drift
    assert "8 tests collected" in output(done), describe(done)
