"""The HA experiment's faults for real: a three-member etcd cluster laid out as `make up
ETCD_MEMBERS=3` lays it out, and a dev stack with two replicas per role (free ports). Each
fault really happens and heals with no operator step.

(On this branch's base the lock server cannot yet serve from a comma-separated ETCD_URL —
issue 16 §1 — so the replica kill runs on a pg HA stack; the faults do not care.)"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import requests

from devstack import netcut
from devstack.common import ROLES, free_port, free_port_block, pid_alive, ready
from devstack.etcd import etcd_cluster
from devstack.postgres import state_root
from devstack.roles import read_record
from devstack.stack import clean, up
from experiment import ha
from experiment.stack import StackHandle, from_stack_env
from tests.devstack.conftest import isolated_run

pytestmark = [pytest.mark.live, pytest.mark.slow]


@pytest.fixture
def run(tmp_path, monkeypatch):
    run = isolated_run(tmp_path, monkeypatch)
    (run / "pids").mkdir(parents=True)
    yield run
    clean(run=run)


@pytest.fixture
def etcd_stack(run):
    ports = [(free_port(), free_port()) for _ in range(3)]
    cluster = etcd_cluster(state_root(run), ports)
    for member in cluster:
        ha.start_member(StackHandle(env={}, restart_role=print, run_dir=run), member)
    env = {"DLOCK_ETCD_PORTS": ",".join(f"{c}:{p}" for c, p in ports)}
    stack = StackHandle(env=env, restart_role=print, run_dir=run)
    try:
        ha.wait_quorum(stack)
        yield stack
    finally:
        for member in ha.members(stack):
            ha.kill_member(stack, member)


def healthy(stack: StackHandle) -> list[str]:
    return sorted(m.name for m in ha.members(stack) if ha.etcd_healthy(m.url))


@pytest.mark.etcd
def test_the_etcd_leader_killed_comes_back_and_a_leader_is_elected(etcd_stack):
    before = ha.leader(ha.members(etcd_stack))
    assert before is not None
    old_pid = int((etcd_stack.run_dir / "pids" / f"{before.datadir.name}.pid").read_text())
    assert ha.kill_etcd_leader(etcd_stack) == before.name
    assert not pid_alive(old_pid)
    assert healthy(etcd_stack) == ["dlock1", "dlock2", "dlock3"]
    assert ha.leader(ha.members(etcd_stack)) is not None


@pytest.mark.etcd
def test_a_quorum_lost_for_five_seconds_is_restored(etcd_stack):
    killed = ha.lose_quorum(etcd_stack, 5.0)
    assert len(set(killed)) == 2
    assert healthy(etcd_stack) == ["dlock1", "dlock2", "dlock3"]
    assert ha.leader(ha.members(etcd_stack)) is not None


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.etcd
@pytest.mark.skipif(
    netcut.unavailable() is not None, reason=f"no partition: {netcut.unavailable()}"
)
def test_the_etcd_leader_partitioned_runs_on_unreachable_and_rejoins_as_a_follower(etcd_stack):
    """A real partition, not a SIGSTOP: the cut leader keeps running (its timers fire) while no
    packet reaches it or leaves it; the other two elect a leader and take writes; after the heal
    the old leader rejoins and the cluster has one leader again."""
    cluster = ha.members(etcd_stack)
    before = ha.leader(cluster)
    assert before is not None
    pid = int((etcd_stack.run_dir / "pids" / f"{before.datadir.name}.pid").read_text())
    assert netcut.in_group(pid, before.cut_tag)
    others = [m for m in cluster if m is not before]
    marks: dict[str, bool] = {}
    observed: dict[str, object] = {}
    during = threading.Event()

    def mark(what: str) -> None:
        marks[what] = True
        if what == "killed":
            during.set()

    def observe() -> None:
        during.wait(10)
        try:
            requests.post(f"{before.url}/v3/maintenance/status", json={}, timeout=1)
            observed["cut_answered"] = True
        except requests.RequestException as exc:
            observed["cut_answered"] = type(exc).__name__
        observed["cut_state"] = _state(pid)  # running or sleeping, never stopped (T)
        for _ in range(40):
            chief = ha.leader(others)
            if chief is not None:
                observed["new_leader"] = chief.name
                put = requests.post(
                    f"{chief.url}/v3/kv/put", json={"key": "Y3V0", "value": "b2s="}, timeout=2
                )
                observed["put"] = put.status_code
                return
            threading.Event().wait(0.1)

    watcher = threading.Thread(target=observe)
    watcher.start()
    outcome = ha.cut_etcd_leader(etcd_stack, 3.0, mark=mark)
    watcher.join(15)
    assert outcome == {"victim": before.name, "cut": "nftables partition"}
    assert marks == {"killed": True, "restarted": True}
    assert observed["cut_answered"] in ("ReadTimeout", "ConnectTimeout"), observed
    assert observed["cut_state"] in ("S", "R"), observed
    assert observed["new_leader"] != before.name and observed["put"] == 200, observed
    assert healthy(etcd_stack) == ["dlock1", "dlock2", "dlock3"]
    assert pid_alive(pid)  # never restarted: the same process rejoined
    after = ha.leader(ha.members(etcd_stack))
    assert after is not None


def test_a_replica_killed_is_restarted_with_its_own_configuration(run):
    base = free_port_block(len(ROLES), replicas=2)
    ports = {role: base + n for n, role in enumerate(ROLES, start=1)}
    up("pg", replicas=2, run=run, ports=ports)
    stack = from_stack_env(run)
    record = run / "roles" / "payments-2.json"
    before = read_record(record)
    ha.kill_replica(stack, "payments")
    after = read_record(record)
    assert not pid_alive(int(before["pid"]))
    assert int(after["pid"]) != int(before["pid"])
    assert {k: v for k, v in after.items() if k != "pid"} == {
        k: v for k, v in before.items() if k != "pid"
    }
    assert all(ready(url) for url in stack.urls("payments"))
    assert len(stack.urls("payments")) == 2
