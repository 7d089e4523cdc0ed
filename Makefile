# Two commands for a fresh machine: `make demo` (the main job, no API key or GPU needed) and
# `make test` (the CPU test suite, as CI runs it). Both create .venv and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-gpu lint

$(PY) setup:
	bash scripts/setup.sh

demo: $(PY)
	rm -rf runs/demo-replay
	$(VENV)/bin/kloop replay runs/examples/l3-1-mlp-triton --out runs/demo-replay --device auto
	$(VENV)/bin/kloop report runs/demo-replay --out runs/demo-replay/report
	@echo "report: runs/demo-replay/report"

test: $(PY)
	$(PY) -m pytest -m "not gpu" -q

# On a GPU machine with kloop installed: runs only the tests that need CUDA.
test-gpu:
	python3 -m pytest -m gpu -q -rA

lint: $(PY)
	$(VENV)/bin/ruff check .
