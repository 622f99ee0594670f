# Two commands do everything on a fresh machine:
#   make bench   creates .venv, installs, runs the default sweep into results.json and writes report/
#   make test    creates .venv, installs with the test extra, runs ruff, the tests and the counted gate
# TORCH picks the torch build (a CUDA box may want TORCH=torch); BENCH_ARGS adds pytest/--kv-* options.
# TRANSFORMERS pins a release the tests' known figures are for (tests/measuring/test_compat.py reports a release it has
# no figures for as "not yet measured", a skip), so that `make test` checks known figures; a new release is measured
# (docs/releases.md, "A new release"), its figures added, then the pin moves.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
TRANSFORMERS ?= transformers==5.25.0
BENCH_ARGS ?=
VERSIONS_ARGS ?=
ARCHITECTURES_ARGS ?=
GATE_POWER_ARGS ?=
# make test runs the test files on this many pytest-xdist workers, a file per worker (its module fixtures run once);
# 0: in one process (about twice as long on 2 cores); auto: one per CPU.
TEST_WORKERS ?= 2

$(VENV)/.bench: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q "$(TRANSFORMERS)"
	$(PY) -m pip install -q -e ".[bench,report]"
	touch $@

$(VENV)/.test: $(VENV)/.bench
	$(PY) -m pip install -q -e ".[test]"
	touch $@

# results.json is removed first, so a run that writes none never rebuilds report/ from an older one.
bench: $(VENV)/.bench
	rm -f results.json
	$(PY) -m pytest benchmarks -p no:cacheprovider --benchmark-json results.json $(BENCH_ARGS); \
	status=$$?; if [ -f results.json ]; then $(PY) -m kvcache.cli report results.json --out report || true; fi; \
	exit $$status

test: $(VENV)/.test
	$(PY) -m ruff check kvcache tests benchmarks scripts conftest.py
	$(PY) -m pytest tests -p no:cacheprovider -q --durations=15 -n $(TEST_WORKERS) --dist loadfile
	$(MAKE) --no-print-directory gate

# The counted gate (deterministic, any machine): every registered class on the tiny model, under the
# release's default attention (sdpa) and eager (keyed <class>@eager), and each SDPA class's passes on three GPU
# classes (--kv-gpus: torch's backend rules, docs/gpu-backends.md), against kv-baseline.json.
gate: $(VENV)/.bench
	$(PY) -m pytest benchmarks -m counted --kv-model tiny --kv-caches all --kv-attn sdpa,eager --kv-gpus t4,a100,h100 \
	  -p no:cacheprovider -q --benchmark-json counted.json

# Counted passes under every Transformers minor release since 4.45 (newest patch of each), installed
# side by side in .versions/<release>; JSON, logs and compare.md in .versions/results.
# e.g. make versions VERSIONS_ARGS="--releases 4.45.2,5.25.0 -- --kv-model tiny"
versions: $(VENV)/.test
	$(PY) scripts/versions.py $(VERSIONS_ARGS)

# Every decoder-only causal-LM model type of the installed release counted (--kv-model arch:<type>, dynamic and
# static), one process per architecture; JSON and logs in .architectures/, the table in docs/architectures.md.
# e.g. make architectures ARCHITECTURES_ARGS="--types llama,bloom --jobs 2"
architectures: $(VENV)/.bench
	$(PY) scripts/architectures.py $(ARCHITECTURES_ARGS)

# How often the timed gate catches a planted +2-pass copy, and how often it wrongly flags the clean twin;
# GATE_POWER_ARGS="--ab --runs 10" measures the interleaved A/B verdict instead (kvcache ab).
gate-power: $(VENV)/.bench
	$(PY) scripts/gate_power.py $(GATE_POWER_ARGS)

.PHONY: bench test gate versions architectures gate-power
