# `make demo` sets up a fresh clone and runs one session on the embedded model.
# `make test` sets up a fresh clone (a .venv with the project and its dev tools) and runs
# everything CI runs: lint, format check, strict type check, the strict docs build and the
# whole test suite (which runs every example in README.md and docs/).
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= dev,embedded,mcp,otel
# llama-cpp-python (the embedded model) builds from source here. Its default build, for
# the build machine's own instruction set, crashed in generation on an AVX-512 machine;
# built for AVX2 (any x86-64 server of the last decade) it runs.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

.PHONY: setup demo lint typecheck docs test bench

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	@echo "Setting up $(VENV) with turnkeeper and its extras ($(EXTRAS))."
	@echo "The first time, this builds the embedded model's runtime (llama-cpp-python) from"
	@echo "source: about 8 minutes on 2 cores, once. pip's progress follows."
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --progress-bar on -e '.[$(EXTRAS)]'
	touch $@
	@echo "Set up: $(VENV)/bin/turnkeeper is ready."

setup: $(VENV)/.installed-$(EXTRAS)

# The main job: one session on the embedded model (no server, no key), each step live.
demo: setup
	$(VENV)/bin/turnkeeper run "What is 17 * 23? Use the calculator."

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: setup
	$(PY) -m mypy

# The documentation site (mkdocs-material, no fonts or scripts from the network) in site/.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

test: lint typecheck docs
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/poll_turn.py
