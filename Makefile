# Two commands for a fresh machine: `make demo` (the main job, no API key or GPU needed) and
# `make test` (the CPU test suite, as CI runs it). Both create .venv and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-gpu lint

$(PY) setup:
	bash scripts/setup.sh

demo: $(PY)
	$(VENV)/bin/kloop problems list --level 3

test: $(PY)
	$(PY) -m pytest -m "not gpu" -q

# On a GPU machine with kloop installed: runs only the tests that need CUDA.
test-gpu:
	python3 -m pytest -m gpu -q -rA

lint: $(PY)
	$(VENV)/bin/ruff check .
