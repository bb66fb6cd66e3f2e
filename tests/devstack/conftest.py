"""A dev stack of the tests' own: `devstack.stack.up` on free ports in a temporary run directory."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from devstack.common import DB_URL_ENV, RESERVED_PORTS, ROLES, _bindable, ephemeral_range
from devstack.stack import clean

_random = random.SystemRandom()


def _free_block(size: int, *, replicas: int = 1) -> int:
    """A base port whose base+1..base+size (and +100 for replicas) are all free, drawn from the
    reserved range (never the kernel's ephemeral one, which outgoing connections take)."""
    ephemeral = ephemeral_range()
    top = RESERVED_PORTS.stop - size - 100 * replicas - 1
    bases = [b for b in range(RESERVED_PORTS.start, top, 10) if b not in ephemeral]
    for _ in range(200):
        base = _random.choice(bases)
        wanted = [base + n + 100 * r for n in range(1, size + 1) for r in range(replicas)]
        if all(p not in ephemeral and _bindable(p) for p in wanted):
            return base
    raise RuntimeError("no free block of ports")


@pytest.fixture
def stack_ports() -> dict[str, int]:
    base = _free_block(len(ROLES))
    return {role: base + n for n, role in enumerate(ROLES, start=1)}


@pytest.fixture
def replica_ports() -> dict[str, int]:
    base = _free_block(len(ROLES), replicas=2)
    return {role: base + n for n, role in enumerate(ROLES, start=1)}


def isolated_run(tmp_path, monkeypatch) -> Path:
    """A run directory of the test's own. The suite's database URLs (and backend choice) must
    not leak in: `up` would use them instead of its own private cluster."""
    for var in DB_URL_ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("LOCK_BACKEND", raising=False)
    monkeypatch.delenv("ETCD_URL", raising=False)
    return tmp_path / "run"


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """Whatever a test leaves running is stopped and removed."""
    run = isolated_run(tmp_path, monkeypatch)
    yield run
    clean(run=run)
