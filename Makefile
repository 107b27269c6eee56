# The two commands of the README: `make demo` runs the main job on the example data, `make test`
# runs the tests. Both assume `pip install -e .[test]` (done by `make install`).
PYTHON ?= python3
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install demo test lint format

install:
	$(PYTHON) -m pip install "torch==2.13.0" || $(PYTHON) -m pip install "torch>=2.1"
	$(PYTHON) -m pip install -e ".[test,eval]"

demo:
	bash examples/run.sh

test:
	$(PYTHON) -m ruff check phrasescore tests
	$(PYTHON) -m pytest -q tests

lint:
	$(PYTHON) -m ruff check phrasescore tests
	$(PYTHON) -m ruff format --check phrasescore tests

format:
	$(PYTHON) -m ruff format phrasescore tests
