"""On a CUDA device: the SDPA backend torch selects for every call of a counted step against the one
:mod:`kvcache.analysing.sdpa.selection` predicts for the device's compute capability, and the counted math passes there
against the same count on the CPU (``scripts/gpu-check``). Exit 1 on any mismatch.

torch's own selection is ``torch._fused_sdp_choice`` (the function ``scaled_dot_product_attention`` dispatches by) on
the call's real tensors; the comparison (:func:`compare_calls`) takes any selection function, so that its logic is
tested on a CPU with a fake one."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kvcache.analysing.sdpa import selection as sdpa_rules
from kvcache.measuring.counting import backends

#: ``torch.nn.attention.SDPBackend`` values (``_fused_sdp_choice``'s answer) by this package's names
CHOICE_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable", -1: "error"}


def torch_choice(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
                 dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> str:
    """The backend torch itself selects for these tensors on their device (``torch._fused_sdp_choice``)."""
    choice = torch._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                     enable_gqa=enable_gqa)
    return CHOICE_NAMES.get(int(choice), str(choice))


@dataclass
class CallCheck:
    """One SDPA call: what the rules predict and what torch selected."""

    cache: str
    index: int
    call: sdpa_rules.SdpaCall
    predicted: str
    selected: str
    rejected: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.predicted == self.selected


@dataclass
class Observer:
    """Replaces ``torch.nn.functional.scaled_dot_product_attention`` while active: each call's facts, the backend
    ``choose`` says torch selects on the real tensors, then the call itself, unchanged."""

    choose: Callable[..., str]
    calls: list[sdpa_rules.SdpaCall] = field(default_factory=list)
    selected: list[str] = field(default_factory=list)

    def active(self) -> Any:
        return backends.replacing_sdpa(self._run)

    def _run(self, original: Callable, query: Any, key: Any, value: Any, attn_mask: Any = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
        self.calls.append(backends.call_facts(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa))
        self.selected.append(self.choose(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa))
        return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def compare_calls(cache: str, observer: Observer, capability: tuple[int, int],
                  wheel: sdpa_rules.Wheel = sdpa_rules.WHEEL) -> list[CallCheck]:
    """Every observed call of ``cache``: the backend the rules predict on ``capability`` against torch's choice."""
    out = []
    for index, (call, selected) in enumerate(zip(observer.calls, observer.selected)):
        predicted = sdpa_rules.select_on(call, capability, wheel)
        out.append(CallCheck(cache, index, call, predicted.backend, selected, predicted.rejected))
    return out


def math_mismatch(device_passes: float | None, cpu_passes: float | None, tolerance: float = 1e-6) -> str | None:
    """Why the math passes counted on the device differ from the CPU's (relative ``tolerance``), or None."""
    if device_passes is None or cpu_passes is None or not math.isfinite(device_passes):
        return f"math passes not counted on both devices (device {device_passes}, cpu {cpu_passes})"
    if abs(device_passes - cpu_passes) > tolerance * max(1.0, abs(cpu_passes)):
        return f"math passes {device_passes:.4f} on the device against {cpu_passes:.4f} counted on the CPU"
    return None


def mismatch_table(checks: list[CallCheck],
                   math_rows: dict[str, tuple[float | None, float | None]]) -> tuple[list[str], int]:
    """The printed table (calls grouped by cache and outcome) and the number of mismatches."""
    lines, mismatches = [], 0
    groups: dict[tuple[str, str, str], int] = {}
    for check in checks:
        groups[(check.cache, check.predicted, check.selected)] = groups.get(
            (check.cache, check.predicted, check.selected), 0) + 1
    lines.append(f"{'cache':<16} {'calls':>5}  {'predicted':<10} {'torch selected':<14} result")
    for (cache, predicted, selected), n in groups.items():
        ok = predicted == selected
        mismatches += 0 if ok else n
        lines.append(f"{cache:<16} {n:>5}  {predicted:<10} {selected:<14} {'ok' if ok else 'MISMATCH'}")
    for cache, (device, cpu) in math_rows.items():
        why = math_mismatch(device, cpu)
        mismatches += 1 if why else 0
        shown = "—" if device is None else f"{device:.4f}"
        lines.append(f"{cache:<16} math passes: device {shown}, cpu {cpu if cpu is None else f'{cpu:.4f}'}: "
                     f"{'ok' if not why else 'MISMATCH: ' + why}")
    return lines, mismatches


def efficient_gqa_probe(device: str = "cuda", can_use: Callable[[Any], bool] | None = None) -> tuple[str, int]:
    """Whether torch's memory-efficient backend takes grouped-query heads under ``enable_gqa`` on ``device``
    (``can_use``, by default ``torch.backends.cuda.can_use_efficient_attention``, asked about a float16 decode call:
    9 query heads on 3 K/V heads, 16 keys) against the rules of the installed torch release
    (``Rules.efficient_gqa``: pytorch PR #191085, from 2.14 by the evidence of docs/gpu-backends.md). Any CUDA device
    from sm50 answers it; the line and 1 on a mismatch."""
    if can_use is None:
        def can_use(params: Any) -> bool:
            return bool(torch.backends.cuda.can_use_efficient_attention(params, False))
    query = torch.zeros(1, 9, 1, 64, dtype=torch.float16, device=device)
    kv = torch.zeros(1, 3, 16, 64, dtype=torch.float16, device=device)
    took = bool(can_use(torch.backends.cuda.SDPAParams(query, kv, kv, None, 0.0, False, True)))
    release = sdpa_rules.installed_release()
    expected = sdpa_rules.RULES[release].efficient_gqa
    words = {True: "yes", False: "no"}
    return (f"memory-efficient takes enable_gqa (9 query heads on 3 K/V heads, float16): torch {words[took]}, the "
            f"rules of torch {release} {words[expected]}: {'ok' if took == expected else 'MISMATCH'}",
            int(took != expected))


def check_backends(model: str, caches: list[str], dtype: str = "bfloat16", context: int = 512,
          choose: Callable[..., str] = torch_choice, device: str = "cuda",
          capability: tuple[int, int] | None = None) -> tuple[list[str], int]:
    """Run the check on ``device``: every SDPA call of one step of each class at ``context`` tokens observed
    (torch's choice against the rules' prediction on the device's capability), and each class's counted math passes
    on the device against the CPU's; returns the table's lines and the mismatches."""
    from kvcache.analysing.settings import Settings
    from kvcache.measuring.devices import Device
    from kvcache.measuring.session import KVSession

    if capability is None:
        capability = tuple(torch.cuda.get_device_capability()) if device == "cuda" else (8, 0)
    sessions = {where: KVSession(Settings(model=model, device=where, dtype=dtype, warmup=1),
                                 Device.from_choice(where)) for where in dict.fromkeys([device, "cpu"])}
    checks: list[CallCheck] = []
    math_rows: dict[str, tuple[float | None, float | None]] = {}
    for cache in caches:
        dp = sessions[device].open(cache, context, warmup=1, steps=1)
        observer = Observer(choose)
        try:
            with observer.active():
                dp.step()
        finally:
            dp.release()
        checks += compare_calls(cache, observer, capability)
        if observer.calls:
            math = {where: (s.count(cache).backends or {}).get("math") for where, s in sessions.items()}
            passes = {where: count.passes if count is not None else None for where, count in math.items()}
            math_rows[cache] = (passes[device], passes["cpu"])
    lines, mismatches = mismatch_table(checks, math_rows)
    if device == "cuda":  # the rule the releases differ by, asked directly (a T4 is not needed)
        line, wrong = efficient_gqa_probe(device)
        lines.append(line)
        mismatches += wrong
    return [f"SDPA backends on sm{capability[0]}{capability[1]} ({device}): torch's choice against "
            "kvcache.analysing.sdpa.selection", *lines], mismatches


def main(argv: list[str] | None = None) -> int:
    """``python -m kvcache.measuring.counting.backend_check MODEL CACHES [DTYPE]``: print the table; 1 on any mismatch,
    2 when
    no CUDA device is visible."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        print("backend check: no CUDA device visible to torch " + torch.__version__)
        return 2
    model = args[0] if args else "smollm2-135m"
    caches = (args[1] if len(args) > 1 else "dynamic,static").split(",")
    dtype = args[2] if len(args) > 2 else "bfloat16"
    lines, mismatches = check_backends(model, caches, dtype)
    print("\n".join(lines))
    print(f"backend check: {mismatches} mismatch(es)")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
