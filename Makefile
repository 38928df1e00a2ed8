# Two entry points for a fresh clone: `make consume` and `make test`.
# Everything else (a virtualenv, the packages, the local servers) is set up on the way.
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: consume test test-rabbitmq4 lint services system clean

# Debian's packages for the venv, the servers and dynalite
# (scripts/system-packages): what is missing is installed when make runs as
# root, otherwise make stops here with the one line that names it.
SYSTEM_PACKAGES_MISSING = $(shell PYTHON='$(PYTHON)' scripts/system-packages --explain)

system:
	$(if $(SYSTEM_PACKAGES_MISSING),$(error $(SYSTEM_PACKAGES_MISSING)))
	@PYTHON='$(PYTHON)' scripts/system-packages

# FASTSTREAM=0.7.3 installs that release instead of the newest, so CI tests
# the oldest FastStream the middleware supports as well (.ci/fresh-machine).
FASTSTREAM ?=

$(BIN)/.installed: pyproject.toml | system
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(if $(FASTSTREAM),$(BIN)/pip install --quiet 'faststream[rabbit]==$(FASTSTREAM)')
	touch $@

services: system $(BIN)/.installed
	$(BIN)/python -m tests.servers

# The bundled example handler, named here: semel itself has no default handler.
EXAMPLE_HANDLER ?= semel.consumer.examples:order_paid

consume: services
	$(BIN)/semel migrate
	SEMEL_HANDLER='$(EXAMPLE_HANDLER)' $(BIN)/semel consume

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The suite waits on leases, TTLs and servers far more than on the CPU, but
# not only: on two cores, beside the servers, four workers starved
# timing-bound tests (a lease, a handler's time limit) often enough to fail
# one run in two, and three still did in CI (heartbeats unanswered for 0.7 s
# on SQLite). Two, one test file each at a time, keep it within minutes.
PYTEST_WORKERS ?= 2

# Two kinds of tests run on their own after the rest: the RabbitMQ cluster's
# (tests/cluster: three nodes, a partition timed against the net tick) and the
# slow store's (no lease may lapse while three workers wait on a slow proxy).
# Beside four busy test workers on two cores, a process can go without the
# CPU for longer than a lease or a tick, which is not what they test. The
# outbox chaos test (private servers, processes killed on a timeline) and the
# DLQ kill test (commands SIGKILLed at random moments) too.
SERIAL_TESTS = tests/cluster tests/faults/test_slow_store.py tests/outbox_chaos/test_outbox_chaos.py \
	tests/tools/test_dlq_kill.py
# What `make test` runs: the whole suite. CI's fresh machine (.ci/fresh-machine)
# narrows it to the tests of what that machine installs itself; the serial
# phase then runs only with the whole suite.
TESTS ?= tests
test: lint services
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile $(SERIAL_TESTS:%=--ignore=%) $(TESTS)
	$(if $(filter tests,$(TESTS)),$(BIN)/pytest $(SERIAL_TESTS),@echo "make test: TESTS=$(TESTS): serial phase not run")

# The broker's tests again on RabbitMQ 4.0, run from a Debian 13 root that
# tests/rabbitmq4.py builds once per machine (root needed) outside the checkout.
RABBITMQ4_TESTS ?= tests/consumer tests/tools tests/ops/test_readiness.py tests/chaos/test_chaos.py

test-rabbitmq4: services
	$(BIN)/python -m tests.rabbitmq4
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --rabbitmq 4 \
		--ignore=tests/tools/test_dlq_kill.py $(RABBITMQ4_TESTS)

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache semel.db*
