"""kvcache.analysing.settings.parse_ints: the lists of contexts (--kv-contexts, --kv-counted-contexts, kvcache traffic
--contexts). An empty or repeated item is a one-line usage error naming the value and what is accepted."""

from __future__ import annotations

import pytest

from kvcache.analysing.settings import SettingsError, parse_ints


@pytest.mark.parametrize(("text", "expected"), [
    ("512,1024", (512, 1024)), ("512, 1024, 4k", (512, 1024, 4096)), ("1_024", (1024,)), ("2K", (2048,)),
])
def test_parse_ints(text, expected):
    assert parse_ints("--kv-contexts", text) == expected


@pytest.mark.parametrize(("text", "problem"), [
    ("512,,1024", "empty item"), ("512,", "empty item"), (",512", "empty item"), ("512, ,1024", "empty item"),
    (",", "empty item"), ("512,512", "512 is given twice"), ("1k,1024", "1024 is given twice"),
    ("512,1024,0.5k", "not a whole number"),
])
def test_empty_or_repeated_item_is_a_one_line_error(text, problem):
    with pytest.raises(SettingsError) as exc:
        parse_ints("--kv-contexts", text)
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"--kv-contexts {text!r}: ")
    assert problem in message
    assert "expected" in message and "512,1024,4k" in message


def test_blank_names_no_value():
    with pytest.raises(SettingsError, match="names no value"):
        parse_ints("--kv-contexts", " ")
