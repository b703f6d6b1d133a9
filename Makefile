# hetsgd: `make run` and `make test` each set up what they need on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch 2.13.0: on this project's CI machines it resolves to a local CPU build; on a GPU
# server PyPI serves the CUDA build of the same version. Override with `make setup TORCH=torch`.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: setup bytecode run test test-wall test-all test-quick lint plots bench bench-quick clean

setup: $(STAMP) bytecode

## hetsgd's compiled modules, written here because an editable install writes none and some
## machines forbid Python to (PYTHONDONTWRITEBYTECODE): without them every process compiles
## hetsgd's sources again, about 1.5 s of each run's start. Up-to-date files are skipped.
## For the same reason make's own commands may write bytecode (pytest's rewritten test modules:
## about 4 s of each test process's collection).
unexport PYTHONDONTWRITEBYTECODE
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q hetsgd

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

## the main job, offline: does the CPU help the accelerator? The accelerator alone, CPU Hogwild,
## Hogbatch and Adaptive with the Hogbatch authors' net on the embedded digits set, 3 seeds of
## 6 s each (on 2 cores about 1.5-2 minutes of training, 4 with the first setup); the sweep's
## report (mean and spread) and figures.
## The sweep is hetsgd/conf/experiment/make_run.yaml
run: setup
	$(BIN)/hetsgd run -m +experiment=make_run

## the fast tier, two tests at a time (GPU tests skip, with the reason, without CUDA): unit
## tests, virtual-clock runs, config checks; what waits on the wall clock (`wall`) or times this
## machine (`serial`) is left to `make test-wall`. `make test` and `make test-wall` together run
## every test once (tests/test_tiers.py)
test: setup
	$(BIN)/python -m pytest -q -n 2 -m "not serial and not wall"

## the wall tier: real-time training, whole runs in processes, stall watches and timeouts, two at
## a time (most of their time is waiting, not computing); then the tests that compare this
## machine's speed with itself, alone
test-wall: setup
	$(BIN)/python -m pytest -q -n 2 -m "wall and not serial"
	$(BIN)/python -m pytest -q -m serial

test-all: test test-wall

## unit tests only: no process-spawning (integration) or wall-clock tests
test-quick: setup
	$(BIN)/python -m pytest -q -m "not integration and not wall and not serial"

lint: setup
	$(BIN)/ruff check hetsgd tests scripts
	$(BIN)/mypy

## redraw every figure under results/ (or $HETSGD_RESULTS, where runs go) from the CSVs
plots: setup
	$(BIN)/hetsgd plot "$(or $(HETSGD_RESULTS),results)"

## speed as ratios measured side by side (about 5 minutes); bench-quick: the sections with goals
## (step, loop overhead, Hogwild scaling, memory, the virtual engine's overhead) with 2 s runs,
## under 3 minutes
bench: setup
	$(BIN)/python -m scripts.bench

bench-quick: setup
	$(BIN)/python -m scripts.bench --quick

clean:
	rm -rf $(VENV) .pytest_cache
	find hetsgd -name __pycache__ -type d -prune -exec rm -rf {} +
