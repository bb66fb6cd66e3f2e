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
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import requests

from devstack import netcut
from devstack.common import (
    DB_URL_ENV,
    PROJECT,
    PYTHON,
    REPLICATED_ROLES,
    URL_ENV,
    pid_alive,
    ready,
    wait_until,
)
from devstack.etcd import EtcdServer, etcd_cluster, etcd_healthy
from devstack.postgres import state_root
from devstack.stack import restart_role
from experiment.schedule import (
    ETCD_FOLLOWER_KILL,
    ETCD_LEADER_CUT,
    ETCD_LEADER_KILL,
    PG_KILL,
    PG_RESTART,
    QUORUM_LOSS,
    REPLICA_DOWN,
    REPLICA_KILL,
    REPLICA_STALL,
    RESTART,
)
from experiment.stack import MissingPiece

if TYPE_CHECKING:
    from experiment.schedule import FaultEvent
    from experiment.stack import StackHandle

# `mark("killed")` / `mark("restarted")`: the fault's action says when it really struck and when
# the victim was started again (the arm's clock), for the recovery measurement.
Mark = Callable[[str], None]


def _no_mark(_what: str) -> None:
    return None


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


def kill_etcd_leader(stack: StackHandle, *, mark: Mark = _no_mark) -> str:
    """kill -9 the etcd leader; start it again after MEMBER_DOWN_S. Returns its name."""
    cluster = members(stack)
    victim = leader(cluster)
    if victim is None:
        raise MissingPiece("no etcd member says it is the leader")
    mark("killed")
    kill_member(stack, victim)
    time.sleep(MEMBER_DOWN_S)
    mark("restarted")
    start_member(stack, victim)
    wait_quorum(stack)
    return victim.name


def lose_quorum(stack: StackHandle, seconds: float, *, mark: Mark = _no_mark) -> list[str]:
    """kill -9 two of three members (the leader among them) for `seconds`, then restart them."""
    cluster = members(stack)
    first = leader(cluster) or cluster[0]
    victims = [first] + [m for m in cluster if m is not first][:1]
    mark("killed")
    for member in victims:
        kill_member(stack, member)
    time.sleep(seconds)
    mark("restarted")
    for member in victims:
        start_member(stack, member)
    wait_quorum(stack)
    return [m.name for m in victims]


def kill_etcd_follower(stack: StackHandle, *, mark: Mark = _no_mark) -> str:
    """kill -9 a member that is not the leader; start it again after MEMBER_DOWN_S."""
    cluster = members(stack)
    chief = leader(cluster)
    victim = next((m for m in cluster if m is not chief), None)
    if chief is None or victim is None:
        raise MissingPiece("no etcd member says it is the leader")
    mark("killed")
    kill_member(stack, victim)
    time.sleep(MEMBER_DOWN_S)
    mark("restarted")
    start_member(stack, victim)
    wait_quorum(stack)
    return victim.name


def cut_etcd_leader(stack: StackHandle, seconds: float, *, mark: Mark = _no_mark) -> dict:
    """Partition the etcd leader from peers and clients alike for `seconds`: nftables drops
    every packet its sockets send or receive (devstack.netcut) while the process runs on, so
    calls sent to it time out, the others elect a new leader, and it comes back as a follower.
    Where the machine cannot cut (not root, no nft or cgroup v2, or the member was started
    outside its group) the stand-in is SIGSTOP for the same time; the outcome says which."""
    cluster = members(stack)
    victim = leader(cluster)
    if victim is None:
        raise MissingPiece("no etcd member says it is the leader")
    pid = int(_pidfile(stack, victim).read_text() or 0)
    why_not = netcut.unavailable()
    if why_not is None and not netcut.in_group(pid, victim.cut_tag):
        why_not = f"{victim.name} runs outside its cgroup (started before devstack.netcut)"
    if why_not is None:
        with netcut.partitioned(victim.cut_tag):
            mark("killed")
            try:
                time.sleep(seconds)
            finally:
                mark("restarted")  # before the heal, as before a SIGCONT
        how = "nftables partition"
    else:
        mark("killed")
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
            mark("restarted")
        how = f"SIGSTOP stand-in ({why_not})"
    wait_quorum(stack)
    return {"victim": victim.name, "cut": how}


def _record(stack: StackHandle, name: str) -> dict:
    record = stack.run_dir / "roles" / f"{name}.json"
    if not record.exists():
        raise MissingPiece(f"no {record}: HA faults need `make up ... REPLICAS=2`")
    return json.loads(record.read_text())


def role_pids(stack: StackHandle) -> dict[str, int]:
    """Every role instance's process (RoleProcess.process, as recorded when it was started)."""
    folder = stack.run_dir / "roles"
    return {
        path.stem: int(json.loads(path.read_text()).get("pid") or 0)
        for path in sorted(folder.glob("*.json"))
    }


def stall_replica(stack: StackHandle, role: str, seconds: float, *, mark: Mark = _no_mark) -> dict:
    """SIGSTOP the role's first instance — the replica every client lists first, the one the
    executors use — for `seconds`, then SIGCONT. The signal goes to the process group of the
    role's RoleProcess.process (gunicorn's master and its workers: the server itself, not a
    proxy in front of it). A GC pause, CPU starvation or a stuck disk looks like this."""
    record = _record(stack, role)
    pid = int(record.get("pid") or 0)
    mark("killed")
    os.killpg(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        # Marked before the signal: an answer the thawed replica sends at once must not look
        # as if it came while it was still stopped.
        mark("restarted")
        os.killpg(pid, signal.SIGCONT)
    url = f"http://127.0.0.1:{record['port']}"
    wait_until(lambda: ready(url), timeout=30, what=f"{role} ready after SIGCONT")
    return {"victim": role, "pid": pid}


def down_replica(stack: StackHandle, role: str, seconds: float, *, mark: Mark = _no_mark) -> dict:
    """kill -9 the role's first instance and keep it down for `seconds` (every client meets
    refused connections: what their backoff is for), then start it again from its record."""
    record = _record(stack, role)
    pid = int(record.get("pid") or 0)
    mark("killed")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    time.sleep(seconds)
    mark("restarted")
    restart_role(role, run=stack.run_dir)
    return {"victim": role}


def kill_postmaster(stack: StackHandle, *, mark: Mark = _no_mark) -> dict:
    """kill -9 the stack's PostgreSQL postmaster, then `make up` (`python -m devstack up` on the
    stack's run directory: the documented way to start what is missing), which starts the
    cluster again and must replace no role. Returns what `make up` said and which role
    instances it replaced (pids that changed)."""
    cluster = stack.pg_cluster
    if cluster is None:
        raise MissingPiece("the PostgreSQL kill needs the stack's own cluster (`make up`)")
    before = role_pids(stack)
    pid = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
    mark("killed")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), timeout=10, what="the postmaster to die")
    mark("restarted")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (*DB_URL_ENV.values(), "LOCK_BACKEND", "ETCD_URL")
    }
    env["DLOCK_RUN_DIR"] = str(stack.run_dir)
    answer = None
    for _attempt in range(3):  # orphaned backends may hold the old shared memory a moment
        answer = subprocess.run(
            [PYTHON, "-m", "devstack", "up"],
            cwd=PROJECT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if answer.returncode == 0:
            break
        time.sleep(1.0)
    assert answer is not None
    after = role_pids(stack)
    said = (answer.stdout + answer.stderr).splitlines()
    return {
        "make_up_exit": answer.returncode,
        "make_up_waited": [line for line in said if "alive but not ready" in line],
        "make_up_tail": "\n".join(said[-12:]),
        "replaced": sorted(name for name, p in before.items() if after.get(name) != p),
    }


def kill_replica(stack: StackHandle, role: str, *, mark: Mark = _no_mark) -> None:
    """kill -9 the second replica of a role, then start it again as it was started."""
    name = f"{role}-2"
    record = stack.run_dir / "roles" / f"{name}.json"
    if not record.exists():
        raise MissingPiece(f"no {record}: HA faults need `make up ... REPLICAS=2`")
    pid = int(json.loads(record.read_text()).get("pid") or 0)
    mark("killed")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    mark("restarted")
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


def fault_actions(stack: StackHandle) -> dict[str, Callable[[FaultEvent, Mark], object]]:
    """The faults that run in the background until healed: kind → action(event, mark)."""
    return {
        RESTART: lambda e, _m: stack.restart_role(e.target),
        PG_RESTART: lambda _e, _m: stack.restart_pg(),
        ETCD_LEADER_KILL: lambda _e, m: kill_etcd_leader(stack, mark=m),
        QUORUM_LOSS: lambda e, m: lose_quorum(stack, e.seconds, mark=m),
        REPLICA_KILL: lambda e, m: kill_replica(stack, e.target, mark=m),
        ETCD_FOLLOWER_KILL: lambda _e, m: kill_etcd_follower(stack, mark=m),
        ETCD_LEADER_CUT: lambda e, m: cut_etcd_leader(stack, e.seconds, mark=m),
        REPLICA_STALL: lambda e, m: stall_replica(stack, e.target, e.seconds, mark=m),
        REPLICA_DOWN: lambda e, m: down_replica(stack, e.target, e.seconds, mark=m),
        PG_KILL: lambda _e, m: kill_postmaster(stack, mark=m),
    }
