"""kvcache.measuring.session: ``kv.environment.variables`` records the environment variables known to change what
runs (``identity.VARIABLES``) that are set, and nothing else from the environment."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvcache.analysing.records import (  # noqa: E402
    Environment,
    RunSettings,
    identity,  # noqa: E402
)
from kvcache.analysing.settings import Settings  # noqa: E402
from kvcache.measuring.devices import Device  # noqa: E402
from kvcache.measuring.session import KVSession  # noqa: E402


def environment() -> dict:
    return KVSession(Settings(model="tiny", threads=None), Device.from_choice("cpu")).environment()


def test_set_variables_are_recorded_and_join_the_identity(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/elsewhere")  # a cache directory: changes nothing computed
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # threads: already a field of their own
    env = environment()
    assert env["variables"] == {"TRANSFORMERS_SDPA_FORCE_GQA": "1"}
    ident = identity.of(Environment.from_json(env), RunSettings(model="tiny", dtype="bfloat16"))
    assert identity.baseline_key(ident, "counted") == "cpu | tiny | bfloat16 | env=TRANSFORMERS_SDPA_FORCE_GQA=1"


def test_none_set_none_recorded(monkeypatch):
    for name in identity.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert "variables" not in environment()
