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

.PHONY: setup demo lint typecheck docs chromium test bench

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

# The inspector's browser tests drive Debian's Chromium (Playwright's own browser download
# is not reachable from the build machines): installed here when missing and make runs as
# root, else one line says what is missing and the tests are not run.
CHROMIUM ?= /usr/bin/chromium

chromium:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium for the browser tests (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "make test: the browser tests need Chromium at $(CHROMIUM): run 'apt-get install chromium' as root"; \
		exit 1; \
	fi

test: lint typecheck docs chromium
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/poll_turn.py
