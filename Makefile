# Two commands for a fresh machine: `make demo` (the main job, no API key or GPU needed) and
# `make test` (the CPU test suite, as CI runs it). Both create .venv and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo record-examples test test-gpu lint

$(PY) setup:
	bash scripts/setup.sh

# The example runs (five problems, sequential vs best-of-4 at a matched budget) are committed under
# runs/examples/; the demo re-judges a sample of their kernels here and writes the report.
demo: $(PY)
	rm -rf runs/demo
	$(PY) -m kloop.agent.demo.examples demo --out runs/demo

# Rewrite runs/examples/suite-* (on the H200: make record-examples DEVICE=cuda).
DEVICE ?= auto
record-examples: $(PY)
	$(PY) -m kloop.agent.demo.examples record --device $(DEVICE)

# Tests run on TEST_WORKERS processes (pytest-xdist; CI has 2 cores). A test is sent to any free
# worker, except those marked xdist_group, which share an expensive fixture and stay together.
# --durations lists the slowest tests, so the log shows where the time goes.
TEST_WORKERS ?= 2
test: $(PY)
	$(PY) -m pytest -m "not gpu" -q -n $(TEST_WORKERS) --dist loadgroup --durations=25

# On a GPU machine with kloop installed: runs only the tests that need CUDA.
test-gpu:
	python3 -m pytest -m "gpu and not alone" -q -rA
	python3 -m pytest -m "gpu and alone" -q -rA

lint: $(PY)
	$(VENV)/bin/ruff check .
