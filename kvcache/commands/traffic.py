"""``kvcache traffic --cache dynamic --model tiny``: counted passes, the per-op breakdown and the attention
probe of one decode step per cache class, without running the timed sweep.

Printed first: the model, dtype and device, with the Transformers and torch versions the counts hold for.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from kvcache import cli, exits
from kvcache.analysing.counted_notes import counted_notes
from kvcache.analysing.records import Probe, Traffic
from kvcache.analysing.settings import SettingsError, parse_ints
from kvcache.analysing.summary import attention_copies
from kvcache.analysing.tables import by_op
from kvcache.cli import description

#: ``--warmup`` values: the counted traffic takes at most this many decode steps before the counted one
#: (kvcache.measuring.counting.class_count.COUNT_WARMUP), so each value is honoured exactly.
WARMUP_CHOICES = (0, 1, 2)


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="kvcache traffic", description=description(__doc__))
    made.add_argument("--cache", default="dynamic", help="cache classes, comma-separated, or all")
    made.add_argument("--model", default="smollm2-135m",
                      help="a preset (smollm2-135m, tiny, gemma3-270m, ...; PRESET@layers=N), or a dir")
    made.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    made.add_argument("--dtype", default="bfloat16", help="bfloat16, float16 or float32")
    made.add_argument("--contexts", default="256,512", help="the two contexts to count at")
    made.add_argument("--warmup", default=str(WARMUP_CHOICES[-1]),
                      help=f"decode steps before the counted one: {', '.join(map(str, WARMUP_CHOICES))} "
                           f"(default {WARMUP_CHOICES[-1]}: the counted bytes do not change after)")
    made.add_argument("--gpus", default="", help="GPU classes whose SDPA backend is predicted (--kv-gpus: t4, a100, "
                      "h100, sm80, ...; t4@2.12: under torch 2.12's rules)")
    made.add_argument("--json", action="store_true", help="print the traffic and probe as JSON")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(parser, work, argv, errors=(SettingsError,))


def work(args: argparse.Namespace) -> int:
    """Each class counted and printed (or the JSON of them all)."""
    warmup = parse_warmup(args.warmup)  # before torch is imported: a bad value answers at once

    from kvcache.analysing import presets
    from kvcache.analysing.settings import PARSERS, Settings

    try:
        from kvcache.measuring import caches, configs, geometry, preflight
        from kvcache.measuring.devices import Device, DeviceError
        from kvcache.measuring.session import KVSession, Skipped
    except ModuleNotFoundError as exc:
        if exc.name not in MEASURING_NEEDS:
            raise
        raise cli.UsageError(missing_package(exc.name)) from None

    try:
        gpus = PARSERS["--kv-gpus"]("--kv-gpus", args.gpus)
        names = caches.parse_caches(args.cache)
        contexts = parse_ints("--contexts", args.contexts)
        if len(contexts) != 2:
            raise SettingsError(f"--contexts {args.contexts!r}: give two different contexts")
        geometry.torch_dtype(args.dtype)
        configs.load_config(args.model)
        device = Device.from_choice(args.device)
        settings = Settings(model=args.model, device=args.device, dtype=args.dtype, caches=tuple(names),
                            contexts=tuple(sorted(contexts)), counted_contexts=tuple(sorted(contexts)), warmup=warmup,
                            gpus=gpus)
        preflight.check_model_memory(settings)  # the weights and the smallest point fit, before anything is built
    except (caches.CacheError, SettingsError, DeviceError, presets.ModelError) as exc:
        message = str(exc)
        message = message.replace("--kv-gpus", "--gpus")
        for option in ("caches", "model", "dtype", "device"):
            message = message.replace(f"--kv-{option}", f"--{option.rstrip('s')}")
        cli.say(f"kvcache traffic: {message}", err=True)
        return exits.USAGE_ERROR
    session = KVSession(settings, device)
    if not args.json:
        cli.say(header(session))
    out = {}
    for name in names:
        try:
            result = session.count(name)
        except Skipped as exc:
            out[name] = {"skipped": str(exc)}
            if not args.json:
                cli.say(f"{name}: skipped: {exc}")
            continue
        probe = session.probes.get(name)
        out[name] = {"traffic": result.to_json(), "probe": None if probe is None else probe.to_json()}
        if name in session.memories:
            out[name]["memory"] = session.memories[name].to_json()
        if not args.json:
            print_one(name, result, probe)
            if name in session.memories:
                memory = session.memories[name]
                cli.say(f"  memory per KV byte: allocated {memory.allocated_passes:.3f}, peak "
                      f"{memory.peak_passes:.3f}, held {memory.held_passes:.3f}; peak needs "
                      f"{memory.peak_factor:.2f} cache sizes (declares {memory.declared_factor}"
                      f"{attention_copies(memory)})" + (f"; {memory.factor_problem}" if memory.factor_problem else ""))
    if args.json:
        print(json.dumps(out, indent=2))  # JSON writes every control character as a \u escape
    return exit_status(out)


def exit_status(out: dict[str, dict[str, Any]]) -> int:
    """PASS when at least one class was counted; NOT_MEASURED when every class was skipped (a run that counted
    nothing is no success), each skip and its reason said on stderr, one line."""
    if any("skipped" not in entry for entry in out.values()):
        return exits.PASS
    skips = "; ".join(f"{name}: {entry['skipped']}" for name, entry in out.items())
    cli.say(f"kvcache traffic: nothing measured, every class was skipped ({skips})", err=True)
    return exits.NOT_MEASURED


#: What counting a step imports that the package's own dependencies (numpy) do not bring: the ``bench`` extra.
MEASURING_NEEDS = ("torch", "transformers")


def missing_package(name: str) -> str:
    """The one line for a measuring package that is not installed: what is missing and how to install it."""
    return (f"{name} is not installed, and counting a decode step needs it (the bench extra): pip install torch "
            "transformers (pick your torch build first), or in a checkout pip install -e '.[bench]'")


def parse_warmup(text: str) -> int:
    """``--warmup``: decode steps before the counted one, one of :data:`WARMUP_CHOICES`; anything else (a negative
    number, more than the counted traffic takes, not a whole number) is a one-line SettingsError."""
    accepted = f"accepted: {', '.join(map(str, WARMUP_CHOICES))} (decode steps before the counted one; " \
               f"the counted bytes do not change after {WARMUP_CHOICES[-1]})"
    try:
        value = int(str(text).strip())
    except ValueError:
        raise SettingsError(f"--warmup {text!r} is not a whole number; {accepted}") from None
    if value not in WARMUP_CHOICES:
        raise SettingsError(f"--warmup {value} is out of range; {accepted}")
    return value


def header(session: Any) -> str:
    """What the counts hold for: model and its KV bytes per token, dtype, device, library versions."""
    spec, machine = session.spec(), session.machine()
    return (f"model {session.settings.model} ({spec.layers} layers, {spec.kv_heads} KV heads, head_dim "
            f"{spec.head_dim}: {spec.bytes_per_token:,} KV bytes per token), dtype {spec.dtype}, device "
            f"{machine['device_name']}; transformers {machine['transformers']}, torch {machine['torch']}")


def print_one(name: str, traffic: Traffic, probe: Probe | None) -> None:
    """One class: counted passes per step, by op, the bytes of one step, what attention received, passes per kind."""
    assert traffic.contexts and traffic.step_bytes, "a count has its contexts and step bytes"
    lo, hi = traffic.contexts
    step = traffic.step_bytes[str(hi)]
    passes = "no" if traffic.passes is None else f"{traffic.passes:.3f}"
    cli.say(f"{name}: {passes} counted passes per step (bytes read + written per KV byte, "
          f"slope between {lo} and {hi} tokens)")
    cli.say(f"  by op: {by_op(traffic.by_op)}")
    for line in counted_notes(name, traffic):  # no passes (why), amortised over a period, host syncs
        cli.say(f"  {line.removeprefix(f'counted {name}: ')}")
    cli.say(f"  one step at {hi} tokens: {step['read']:,} B read, {step['written']:,} B written")
    if probe is not None:
        cli.say(f"  attention: query {probe.query} key {probe.key} mask {probe.mask}; {probe.attention}; K/V "
              f"expansions {probe.expansions} over {probe.calls} calls")
    for line in kind_lines(traffic):
        cli.say(f"  {line}")
    for line in backend_lines_of(name, traffic):
        cli.say(f"  {line}")


def backend_lines_of(name: str, traffic: Traffic) -> list[str]:
    """The summary's ``backends``/``gpus`` lines of one class (:func:`kvcache.analysing.summary.backend_lines`)."""
    from kvcache.analysing.records import KV
    from kvcache.analysing.summary import backend_lines

    return backend_lines(KV(traffic={name: traffic}))


def kind_lines(traffic: Traffic) -> list[str]:
    """Passes per layer kind, where each kind stops growing, and passes per byte stored where storage differs."""
    lines = []
    passes, stored = traffic.passes, traffic.stored_passes
    if stored is not None and passes and abs(stored / passes - 1) > 0.01:
        lines.append(f"per byte stored: {stored:.3f} passes (the cache stores {stored / passes:.2f}x less than "
                     f"the logical bytes it holds)" if stored > passes else
                     f"per byte stored: {stored:.3f} passes")
    for kind, entry in (traffic.kinds or {}).items():
        head = f"{kind} ({entry.layers} layers{', window ' + str(entry.window) if entry.window else ''})"
        if entry.passes is not None:
            lines.append(f"{head}: {entry.passes:.3f} passes ({by_op(entry.by_op)})")
        else:
            lines.append(f"{head}: does not grow (state of fixed size): its step bytes changed by "
                         f"{entry.growth_bytes:,} B between {' and '.join(entry.step_bytes or {})} tokens")
        far = entry.beyond
        if far and far.contexts and entry.window:
            a, b = far.contexts
            verdict = "stops growing past its window" if far.growth_bytes == 0 else "STILL GROWS past its window"
            lines.append(f"  {verdict}: {far.growth_bytes:,} B more per step at {b} than at {a} tokens "
                         f"({(far.step_bytes or {})[str(b)]:,} B per step)")
        elif far and far.contexts and kind == "full":
            a, b = far.contexts
            lines.append(f"  past the window keeps growing: {far.growth_bytes:,} B more per step at {b} than "
                         f"at {a} tokens")
    return lines
