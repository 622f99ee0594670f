"""kvcache.analysing.records.identity: environment variables known to change what runs (``identity.VARIABLES``) join the
run identity as the extra field ``env``; default runs keep their keys, and nothing else from the environment
(cache directories, thread variables) gets in."""

from __future__ import annotations

from kvcache.analysing.judge.measure_table import GROUPS
from kvcache.analysing.records import Environment, RunSettings, identity

ENV = {"device_name": "cpu: AMD EPYC (2 threads)", "device_type": "cpu", "threads": 2, "torch": "2.13.0+cpu"}
SETTINGS = {"model": "tiny", "dtype": "bfloat16", "compile": "default"}


def run(variables=None) -> dict:
    env = dict(ENV, **({"variables": variables} if variables is not None else {}))
    return {"env": Environment.from_json(env), "settings": RunSettings.from_json(SETTINGS)}


def test_an_allowlisted_variable_joins_the_identity_and_every_key():
    ident = identity.of(**run({"TRANSFORMERS_SDPA_FORCE_GQA": "1"}))
    assert ident.env == "TRANSFORMERS_SDPA_FORCE_GQA=1"
    assert identity.baseline_key(ident, "counted") == \
        "cpu | tiny | bfloat16 | compile=default | env=TRANSFORMERS_SDPA_FORCE_GQA=1"
    assert identity.baseline_key(ident, "timed").endswith("| env=TRANSFORMERS_SDPA_FORCE_GQA=1")
    assert "env TRANSFORMERS_SDPA_FORCE_GQA=1" in identity.describe(ident)


def test_default_runs_keep_their_keys():
    plain = identity.of(**run())
    assert "env" not in plain.to_json()
    assert identity.baseline_key(plain, "counted") == "cpu | tiny | bfloat16 | compile=default"
    for variables in ({}, {"TRANSFORMERS_SDPA_FORCE_GQA": "0"},  # at its default: changes nothing
                      {"TORCHINDUCTOR_CACHE_DIR": "/tmp/x", "OMP_NUM_THREADS": "1", "HF_HOME": "/h"}):  # not listed
        ident = identity.of(**run(variables))
        assert "env" not in ident.to_json(), variables
        assert {m: identity.baseline_key(ident, m) for m in GROUPS} == \
            {m: identity.baseline_key(plain, m) for m in GROUPS}


def test_runs_that_differ_in_it_are_told_apart():
    runs = [identity.of(**run()), identity.of(**run({"TRANSFORMERS_SDPA_FORCE_GQA": "1"}))]
    assert identity.mismatches(runs, ["counted"]) == {"env": ["", "TRANSFORMERS_SDPA_FORCE_GQA=1"]}


def test_what_the_measuring_side_records():
    environ = {"TRANSFORMERS_SDPA_FORCE_GQA": "1", "TORCHINDUCTOR_CACHE_DIR": "/tmp/x", "OMP_NUM_THREADS": "4"}
    assert identity.variables_of(environ) == {"TRANSFORMERS_SDPA_FORCE_GQA": "1"}
    assert identity.variables_of({}) == {}
    assert identity.env_field({"TRANSFORMERS_SDPA_FORCE_GQA": "1", "OTHER": "x"}) == "TRANSFORMERS_SDPA_FORCE_GQA=1"
    assert identity.env_field(None) == identity.env_field("garbage") == ""
