# The two commands of the README: `make demo` runs the main job on the example data (outputs in
# build/example), `make test` runs the tests. Both install the package first when it is not
# importable (`make install`).
PYTHON ?= python3
# ruff finds no extensionless script in a folder: the Python development scripts are named one
# by one (the shell ones, tools/gpu-*, are not Python)
LINTED = phrasescore tests $(shell grep -l '^\#!.*python' tools/*) tools/tool_modules.py
export OMP_WAIT_POLICY ?= PASSIVE
# pytest processes (pytest-xdist): one per core (docs/development.md: the suite's time)
PYTEST_WORKERS ?= 2

.PHONY: install ensure-installed demo test lint format

install:
	$(PYTHON) -m pip install "torch==2.13.0" || $(PYTHON) -m pip install "torch>=2.1"
	$(PYTHON) -m pip install -e ".[test,eval]"

ensure-installed:
	@$(PYTHON) -c "import phrasescore, torch, pytest, xdist, ruff" 2>/dev/null || $(MAKE) install

demo: ensure-installed
	bash examples/run.sh

test: ensure-installed
	$(PYTHON) -m ruff check $(LINTED)
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) tests

lint:
	$(PYTHON) -m ruff check $(LINTED)
	$(PYTHON) -m ruff format --check $(LINTED)

format:
	$(PYTHON) -m ruff format $(LINTED)
