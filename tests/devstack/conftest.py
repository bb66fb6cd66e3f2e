"""A dev stack of the tests' own: `devstack.stack.up` on free ports in a temporary run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.common import DB_URL_ENV, ROLES, free_port_block
from devstack.stack import clean


@pytest.fixture
def stack_ports() -> dict[str, int]:
    base = free_port_block(len(ROLES))
    return {role: base + n for n, role in enumerate(ROLES, start=1)}


@pytest.fixture
def replica_ports() -> dict[str, int]:
    base = free_port_block(len(ROLES), replicas=2)
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
