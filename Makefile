# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create or reuse .venv/ at the repo root (scripts/venv.sh).
VENV := .venv
PY := $(VENV)/bin/python
# two workers, one test file each at a time (files share their SGLang runs); override with PYTEST_ARGS=
PYTEST_ARGS ?= -n 2 --dist loadfile

.PHONY: install demo test lint type fixtures clean-venv

install:
	@scripts/venv.sh

demo: install
	@$(PY) -m specparity.demo

test: install
	@$(PY) -m pytest -p no:cacheprovider -q $(PYTEST_ARGS)

lint: install
	@$(VENV)/bin/ruff check src tests fixtures benchmarks conftest.py

type: install
	@$(VENV)/bin/mypy

fixtures: install
	@$(PY) fixtures/make_default.py

clean-venv:
	rm -rf $(VENV)
