"""The HA experiment's faults against a real HA dev stack (3 etcd members, 2 replicas per role,
free ports): each one really happens, and the stack heals from it with no operator step."""

from __future__ import annotations

import pytest
import requests

from devstack import DB_URL_ENV, ROLES, clean, pid_alive, read_env, ready, up
from devstack.stack import read_record
from experiment import ha
from experiment.stack import from_stack_env
from tests.devstack.conftest import _free_block

pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.etcd]


@pytest.fixture
def ha_stack(tmp_path, monkeypatch):
    for var in DB_URL_ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("LOCK_BACKEND", raising=False)
    monkeypatch.delenv("ETCD_URL", raising=False)
    run = tmp_path / "run"
    base = _free_block(len(ROLES), replicas=2)
    ports = {role: base + n for n, role in enumerate(ROLES, start=1)}
    try:
        up("etcd", etcd_members=3, replicas=2, run=run, ports=ports)
        yield from_stack_env(run)
    finally:
        clean(run=run)


def healthy_members(stack) -> list[str]:
    return [m.name for m in ha.members(stack) if ha.etcd_healthy(m.url)]


def test_leader_kill_quorum_loss_and_replica_kill_each_heal(ha_stack):
    stack = ha_stack
    assert ha.is_ha(stack.env)
    assert read_env(stack.run_dir / "stack.env")["LOCK_BACKEND"] == "etcd"
    before = ha.leader(ha.members(stack))
    assert before is not None

    assert ha.kill_etcd_leader(stack) == before.name
    ha.wait_quorum(stack, timeout=30)
    assert ha.leader(ha.members(stack)) is not None
    assert sorted(healthy_members(stack)) == ["dlock1", "dlock2", "dlock3"]

    killed = ha.lose_quorum(stack, 5.0)
    assert len(killed) == 2
    ha.wait_quorum(stack, timeout=30)
    assert sorted(healthy_members(stack)) == ["dlock1", "dlock2", "dlock3"]

    record = stack.run_dir / "roles" / "payments-2.json"
    old_pid = int(read_record(record)["pid"])
    ha.kill_replica(stack, "payments")
    assert not pid_alive(old_pid)
    assert int(read_record(record)["pid"]) != old_pid
    assert all(ready(url) for url in stack.urls("payments"))
    stack.wait_ready(60)  # every replica of every role answers ready again
    assert requests.get(f"{stack.urls('lockserver')[1]}/health/ready", timeout=5).ok
