"""HA faults (issue 16 §7): etcd leader kill -9, loss of quorum, kill -9 of one replica per role.

They act on the stack `make up LOCK_BACKEND=etcd ETCD_MEMBERS=3 REPLICAS=2` started: members
`dlock1..N` (ports in `DLOCK_ETCD_PORTS`, pids under `.run/pids/etcd<n>.pid`) and role
replicas `<role>-2` (records under `.run/roles/`). Every fault heals itself: a killed member or
replica is started again, with the configuration it was started with, before the action returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from typing import TYPE_CHECKING

import requests

from devstack import (
    URL_ENV,
    EtcdServer,
    etcd_cluster,
    etcd_healthy,
    restart_role,
    state_root,
    wait_until,
)
from devstack.common import REPLICATED_ROLES
from experiment.stack import MissingPiece

if TYPE_CHECKING:
    from experiment.stack import StackHandle

MEMBER_DOWN_S = 2.0  # how long a killed leader stays down before it is started again


def is_ha(env: dict[str, str]) -> bool:
    """Three etcd members (or more) and two replicas of each replicated role."""
    members = len([p for p in env.get("DLOCK_ETCD_PORTS", "").split(",") if p])
    replicated = all("," in env.get(URL_ENV[role], "") for role in REPLICATED_ROLES)
    return env.get("LOCK_BACKEND") == "etcd" and members >= 3 and replicated


def members(stack: StackHandle) -> list[EtcdServer]:
    ports = []
    for pair in stack.env.get("DLOCK_ETCD_PORTS", "").split(","):
        if pair:
            client, peer = pair.split(":")
            ports.append((int(client), int(peer)))
    if len(ports) < 3:
        raise MissingPiece("HA faults need `make up LOCK_BACKEND=etcd ETCD_MEMBERS=3 REPLICAS=2`")
    return etcd_cluster(state_root(stack.run_dir), ports)


def leader(cluster: list[EtcdServer]) -> EtcdServer | None:
    """The member that answers its own status as the leader."""
    for member in cluster:
        try:
            status = requests.post(f"{member.url}/v3/maintenance/status", json={}, timeout=1).json()
        except (requests.RequestException, ValueError):
            continue
        if status.get("leader") and status.get("leader") == status.get("header", {}).get(
            "member_id"
        ):
            return member
    return None


def _pidfile(stack: StackHandle, member: EtcdServer):
    return stack.run_dir / "pids" / f"{member.datadir.name}.pid"


def kill_member(stack: StackHandle, member: EtcdServer) -> None:
    pid = int(_pidfile(stack, member).read_text() or 0)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def start_member(stack: StackHandle, member: EtcdServer) -> None:
    member.start(wait=False)
    assert member.process is not None
    _pidfile(stack, member).write_text(str(member.process.pid))


def wait_quorum(stack: StackHandle, timeout: float = 30) -> None:
    """Until every member answers healthy again (a healed cluster)."""
    for member in members(stack):
        wait_until(lambda m=member: etcd_healthy(m.url), timeout=timeout, what=f"{member.name}")


def kill_etcd_leader(stack: StackHandle) -> str:
    """kill -9 the etcd leader; start it again after MEMBER_DOWN_S. Returns its name."""
    cluster = members(stack)
    victim = leader(cluster)
    if victim is None:
        raise MissingPiece("no etcd member says it is the leader")
    kill_member(stack, victim)
    time.sleep(MEMBER_DOWN_S)
    start_member(stack, victim)
    wait_quorum(stack)
    return victim.name


def lose_quorum(stack: StackHandle, seconds: float) -> list[str]:
    """kill -9 two of three members (the leader among them) for `seconds`, then restart them."""
    cluster = members(stack)
    first = leader(cluster) or cluster[0]
    victims = [first] + [m for m in cluster if m is not first][:1]
    for member in victims:
        kill_member(stack, member)
    time.sleep(seconds)
    for member in victims:
        start_member(stack, member)
    wait_quorum(stack)
    return [m.name for m in victims]


def kill_replica(stack: StackHandle, role: str) -> None:
    """kill -9 the second replica of a role, then start it again as it was started."""
    name = f"{role}-2"
    record = stack.run_dir / "roles" / f"{name}.json"
    if not record.exists():
        raise MissingPiece(f"no {record}: HA faults need `make up ... REPLICAS=2`")
    pid = int(json.loads(record.read_text()).get("pid") or 0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    restart_role(name, run=stack.run_dir)


def time_to_next_posted(series: list[dict], at: float) -> float | None:
    """Seconds from `at` until the POSTED count first rose above what it was at `at` (from the
    sampled series, 0.5 s resolution); None when it never did."""
    before = 0
    for point in series:
        if point["t"] <= at:
            before = point.get("POSTED", 0)
            continue
        if point.get("POSTED", 0) > before:
            return round(point["t"] - at, 2)
    return None
