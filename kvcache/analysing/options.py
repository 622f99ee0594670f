"""The ``--kv-*`` options: one table (:class:`Option`), the one home of every default. From it come the pytest
options, the defaults of ``Settings`` and of the judge's ``Rules``, the rule options of ``kvcache compare`` and
docs/options.md (``python -m kvcache.analysing.options > docs/options.md``; ``tests/without_torch/test_options.py``
keeps them equal). Stdlib only."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    """One ``--kv-*`` option. ``default`` is the value as the command line gives it (None for a flag, which is off
    unless given); ``setting`` is the :class:`~kvcache.analysing.settings.Settings` field it sets, through the
    option's parser (:data:`kvcache.analysing.settings.PARSERS`: ``--kv-copy-mib`` sets ``copy_bytes`` in bytes,
    ``--kv-no-gate`` sets ``gate`` false; ``""`` when it sets none directly, as ``--kv-attn``); ``rule``: the judge
    reads it (:class:`~kvcache.analysing.judge.rules.Rules`), so ``kvcache compare`` takes it too, without the ``kv-``
    prefix;
    ``accepts`` says, in a few words, which values are accepted."""

    flag: str
    default: Any
    help: str
    setting: str = ""
    rule: bool = False
    accepts: str = ""

    @property
    def is_flag(self) -> bool:
        return self.default is None

    @property
    def dest(self) -> str:
        """The name pytest stores the value under (``--kv-min-r2`` -> ``kv_min_r2``)."""
        return self.flag[2:].replace("-", "_")

    @property
    def compare_flag(self) -> str:
        """The flag of a rule in ``kvcache compare`` (``--kv-min-r2`` -> ``--min-r2``)."""
        return "--" + self.flag[len("--kv-"):]


OPTIONS: tuple[Option, ...] = (
    Option("--kv-model", "smollm2-135m", "smollm2-135m (default), smollm2-135m-mha, tiny, a local directory with "
           "config.json, a hub id, or arch:<model_type> (any decoder-only causal-LM type of the installed release, "
           "built small: kvcache architectures --list)", "model"),
    Option("--kv-device", "auto", "auto (cuda, then mps, then cpu), cpu, cuda or mps", "device"),
    Option("--kv-dtype", "bfloat16", "bfloat16 (default), float16 or float32", "dtype"),
    Option("--kv-caches", "dynamic,static", "cache classes, comma-separated, or 'all'", "caches"),
    Option("--kv-attn", "sdpa", "attention implementations, comma-separated, crossed with the cache classes (default "
           "sdpa, the release default: records keyed by class name; others keyed <cache>@<attention>)"),
    Option("--kv-decoding", "greedy", "decoding strategies, comma-separated, crossed with the cache classes and "
           "attention implementations: greedy (default; records keyed by class), beam:N (N >= 2), "
           "assisted:self:K, assisted:MODEL:K, prompt-lookup:K or prompt-lookup:K:P (K >= 1; P the accepted share, "
           "a multiple of 1/K), chunked-prefill:C (C tokens a chunk, "
           "at most the smallest context); others keyed <cache>#<strategy> (docs/decoding.md)", "decoding"),
    Option("--kv-contexts", "1024,2048,4096,8192,16384", "context lengths in tokens", "contexts"),
    Option("--kv-counted-contexts", "256,512", "the two contexts counted traffic is taken at", "counted_contexts"),
    Option("--kv-fill", "synthetic", "synthetic (random K/V written into every layer) or prefill (a real forward; part "
           "of the run identity); a class that hooks the model is prefilled either way", "fill"),
    Option("--kv-warmup", 3, "untimed decode steps before the timed ones (default 3)", "warmup"),
    Option("--kv-steps", 12, "timed decode steps per point (default 12)", "steps"),
    Option("--kv-rounds", 3, "rounds over all points (default 3)", "rounds"),
    Option("--kv-order", "interleaved", "interleaved (default: seeded order per round) or ascending", "order"),
    Option("--kv-seed", 0, "seed for weights, fills and the interleaved order (default 0)", "seed"),
    Option("--kv-copy-mib", 1024, "size of the copy-bandwidth tensor in MiB (default 1024)", "copy_bytes"),
    Option("--kv-threads", "1", "torch CPU threads for the whole session, copy bandwidth included: a number (default "
           "1) or auto (torch's default); part of the timed run identity", "threads"),
    Option("--kv-compile", "off", "off (default), default, reduce-overhead or max-autotune: the decode forward under "
           "torch.compile in that mode", "compile"),
    Option("--kv-driver", "loop", "loop (default: the suite's own decode loop) or generate (the decode steps of a "
           "real model.generate() call); part of the run identity", "driver"),
    Option("--kv-gpus", "", "GPU classes whose SDPA backend is predicted from torch's own rules, comma-separated: "
           "t4, a10g, l4, a100, h100, b200 or sm75, sm80, sm86, sm89, sm90, sm100 (default none), under the "
           "installed torch release's rules, or another transcribed release's with @: t4@2.12 (2.5 to 2.14); "
           "their counted passes are judged per class", "gpus"),
    Option("--kv-batch", 1, "sequences per decode step (default 1); passes are per KV byte the whole batch holds",
           "batch"),
    Option("--kv-ragged", None, "with --kv-batch N: sequence lengths spread evenly over the context (left padding); "
           "passes per live KV byte (gated) and per allocated byte", "ragged"),
    Option("--kv-ledger-steps", 8, "profiled steps per (class, context) for the per-op timed ledger, after the timed "
           "rounds, as many plain steps between them (default 8; 0: no ledger)", "ledger_steps"),
    Option("--kv-remeasure", 0, "after the rounds, measure the N noisiest points once more (default 0)", "remeasure"),
    Option("--kv-remeasure-seconds", 120, "time bound of those re-measurements (default 120 s)", "remeasure_seconds"),
    Option("--kv-baseline", "kv-baseline.json", "baseline file of passes per device (default kv-baseline.json in the "
           "root directory; none: no baseline); a file given that does not exist is an error unless "
           "--kv-update-baseline creates it", "baseline"),
    Option("--kv-update-baseline", None, "write this run's passes into the baseline file", "update_baseline"),
    Option("--kv-no-gate", None, "report everything without failing the build", "gate"),
    Option("--kv-strict", None, "inconclusive timed verdicts (drift beyond --kv-max-drift included) fail the build "
           "too, and so does a skipped class the baseline holds figures for (kvcache compare --strict: the same)",
           "strict"),
    Option("--kv-tolerance", 0.10, "allowed relative rise of timed passes, intercept and ledger (default 0.10)",
           "tolerance", rule=True, accepts="a finite number, at least 0"),
    Option("--kv-counted-tolerance", 0.05, "allowed rise of counted passes (default 0.05)", "counted_tolerance",
           rule=True, accepts="a finite number, at least 0"),
    Option("--kv-memory-tolerance", 0.05, "allowed rise of counted memory: allocated, peak and held passes each "
           "(default 0.05)", "memory_tolerance", rule=True, accepts="a finite number, at least 0"),
    Option("--kv-ops-tolerance", 0.5, "allowed rise of ATen ops per step, per layer (default 0.5: +1 op in every "
           "layer fails)", "ops_tolerance", rule=True, accepts="a finite number, at least 0"),
    Option("--kv-weight-passes-tolerance", 0.05, "allowed rise of weight passes per step (default 0.05)",
           "weight_passes_tolerance", rule=True, accepts="a finite number, at least 0"),
    Option("--kv-ledger-tolerance", 0.5, "timed passes an op of the ledger may rise by besides --kv-tolerance "
           "(default 0.5; a new op is judged against it)", "ledger_tolerance", rule=True,
           accepts="a finite number, at least 0"),
    Option("--kv-min-r2", 0.90, "fits below this R² are inconclusive (default 0.90)", "min_r2", rule=True,
           accepts="a number from 0 to 1"),
    Option("--kv-max-drift", 0.10, "largest change of the re-measured first point before timed verdicts are "
           "inconclusive (the build fails on it only with --kv-strict)", "max_drift", rule=True,
           accepts="a finite number, at least 0"),
    Option("--kv-max-passes", "", "absolute bounds, e.g. dynamic=3.5,static=7", "max_passes"),
)

BY_FLAG: dict[str, Option] = {option.flag: option for option in OPTIONS}

#: The recommended timed configuration on a CPU: the options under which a CPU decode step comes closest to moving its
#: cache at copy speed (docs/results.md, "Where a CPU step is memory-bound": on the default model, 1 thread, float32
#: DynamicCache times 6.2 passes for 3.00 counted, bfloat16 38; 2 threads double the copy bandwidth, not the step).
#: ``make gate-power`` (both modes) and the A/B of the versions workflow run under it; the suite's own defaults stay
#: (bfloat16 is what users decode in, and counted figures do not depend on dtype or threads).
CPU_TIMED: tuple[str, ...] = ("--kv-dtype", "float32", "--kv-threads", "1")

#: The judge's tolerance-like rules, by their Settings (and Rules) field name, with their defaults.
RULE_DEFAULTS: dict[str, float] = {o.setting: o.default for o in OPTIONS if o.rule}

#: The bootstrap of every timed interval, which no option sets (a run records both in ``kv.settings``): the
#: intervals' confidence and the resamples drawn.
CONFIDENCE = 0.95
RESAMPLES = 2000
#: Counted passes: an op (or a fused kernel) below this is left out of a figure's ops, and a change of an op's passes
#: below it is not named (figures are shown to 2 decimals).
MIN_OP_PASSES = 0.005


def option(flag: str) -> Option:
    return BY_FLAG[flag]


def default(flag: str) -> Any:
    """The default of one option as the command line gives it."""
    return BY_FLAG[flag].default


def options_page() -> str:
    """The options page of the documentation (``docs/options.md``), generated from :data:`OPTIONS`."""
    lines = ["# Options", "", "Generated from `kvcache/analysing/options.py` (`python -m kvcache.analysing.options > "
             "docs/options.md`); a test keeps this page equal to the table. Every option is a pytest option of the "
             "suite; the rules (marked) are also options of `kvcache compare`, `comment`, `history` and `ab`, "
             "without the `kv-` prefix, where they replace each run's own recorded value.", "",
             "| option | default | what it sets |", "|---|---|---|"]
    for o in OPTIONS:
        shown = "(a flag)" if o.is_flag else f"`{o.default}`" if o.default != "" else "(none)"
        rule = f" Rule: also `{o.compare_flag}` of `kvcache compare`." if o.rule else ""
        text = o.help.replace("|", "\\|")
        lines.append(f"| `{o.flag}` | {shown} | {text}.{rule} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(options_page())
