"""scripts/gpu-check's comparison of torch's SDPA backend choice with the transcribed rules
(``kvcache.measuring.counting.backend_check``), exercised on a CPU with a fake selection in place of torch's
``_fused_sdp_choice`` (the real one needs a CUDA device)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.analysing.sdpa import selection as sdpa_rules  # noqa: E402
from kvcache.measuring.counting import backend_check, backends  # noqa: E402


def as_rules_say(capability):
    """A fake torch that selects what the rules predict on ``capability``."""
    def choose(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        call = backends.call_facts(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        return sdpa_rules.select_on(call, capability).backend
    return choose


def test_agreeing_selection_passes_and_a_different_one_is_a_mismatch(one_torch_thread):
    lines, mismatches = backend_check.check_backends("tiny", ["dynamic", "static"], device="cpu", capability=(8, 0),
                                            choose=as_rules_say((8, 0)))
    assert mismatches == 0, lines
    assert any(line.startswith("dynamic") and "flash" in line and line.endswith("ok") for line in lines)
    assert any(line.startswith("static") and "efficient" in line for line in lines)
    assert any("math passes: device 25.2578, cpu 25.2578: ok" in line for line in lines)
    lines, mismatches = backend_check.check_backends("tiny", ["dynamic"], device="cpu", capability=(8, 0),
                                            choose=lambda *args, **kwargs: "math")
    assert mismatches == 2  # both layers' calls
    assert any("flash" in line and "MISMATCH" in line for line in lines)


def test_math_passes_must_agree():
    assert backend_check.math_mismatch(25.2578, 25.2578) is None
    assert "against 25.2578 counted on the CPU" in backend_check.math_mismatch(25.3, 25.2578)
    assert "not counted" in backend_check.math_mismatch(None, 25.2578)


def test_torch_choice_names_the_cpu_kernel():
    q, k = torch.randn(1, 9, 1, 64), torch.randn(1, 3, 16, 64)
    assert backend_check.torch_choice(q, k, k, enable_gqa=True) in ("flash", "math")


def test_no_cuda_device_exits_2(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert backend_check.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_the_efficient_gqa_rule_is_asked_directly(monkeypatch):
    """torch's own answer on the device against the installed release's rule (pytorch PR #191085): a CUDA torch 2.13
    that takes grouped-query heads in the memory-efficient backend is a mismatch (2.13's rules say no)."""
    monkeypatch.setattr(sdpa_rules, "installed_release", lambda: "2.13")
    line, wrong = backend_check.efficient_gqa_probe("cpu", can_use=lambda params: False)
    assert wrong == 0 and line.endswith("torch no, the rules of torch 2.13 no: ok"), line
    line, wrong = backend_check.efficient_gqa_probe("cpu", can_use=lambda params: True)
    assert wrong == 1 and line.endswith("torch yes, the rules of torch 2.13 no: MISMATCH"), line
    monkeypatch.setattr(sdpa_rules, "installed_release", lambda: "2.14")
    assert backend_check.efficient_gqa_probe("cpu", can_use=lambda params: True)[1] == 0
