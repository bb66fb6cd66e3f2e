# dlock local stack. `make demo` is the main job; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK_BACKEND ?= pg
PYTEST_ARGS ?=

.PHONY: help venv sysdeps test up down status demo bench experiment lint format clean

help:
	@echo "make demo   - bring the stack up and run the fencing demo (the main job)"
	@echo "make test   - run the test suite against real PostgreSQL and etcd"
	@echo "make up / down / status - the local stack (LOCK_BACKEND=pg|etcd)"
	@echo "make bench  - benchmarks, written to .run/bench/"
	@echo "make lint   - ruff check + format check"

$(STAMP): requirements.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	@touch $(STAMP)

venv: $(STAMP)

sysdeps:
	@bash scripts/sysdeps.sh

test: venv sysdeps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

up: venv sysdeps
	$(BIN)/python -m dlock.devstack up --backend $(LOCK_BACKEND)

down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m dlock.devstack down; else echo "[dlock] nothing to stop"; fi

status: venv
	$(BIN)/python -m dlock.devstack status

demo: up
	$(BIN)/python -m dlock.demo

# The redis-server package is needed only here (python-redis-lock baseline).
bench: venv
	@WITH_REDIS=1 bash scripts/sysdeps.sh
	$(BIN)/python -m bench $(BENCH_ARGS)

# e.g. make experiment EXPERIMENT_ARGS="--seed 11 --executors 6 --payouts 400"
experiment: up
	set -a; . .run/stack.env; set +a; ROLE=ops $(BIN)/python manage.py fencing_experiment $(EXPERIMENT_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean: down
	rm -rf .run
