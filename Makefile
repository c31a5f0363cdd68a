# specmlx developer tasks. `make install` builds .venv/ here; every other target uses it.
PY      := .venv/bin/python
SPECMLX := .venv/bin/specmlx
# Debian's OpenBLAS, preloaded on Linux CPU for the memory-bound regime (see README).
OPENBLAS := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 /usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3))

.PHONY: install test test-fast lint format models demo bench openblas clean

install: .venv/.installed

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# Preload OpenBLAS when it is there: the real-model tests run several times faster.
PRELOAD := $(if $(OPENBLAS),LD_PRELOAD=$(OPENBLAS))

test: install
	$(PRELOAD) $(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not real"

lint: install
	$(PY) -m ruff check specmlx tests
	$(PY) -m ruff format --check specmlx tests

format: install
	$(PY) -m ruff format specmlx tests
	$(PY) -m ruff check --fix specmlx tests

models: install
	$(SPECMLX) fetch

demo: models
	$(SPECMLX) generate "Write a Python function that checks whether a number is prime." --max-tokens 96

# Debian's OpenBLAS for the memory-bound regime on Linux CPUs (nothing to do elsewhere).
openblas:
	@if [ "$$(uname)" = "Linux" ] && [ -z "$(OPENBLAS)" ]; then \
		(apt-get update -q && apt-get install -y -q libopenblas0-pthread) >/dev/null 2>&1 || \
		(echo "error: could not install libopenblas0-pthread (Debian); install it as root" >&2; exit 1); \
	fi

clean:
	rm -rf .venv .pytest_cache .ruff_cache *.egg-info
