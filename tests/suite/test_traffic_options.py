"""``kvcache traffic --warmup``: the decode steps before the counted one, 0 to what the counted traffic takes (2);
anything else is a one-line usage error (exit 2) before anything is imported or built, not a value silently
used as 0 or capped."""

from __future__ import annotations

import json

import pytest

from kvcache.commands import traffic as traffic_cli


@pytest.mark.parametrize("value, says", [("-5", "--warmup -5 is out of range"), ("3", "--warmup 3 is out of range"),
                                         ("100", "--warmup 100 is out of range"),
                                         ("two", "--warmup 'two' is not a whole number")])
def test_warmup_out_of_range_is_a_usage_error(capsys, value, says):
    assert traffic_cli.main(["--model", "tiny", "--device", "cpu", "--warmup", value]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"kvcache traffic: {says}"), err
    assert "accepted: 0, 1, 2" in err, err
    assert captured.out == ""  # nothing counted


def test_warmup_choices_are_what_the_counted_traffic_takes():
    from kvcache.measuring.counting.class_count import COUNT_WARMUP

    assert traffic_cli.WARMUP_CHOICES == tuple(range(COUNT_WARMUP + 1))


def test_warmup_is_honoured(capsys, monkeypatch):
    """The value given reaches the counted step: ``count_step`` is asked for that many warm-up steps."""
    from kvcache.measuring import decode

    asked: list[int] = []
    real = decode.DecodePoint.count_step

    def spy(self, warmup=0, scopes=None):
        asked.append(warmup)
        return real(self, warmup, scopes)

    monkeypatch.setattr(decode.DecodePoint, "count_step", spy)
    assert traffic_cli.main(["--model", "tiny", "--device", "cpu", "--cache", "dynamic", "--warmup", "1",
                             "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dynamic"]["traffic"]["passes"] > 0
    assert asked and set(asked) == {1}, asked


def test_unknown_gpu_class_is_a_usage_error_and_known_ones_print_their_lines(capsys):
    assert traffic_cli.main(["--model", "tiny", "--device", "cpu", "--gpus", "t4,v100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("kvcache traffic: --gpus: unknown GPU class 'v100'; known: t4, a10g, l4, a100, h100, b200, sm75, "
                   "sm80, sm86, sm89, sm90, sm100")
    assert traffic_cli.main(["--model", "tiny", "--device", "cpu", "--gpus", "t4@2.4"]) == 2
    assert capsys.readouterr().err.strip() == (
        "kvcache traffic: --gpus: no SDPA rules transcribed for torch '2.4' (t4@2.4); transcribed: 2.5, 2.6, 2.7, "
        "2.8, 2.9, 2.10, 2.11, 2.12, 2.13, 2.14")
    assert traffic_cli.main(["--model", "tiny", "--device", "cpu", "--cache", "dynamic", "--gpus",
                             "t4@2.13,t4@2.14,a100@2.13"]) == 0
    out = capsys.readouterr().out
    assert "backends dynamic: cudnn 3.00 · flash 3.00 · efficient 3.00 · math 25.26" in out
    # bf16 on a T4 is math under both releases' rules; torch checks the heads before the dtype, so 2.13's efficient
    # backend (no grouped-query heads) gives the heads as its reason and 2.14's the dtype
    assert "gpus dynamic: t4@2.13 25.26 (math: flash needs sm80 or newer; efficient needs as many K/V heads as query " \
           "heads) · t4@2.14 25.26 (math: flash needs sm80 or newer; efficient takes float16, float32) · a100@2.13 " \
           "3.00 (flash)" in out


def test_every_class_skipped_is_nothing_measured(capsys):
    """``--cache offloaded`` on a CPU: its skip and reason printed, exit 3 (not measured), never a success."""
    assert traffic_cli.main(["--model", "tiny", "--device", "cpu", "--cache", "offloaded"]) == 3
    captured = capsys.readouterr()
    assert "offloaded: skipped: offloaded runs on cuda only, not cpu" in captured.out
    assert captured.err == ("kvcache traffic: nothing measured, every class was skipped (offloaded: offloaded runs "
                            "on cuda only, not cpu)\n")
    assert traffic_cli.main(["--model", "tiny", "--device", "cpu", "--cache", "offloaded", "--json"]) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"offloaded": {"skipped": "offloaded runs on cuda only, not cpu"}}
    assert traffic_cli.main(["--model", "tiny", "--device", "cpu", "--cache", "offloaded,dynamic", "--json"]) == 0
