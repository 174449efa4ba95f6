# The README's two commands: `make demo` runs the main job, `make test` runs the tests.
# Both set up everything they need (a virtualenv in .venv, the package, a Redis server).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

LOWEST ?= .venv-lowest
# Test processes run side by side (pytest-xdist): most of a test's time is spent waiting on
# workers, leases and timeouts, not on CPU, so six share two cores well (test-main on 2 quiet
# cores: 362 s in six, 519 s in three). The lowest versions run in three (LOWEST_PROCESSES):
# the topology tests run beside them (test-lowest-topologies).
TEST_PROCESSES ?= 6
LOWEST_PROCESSES ?= 3
# `make test LOAD=2` (or quick, test-main, ...): that many CPU-burning processes run beside the
# tests, so a test that fails on a busy machine fails here first (tests/conftest.py starts them).
LOAD ?= 0
export REDISLOCK_TEST_LOAD := $(LOAD)

.PHONY: demo demo-core demo-docs test setup quick test-main coverage test-quick test-lowest \
	test-topologies test-lowest-topologies lint lua-check chromium bench bench-celery bench-rq soak \
	clean docs docs-screenshot

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.demo: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[demo]'
	touch $@

$(LOWEST)/.done: pyproject.toml constraints-lowest.txt
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install --quiet --upgrade pip
	$(LOWEST)/bin/pip install --quiet -e '.[test]' -c constraints-lowest.txt
	touch $@

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.demo $(VENV)/.docs

# The demos use REDIS_URL when set, else redis-server on PATH, else the embedded binary.
# `make demo`: Celery workers, then RQ workers, under bursts of calls; `make demo-core`: the lock
# core alone.
demo: $(VENV)/.demo
	$(BIN)/python -m demos.celery $(ARGS)

demo-core: $(VENV)/.demo
	$(BIN)/python -m demos.core $(ARGS)

# The sample output in docs/examples.md and docs/demo-timeline.png, from one full run of
# `make demo` (tests/packaging/test_taskdemo.py fails while the sample is not what the demo
# prints).
demo-docs: $(VENV)/.demo
	$(BIN)/python -m demos.celery --write-docs $(ARGS)

lint: $(VENV)/.dev lua-check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	luacheck --no-color -q celery_redislock/core/lua benchmarks/window_rate.lua

# luacheck, the Lua linter `make lint` runs on the scripts (settings in .luacheckrc): Debian's
# package lua-check, installed here when it is missing (as root, or with sudo), as .ci/run
# installs redis-server. Elsewhere, install luacheck first (e.g. `luarocks install luacheck`).
lua-check:
	@command -v luacheck >/dev/null || { \
		command -v apt-get >/dev/null || { \
			echo "make lint needs luacheck: install it (e.g. luarocks install luacheck)"; exit 1; }; \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing luacheck (apt-get install lua-check)"; \
		$$sudo apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lua-check >/dev/null; }

# Debian's Chromium, which the web view's browser tests (tests/web/) and the docs' screenshot of
# it (docs/screenshot.py) drive through Playwright: installed here when /usr/bin/chromium is
# missing (as root, or with sudo), as lua-check is. Playwright's own browsers are never downloaded.
chromium:
	@[ -x /usr/bin/chromium ] || { \
		command -v apt-get >/dev/null || { \
			echo "the web tests and the docs need Chromium at /usr/bin/chromium: install it"; exit 1; }; \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing Chromium (apt-get install chromium)"; \
		$$sudo apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Runs the make targets $(1) one after another, each even if one before it failed; then says how
# each ended and how long it took, and fails if any failed. Ctrl-C stops it all.
define phases
	+@trap 'exit 130' INT TERM; failed=""; report=""; \
	for phase in $(1); do \
		echo "=== make $$phase"; \
		began=$$(date +%s); \
		if $(MAKE) --no-print-directory $$phase; then result=passed; \
		else result=FAILED; failed="$$failed $$phase"; fi; \
		report="$$report  $$phase: $$result in $$(( $$(date +%s) - began )) s\n"; \
	done; \
	printf "\n=== make $@\n$$report"; \
	if [ -n "$$failed" ]; then echo "make $@ failed:$$failed"; exit 1; fi
endef

# Lint, the docs build (warnings as errors, doctests), every test against each Redis found
# (redis-server on PATH and the embedded 6.2), then the tests marked `versions` once more on the
# lowest supported versions with the Redis topologies beside them: about 12 minutes on 2 quiet
# cores.
test:
	$(call phases,setup lint docs test-main test-lowest-topologies)

# Both virtualenvs at once (test's first phase): each install mostly waits on pip's downloads
# and builds, so side by side they take about as long as the longer one.
setup:
	+@$(MAKE) --no-print-directory -j2 $(VENV)/.dev $(LOWEST)/.done

# test-lowest, and test-topologies beside it: the topology tests spend their time waiting on
# failovers and syncs (their waits stretch with the load: tests/topologies.py), not on the CPU,
# so they add little to the lowest versions' time (they took 2 minutes after them). The
# topologies' output follows the lowest versions'; each one's result and time are named.
test-lowest-topologies: $(VENV)/.dev
	+@trap 'trap - INT TERM; kill 0; exit 130' INT TERM; began=$$(date +%s); side=$$(mktemp -d); \
	( $(MAKE) --no-print-directory test-topologies > $$side/log 2>&1; \
	  echo "$$? $$(( $$(date +%s) - began ))" > $$side/rc ) & topologies=$$!; \
	$(MAKE) --no-print-directory test-lowest; lowest=$$?; lowest_s=$$(( $$(date +%s) - began )); \
	wait $$topologies; read topo topo_s < $$side/rc; \
	echo "=== make test-topologies (beside test-lowest)"; cat $$side/log; rm -rf $$side; \
	for p in "test-lowest $$lowest $$lowest_s" "test-topologies $$topo $$topo_s"; do \
		set -- $$p; [ $$2 = 0 ] && r=passed || r=FAILED; echo "  $$1: $$r in $$3 s"; done; \
	[ $$lowest = 0 ] && [ $$topo = 0 ]

# The everyday loop, a few minutes: lint, and the tests not marked `slow`.
quick:
	$(call phases,lint test-quick)

# --durations: the 25 slowest tests are named at the end (where the suite's time goes).
test-main: $(VENV)/.dev chromium
	$(BIN)/pytest -n $(TEST_PROCESSES) -m "not topology" --durations=25 $(ARGS)

# test-main with branch coverage of the package, worker subprocesses included: about a quarter
# slower, so `make test` leaves it out.
coverage: $(VENV)/.dev chromium
	$(BIN)/pytest -n $(TEST_PROCESSES) -m "not topology" --cov --cov-report=term-missing:skip-covered $(ARGS)

test-quick: $(VENV)/.dev chromium
	$(BIN)/pytest -n $(TEST_PROCESSES) -m "not slow" $(ARGS)

# Again on the lowest supported Celery, kombu, billiard, RQ and redis-py: the tests of what may
# behave otherwise there (marker `versions`: framework internals, signals, pools, brokers, logs,
# redis-py's errors; tests/conftest.py says why, by module or test, and what is left out: our
# own parsing and naming, the core's decisions). A Celery or RQ test it does not name is in.
test-lowest: $(LOWEST)/.done
	$(LOWEST)/bin/pytest -n $(LOWEST_PROCESSES) -p no:hypothesispytest -q -m versions --durations=15

# Sentinel (1 master, 1 replica, 3 sentinels) and a Redis Cluster (3 masters, 3 replicas) from
# local redis-server processes, with real failovers (marker `topology`: tests/topologies/ and
# RedLock's tests with several masters; the folder's fast static checks run in test-main).
test-topologies: $(VENV)/.dev
	$(BIN)/pytest -q -m topology

bench: $(VENV)/.dev
	$(BIN)/python benchmarks/lock_core.py $(ARGS)

bench-celery: $(VENV)/.dev
	$(BIN)/python benchmarks/celery_overhead.py $(ARGS)
	$(BIN)/python benchmarks/celery_enqueue.py $(ARGS)
	$(BIN)/python benchmarks/celery_contended.py $(ARGS)

bench-rq: $(VENV)/.dev
	$(BIN)/python benchmarks/rq_overhead.py $(ARGS)

# Two workers under chaos (kills, lost replies) for 5 minutes: nothing lost, no two holders at
# once. `make soak ARGS="--minutes 1 --json soak.json"` for a shorter one.
soak: $(VENV)/.dev
	$(BIN)/python benchmarks/soak $(ARGS)

# docs/web.png, the web view's picture in docs/web.md (committed, so that the page shows it on
# GitHub and in the built docs alike): taken again by docs/screenshot.py (a throwaway Redis with a
# few locks, the view served, Chromium). Run it when the page's look changes.
docs-screenshot: $(VENV)/.docs chromium
	$(BIN)/python docs/screenshot.py docs/web.png

clean:
	rm -rf $(VENV) $(LOWEST) .coverage .pytest_cache .mypy_cache .ruff_cache .hypothesis docs/_build

# The docs site (docs/, Sphinx + MyST): HTML with warnings as errors, then the examples of the
# pages and of the docstrings run as doctests. -E reads every page again: an incremental build
# would not repeat the warnings of pages it does not rebuild, and pass.
$(VENV)/.docs: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[docs]'
	touch $@

docs: $(VENV)/.docs
	$(BIN)/sphinx-build -E -W --keep-going -b html docs docs/_build/html
	$(BIN)/sphinx-build -E -W -b doctest docs docs/_build/doctest
