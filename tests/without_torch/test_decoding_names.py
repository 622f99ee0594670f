"""``--kv-decoding``'s names (kvcache/analysing/decoding.py): the forms, their canonical text, the record keys
``<cache>[@<attention>]#<strategy>`` and the one-line errors, without torch."""

from __future__ import annotations

import pytest

from kvcache.analysing import decoding, options, settings
from kvcache.analysing.decoding import DecodingError, Strategy, parse_strategy


@pytest.mark.parametrize(("text", "parsed"), [
    ("greedy", Strategy("greedy")), ("beam:4", Strategy("beam", 4)), (" beam:2 ", Strategy("beam", 2)),
    ("assisted:self:3", Strategy("assisted", 3, "self")),
    ("assisted:qwen3-0.6b:5", Strategy("assisted", 5, "qwen3-0.6b")),
    ("assisted:./my:model:2", Strategy("assisted", 2, "./my:model")),
    ("prompt-lookup:10", Strategy("prompt-lookup", 10)),
    ("chunked-prefill:256", Strategy("chunked-prefill", 256)),
])
def test_every_form_parses_to_its_canonical_name(text, parsed):
    assert parse_strategy(text) == parsed
    assert parse_strategy(parsed.name) == parsed


@pytest.mark.parametrize(("text", "words"), [
    ("sampling", "unknown strategy"), ("beam:1", "beams 1 is below 2"), ("beam:x", "'x' is not a whole number"),
    ("beam", "unknown strategy"), ("prompt-lookup:0", "below 1"), ("assisted:self:0", "below 1"),
    ("assisted:3", "needs a draft"), ("chunked-prefill:0", "below 1"), ("greedy:2", "unknown strategy"),
])
def test_bad_forms_are_one_line_errors_naming_the_value_and_the_forms(text, words):
    with pytest.raises(DecodingError) as caught:
        parse_strategy(text)
    message = str(caught.value)
    assert "\n" not in message and repr(text.strip()) in message and words in message and "beam:N" in message


def test_a_chunk_larger_than_the_smallest_context_is_an_error():
    assert parse_strategy("chunked-prefill:256", (256, 512)).number == 256
    with pytest.raises(DecodingError, match="larger than the context 256"):
        parse_strategy("chunked-prefill:257", (256, 512, 1024))
    with pytest.raises(settings.SettingsError, match="chunk 300"):
        settings.check_decoding(("greedy", "chunked-prefill:300"), (256, 512))


def test_the_option_parses_into_canonical_names_once_each():
    assert settings.Settings().decoding == ("greedy",) == (options.default("--kv-decoding"),)
    assert settings.PARSERS["--kv-decoding"]("--kv-decoding", "greedy, beam:4,beam:4") == ("greedy", "beam:4")
    with pytest.raises(settings.SettingsError):
        settings.PARSERS["--kv-decoding"]("--kv-decoding", ",")


def test_keys_cross_split_and_keep_greedy_plain():
    keys = decoding.cross_strategies(["dynamic", "static@eager", "inplace#beam:2"], ["greedy", "beam:4"])
    assert keys == ["dynamic", "dynamic#beam:4", "static@eager", "static@eager#beam:4", "inplace#beam:2"]
    assert decoding.split_strategy("static@eager#beam:4") == ("static@eager", "beam:4")
    assert decoding.split_strategy("dynamic") == ("dynamic", "greedy")
    assert decoding.strategy_of("x#assisted:self:3") == Strategy("assisted", 3, "self")
    assert decoding.strategy_key("dynamic", "greedy") == "dynamic"


@pytest.mark.parametrize("text, name, accepted", [
    ("prompt-lookup:4", "prompt-lookup:4", 4), ("prompt-lookup:4:1", "prompt-lookup:4", 4),
    ("prompt-lookup:4:0.5", "prompt-lookup:4:0.5", 2), ("prompt-lookup:4:50%", "prompt-lookup:4:0.5", 2),
    ("prompt-lookup:4:0", "prompt-lookup:4:0", 0), ("prompt-lookup:3:0.333333", "prompt-lookup:3:0.333333", 1),
])
def test_prompt_lookup_takes_an_accepted_share(text, name, accepted):
    strategy = parse_strategy(text)
    assert (strategy.name, strategy.accepted) == (name, accepted)
    assert parse_strategy(strategy.name) == strategy  # the key's suffix reads back as the same strategy


@pytest.mark.parametrize("text, words", [
    ("prompt-lookup:4:0.3", ["'prompt-lookup:4:0.3'", "0.3", "0, 0.25, 0.5, 0.75, 1"]),
    ("prompt-lookup:4:x", ["'x' is not a number", "0, 0.25, 0.5, 0.75, 1"]),
    ("prompt-lookup:4:2", ["'2'", "prompt-lookup:K:P"]),
    ("prompt-lookup:4:-0.25", ["'-0.25'"]),
    ("prompt-lookup:4:nan", ["'nan'"]),
])
def test_a_bad_share_is_one_line_naming_it_and_the_shares_k_allows(text, words):
    with pytest.raises(DecodingError) as caught:
        parse_strategy(text)
    message = str(caught.value)
    assert "\n" not in message and all(word in message for word in words), message
