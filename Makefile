# fedpriv: `make demo` runs the embedded default experiment, `make test` the test suite.
# Each target first creates/refreshes .venv idempotently. The CPU build of torch is installed
# first (pinned) so that pip never resolves the multi-GB CUDA build.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fedpriv-installed
# The tests run on TEST_WORKERS pytest-xdist workers of one torch thread each (tests/conftest.py),
# test by test, a worker idle at the end taking tests from the other's queue ('worksteal': the suite
# took 7 min 17 s against 8:24-8:58 with xdist's default 'load', whose fixed queues left one worker
# idle beside the other's long tests; 'loadgroup' is inert on pytest 9.2). TEST_WORKERS=0: in this process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)
export FLWR_TELEMETRY_ENABLED := 0
# Python's bytecode cache on (some environments turn it off): every CLI test's process then reads
# fedpriv's modules compiled instead of compiling them again.
unexport PYTHONDONTWRITEBYTECODE
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1

.PHONY: venv demo test test-slow lint bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,audit-reference]"
	touch $(STAMP)

demo: venv
	$(PY) -m fedpriv.simulate

test: venv
	$(PY) -m pytest -q $(XDIST)

lint: venv
	$(PY) -m ruff check .

test-slow: venv
	$(PY) -m pytest -q -m slow $(XDIST)

bench: venv
	$(PY) -m pip install -q -e ".[dev,bench]"
	$(PY) scripts/bench_round.py
	$(PY) scripts/bench_clipping.py --model transformer
	$(PY) scripts/bench_clipping.py --model lstm
	$(PY) scripts/bench_fedsgd.py

clean:
	rm -rf $(VENV) outputs multirun
