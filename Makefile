# dlock local stack. `make demo` is the main job; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Empty = whatever the running stack uses, else pg (so `make experiment` after
# `make up LOCK_BACKEND=etcd` stays on etcd). ETCD_MEMBERS / REPLICAS: empty = running, else 1.
LOCK_BACKEND ?=
ETCD_MEMBERS ?=
REPLICAS ?=
# TLS=1: every role's proxy speaks https (a throwaway CA under .run/tls/, DLOCK_CA_BUNDLE in
# .run/stack.env); TLS=0 turns it off again; empty = what is running, else plain HTTP.
TLS ?=
UP_ARGS = $(if $(LOCK_BACKEND),--backend $(LOCK_BACKEND)) \
	$(if $(ETCD_MEMBERS),--etcd-members $(ETCD_MEMBERS)) $(if $(REPLICAS),--replicas $(REPLICAS)) \
	$(if $(filter 1,$(TLS)),--tls) $(if $(filter 0,$(TLS)),--no-tls)
PYTEST_ARGS ?=
# `make test` runs the suite in this many pytest-xdist workers, a test file per worker at a time
# (its module fixtures stay in one process); 0 = one process, as `make test-shuffled` always is.
# Three on two cores by measurement: the suite waits more than it computes (stacks starting,
# leases running out), 1.3 cores busy on average; a fresh clone ran 581 s with two, 438–507 s with three.
TEST_WORKERS ?= 3

.PHONY: help venv lock etcd-stubs sysdeps image test test-shuffled up down status demo monitor bench soak example experiment experiment-ha experiment-ha-recovery lint format clean

help:
	@echo "make help   - this list"
	@echo "make demo   - bring the stack up and run the fencing demo (the main job)"
	@echo "make test   - run the test suite against real PostgreSQL and etcd"
	@echo "make test-shuffled [SEED=N] - the suite in a random order (pytest-randomly), seed printed"
	@echo "make up / down / status - the local stack (LOCK_BACKEND=pg|etcd ETCD_MEMBERS=N REPLICAS=N TLS=1)"
	@echo "make clean  - make down, then remove everything make up created (databases too)"
	@echo "make monitor - Prometheus (Debian's) on the running stack with monitoring/ rules (MONITOR_PORT=9090)"
	@echo "make bench  - benchmarks, written to .run/bench/"
	@echo "make soak [SOAK_MINUTES=12 SOAK_RATE=8|SOAK_BACKLOG=N SOAK_ARGS=...] - a soak: what grows, written to .run/soak/"
	@echo "make example - the fence kit in an adopter's service (examples/stock) on the running stack"
	@echo "make experiment [EXPERIMENT_ARGS=...] - the fencing experiment (fenced vs naive) on the running stack"
	@echo "make experiment-ha - the fencing experiment on 3 etcd members and 2 replicas per role"
	@echo "make experiment-ha-recovery - HA faults one at a time; recovery per fault and replica"
	@echo "make lint   - ruff check + format check, import-linter (layers), mypy"
	@echo "make format - ruff format, then ruff check --fix"
	@echo "make venv   - the virtualenv from requirements-dev.lock (hash-checked)"
	@echo "make sysdeps - the system packages the stack and the suite need (PostgreSQL, etcd, nginx, ...)"
	@echo "make etcd-stubs - regenerate lockserver/etcd_proto/ from third_party/etcd/'s .proto files"
	@echo "make lock   - recompile requirements.lock / requirements-dev.lock (hashes, from PyPI)"
	@echo "make image  - build the container image with podman (IMAGE=localhost/dlock:dev)"

# The dev lock, hash-checked: every package and version is the lock's, nothing else installs.
$(STAMP): requirements-dev.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --require-hashes -r requirements-dev.lock
	@touch $(STAMP)

venv: $(STAMP)

# Recompile both locks from requirements.txt / requirements-dev.txt (kept pins stay; add
# LOCK_ARGS=--upgrade to move every transitive pin). Against PyPI alone: this machine's pip
# config adds local wheel directories, whose files are not what PyPI serves.
LOCK_ENV := env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL -u PIP_CONSTRAINT \
	PIP_CONFIG_FILE=/dev/null
PIP_COMPILE = $(LOCK_ENV) $(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe \
	--strip-extras --index-url https://pypi.org/simple --no-emit-index-url --no-emit-find-links \
	$(LOCK_ARGS)
lock:
	@test -x $(BIN)/pip-compile || { test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
	  $(BIN)/python -m pip install -q "$$(grep -m1 '^pip-tools==' requirements-dev.txt)"; }
	$(PIP_COMPILE) --output-file requirements.lock requirements.txt
	$(PIP_COMPILE) --output-file requirements-dev.lock requirements-dev.txt

sysdeps:
	@bash scripts/sysdeps.sh

# etcd's gRPC stubs (lockserver/etcd_proto/) from its .proto files in third_party/etcd/
etcd-stubs: venv
	$(BIN)/python scripts/etcd_stubs.py

# The image, with podman. scripts/base-image.sh first: the Dockerfile's base is pulled, or, where
# no registry answers, a STAND-IN is built under its name (Debian's python; it says so). The
# build's pip reaches PyPI over the host's network and trusts the host's CA bundle, mounted for
# the RUN steps only (a TLS-intercepting egress); no layer keeps it. `--format docker` keeps the
# HEALTHCHECK. PODMAN_ARGS: what this host's podman needs to start a container (docs/operations.md
# "Container image"), e.g. PODMAN_ARGS="--runtime runc --ulimit nofile=20000:20000 --ulimit nproc=4096:4096".
IMAGE ?= localhost/dlock:dev
PODMAN_ARGS ?=
HOST_CA := /etc/ssl/certs/ca-certificates.crt
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
image:
	bash scripts/base-image.sh
	podman build --pull=never --format docker --network host $(PODMAN_ARGS) \
	  --build-arg DLOCK_VERSION=$(VERSION) \
	  $(if $(wildcard $(HOST_CA)),--volume $(HOST_CA):$(HOST_CA):ro) -t $(IMAGE) .

test: venv sysdeps
	$(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# The suite in a shuffled order (pytest-randomly) to find tests that depend on others' leftovers.
# SEED=N replays an order (each run prints its seed); empty: a new one.
SEED ?=
test-shuffled: venv sysdeps
	$(BIN)/python -m pytest -p randomly $(if $(SEED),--randomly-seed=$(SEED)) $(PYTEST_ARGS)

up: venv sysdeps
	$(BIN)/python -m devstack up $(UP_ARGS)

down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m devstack down; else echo "[dlock] nothing to stop"; fi

status: venv
	$(BIN)/python -m devstack status

demo: up
	$(BIN)/python -m devstack.demo

# An adopter's service fenced with dlock.fence (docs/fence-kit.md): a stock counter on the
# running stack's PostgreSQL (its own database), the stale holder refused with 409 FENCED_OUT.
example: up
	set -a; . .run/stack.env; set +a; \
	EXAMPLE_PORT=$${EXAMPLE_PORT:-$$($(BIN)/python -c 'from devstack.common import free_port; print(free_port())')} \
	$(BIN)/python -m examples.stock.story

# Debian's prometheus (scripts/sysdeps.sh) against the running stack: monitoring/prometheus.yml
# and monitoring/alerts.yml, targets from .run/stack.env, data in .run/monitor/.
# DLOCK_EXECUTOR_METRICS (host:port,… of executors' /metrics) and MONITOR_PORT: from the make
# command line or the environment.
DLOCK_EXECUTOR_METRICS ?=
MONITOR_PORT ?=
monitor: venv sysdeps
	DLOCK_EXECUTOR_METRICS='$(DLOCK_EXECUTOR_METRICS)' MONITOR_PORT='$(MONITOR_PORT)' \
	$(BIN)/python -m devstack.monitor

# The redis-server package is needed only here (python-redis-lock's baseline).
# e.g. make bench BENCH_ARGS="--only peers", BENCH_ARGS="--only compare --before 55d13fe"
bench: venv
	@WITH_REDIS=1 bash scripts/sysdeps.sh
	$(BIN)/python -m bench $(BENCH_ARGS)

# A soak on a private stack (bench/soak.py, docs/performance.md "Soak"): executors for
# SOAK_MINUTES under SOAK_RATE payouts/s (or a SOAK_BACKLOG seeded at the start), rail faults and
# one PostgreSQL restart; every process's RSS, fds and threads, the connections per role, table
# rows and log bytes sampled every SOAK_SAMPLE_S, growth fitted after warm-up; .run/soak/summary.*.
# SOAK_EXECUTORS, SOAK_CONCURRENCY, SOAK_PG_RESTART=0 and SOAK_ARGS (`python -m bench.soak --help`).
SOAK_MINUTES ?= 12
soak: venv sysdeps
	SOAK_MINUTES='$(SOAK_MINUTES)' $(BIN)/python -m bench.soak $(SOAK_ARGS)

# e.g. make experiment EXPERIMENT_ARGS="--seed 11 --executors 6 --payouts 400"
# The experiment is tooling, not an app of any role: settings.tooling = ops + `experiment`.
experiment: up
	set -a; . .run/stack.env; set +a; echo "[dlock] experiment on the running stack: LOCK_BACKEND=$$LOCK_BACKEND"; \
	ROLE=ops DJANGO_SETTINGS_MODULE=settings.tooling $(BIN)/python -m django fencing_experiment $(EXPERIMENT_ARGS)

# The HA experiment: 3 etcd members, 2 replicas of every server role, etcd leader kill, quorum loss
# and replica kills added to the fault schedule.
experiment-ha: venv sysdeps
	$(MAKE) up LOCK_BACKEND=etcd ETCD_MEMBERS=3 REPLICAS=2
	set -a; . .run/stack.env; set +a; ROLE=ops DJANGO_SETTINGS_MODULE=settings.tooling \
	$(BIN)/python -m django fencing_experiment --ha $(EXPERIMENT_ARGS)

# The HA recovery measurement: the HA faults alone, one at a time with a settle period, a prober
# per replica (and one with every URL) per role; prints the per-fault, per-replica table and
# writes it to <out>/report.json (`arms.fenced.ha_recovery`).
experiment-ha-recovery: venv sysdeps
	$(MAKE) up LOCK_BACKEND=etcd ETCD_MEMBERS=3 REPLICAS=2
	set -a; . .run/stack.env; set +a; ROLE=ops DJANGO_SETTINGS_MODULE=settings.tooling \
	$(BIN)/python -m django fencing_experiment --ha-recovery $(EXPERIMENT_ARGS)

# mypy's Django plugin imports settings.ops: it needs URLs, never a connection.
LINT_ENV := DJANGO_DEBUG=true PAY_DATABASE_URL=postgres://lint@127.0.0.1:1/lint \
	LOCK_DATABASE_URL=postgres://lint@127.0.0.1:1/lint RAIL_DATABASE_URL=postgres://lint@127.0.0.1:1/lint

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(LINT_ENV) $(BIN)/mypy

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Everything `make up` made, wherever it lives (as root the databases are in /tmp/dlock-<hash>/).
clean:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m devstack clean; else rm -rf .run; fi
