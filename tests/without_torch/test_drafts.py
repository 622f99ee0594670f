"""kvcache.analysing.drafts: the vocabulary of a draft, from the presets and a directory's config.json, without
torch; a draft with another vocabulary or one the suite cannot load is a one-line DraftError."""

from __future__ import annotations

import json

import pytest

from kvcache.analysing.drafts import DraftError, check_drafts, vocab_of


def test_vocabularies_come_from_presets_and_directories(tmp_path):
    assert vocab_of("tiny") == vocab_of("tiny@layers=1") == 2048
    assert vocab_of("smollm2-135m") == 49152
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 7}}))
    assert vocab_of(str(tmp_path)) == 7
    assert vocab_of("owner/some-model") is None  # a hub id: not known without the hub


def test_drafts_are_checked_against_the_model():
    check_drafts("tiny", ["greedy", "beam:2", "assisted:self:4", "assisted:tiny@layers=1:4", "prompt-lookup:3"])
    check_drafts("tiny", ["assisted:owner/some-model:4"])  # unknown here: left to the run, which skips it
    with pytest.raises(DraftError) as info:
        check_drafts("tiny", ["assisted:smollm2-135m:4"])
    assert "\n" not in str(info.value) and "49152" in str(info.value) and "2048" in str(info.value)
    with pytest.raises(DraftError, match="not a preset"):
        check_drafts("tiny", ["assisted:nosuch:4"])
