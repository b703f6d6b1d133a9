# hetsgd: `make run` and `make test` each set up what they need on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch 2.13.0: on this project's CI machines it resolves to a local CPU build; on a GPU
# server PyPI serves the CUDA build of the same version. Override with `make setup TORCH=torch`.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: setup run test test-quick lint plots bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

## the main job: a small comparison on the embedded digits set, offline
run: setup
	$(BIN)/hetsgd run -m algo=sync,hogwild,hogbatch,adaptive devices=auto dataset=digits budget.epochs=30

## the whole test suite, every tier (GPU tests skip, with the reason, without CUDA)
test: setup
	$(BIN)/python -m pytest -q

## the fast tier: unit tests only, no process-spawning (integration) or slow tests
test-quick: setup
	$(BIN)/python -m pytest -q -m "not integration and not slow"

lint: setup
	$(BIN)/ruff check hetsgd tests scripts

## redraw every figure under results/ from the CSVs
plots: setup
	$(BIN)/hetsgd plot results

bench: setup
	$(BIN)/python scripts/bench.py

clean:
	rm -rf $(VENV) .pytest_cache
