# `make demo` sets up a fresh clone and runs one session on the embedded model.
# `make test` sets up a fresh clone (a .venv with the project and its dev tools) and runs
# everything CI runs: lint, format check, strict type check and the whole test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= dev,embedded,mcp,otel

.PHONY: setup demo lint typecheck test bench

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

setup: $(VENV)/.installed-$(EXTRAS)

# The main job: one session on the embedded model (no server, no key), each step live.
demo: setup
	$(VENV)/bin/turnkeeper run "What is 17 * 23? Use the calculator."

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: setup
	$(PY) -m mypy

test: lint typecheck
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/poll_turn.py
