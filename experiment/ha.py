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
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import requests

from devstack import (
    DB_URL_ENV,
    PROJECT,
    PYTHON,
    URL_ENV,
    EtcdServer,
    etcd_cluster,
    etcd_healthy,
    netcut,
    pid_alive,
    ready,
    restart_role,
    state_root,
    wait_until,
)
from devstack.common import REPLICATED_ROLES
from experiment.stack import MissingPiece

if TYPE_CHECKING:
    from experiment.probes import Attempt
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


# -- the recovery measurement (issue 16, Measure) ----------------------------------------------

RECOVERY_GOAL_S = 3.0
# Which probers a fault is about (the others are reported too: their continuity is the point).
FAULT_ROLES = {
    "etcd_leader_kill": "lockserver",
    "etcd_leader_cut": "lockserver",
    "etcd_follower_kill": "lockserver",
    "quorum_loss": "lockserver",
    "pg_kill": "lockserver",  # etcd-backed lock-servers must keep serving through it
}
# The instance a fault takes down, as its prober is named: replica_kill kills `<role>-2` (the
# second URL), a stall or a down replica the first (the one the executors use).
VICTIM = {"replica_kill": "r2", "replica_stall": "r1", "replica_down": "r1"}
ETCD_PROBER = "etcd/cluster"
ETCD_KINDS = ("etcd_leader_kill", "etcd_follower_kill", "etcd_leader_cut", "quorum_loss")
DLOCK_SHARE_GOAL_S = 1.0


def fault_role(kind: str, target: str) -> str:
    return FAULT_ROLES.get(kind, target)


def probe_recovery(
    attempts: list[Attempt], *, at: float, healed: float | None, healthy: float | None = None
) -> dict:
    """One prober around one fault: the last success that ended before `at`, the first success
    that started at or after it, the outage between `at` and that success's end, the failures in
    between (by code), and — when the victim was started again at `healed` — the time from then
    (and from `healthy`, when the fault's action saw every victim healthy again)."""
    before = [a.end for a in attempts if a.ok and a.end <= at]
    after = [a for a in attempts if a.ok and a.start >= at]
    first = min(after, key=lambda a: a.end) if after else None
    until = first.end if first else float("inf")
    failed = Counter(a.code for a in attempts if not a.ok and at <= a.start < until)
    return {
        "last_ok_before": round(before[-1], 3) if before else None,
        "first_ok_after": round(first.end, 3) if first else None,
        "outage_s": round(first.end - at, 3) if first else None,
        "after_restart_s": (
            round(max(0.0, first.end - healed), 3) if first and healed is not None else None
        ),
        "after_healthy_s": (
            round(first.end - healthy, 3) if first and healthy is not None else None
        ),
        "failed_attempts": sum(failed.values()),
        "failed_codes": dict(failed.most_common()),
    }


def rate(times: list[float], lo: float, hi: float) -> float | None:
    """Events per second in [lo, hi); None for an empty window."""
    if hi - lo <= 0:
        return None
    return round(sum(1 for t in times if lo <= t < hi) / (hi - lo), 2)


def fault_recovery(
    windows: list[dict],
    probes: dict[str, list[Attempt]],
    posted: list[float],
    *,
    settle_s: float,
    executor_logs: list[tuple[float, str, str]] | None = None,
) -> list[dict]:
    """Per HA fault (in the order injected): every prober's recovery, and payouts/s in the
    `settle_s` before the fault, while it lasted (kill → victim healthy again) and the
    `settle_s` after. `posted` = the arm-clock times of the POSTED transitions. For etcd faults,
    the split of each lock-server prober's outage into etcd's own time and dlock's; for a
    replica kept down or stalled, what the executors logged meanwhile (`executor_logs`: (arm
    time, level, event) per line)."""
    faults = sorted((w for w in windows if w["kind"] in HA_KINDS), key=lambda w: w["start"])
    out = []
    for w in faults:
        at = float(w.get("killed", w["start"]))
        healed = w.get("restarted")
        end = float(w["end"])
        role = fault_role(w["kind"], w["target"])
        victim = VICTIM.get(w["kind"])
        recovery = {
            name: probe_recovery(attempts, at=at, healed=healed, healthy=end)
            for name, attempts in probes.items()
        }
        fault = {
            "kind": w["kind"],
            "target": w["target"],
            "role": role,
            "killed": f"{role}/{victim}" if victim else None,
            "at": round(at, 3),
            "restarted": None if healed is None else round(float(healed), 3),
            "healthy": round(end, 3),
            "probes": recovery,
            "payouts_per_s": {
                "before": rate(posted, at - settle_s, at),
                "during": rate(posted, at, end),
                "after": rate(posted, end, end + settle_s),
            },
            "window_s": {"before": settle_s, "during": round(end - at, 3), "after": settle_s},
            "outcome": w.get("outcome") or {},
        }
        if w["kind"] in ETCD_KINDS and ETCD_PROBER in recovery:
            # etcd's time from the members' restart after a quorum loss; from the fault itself
            # when the cluster kept a quorum (it may serve again before the victim is back)
            since = healed if w["kind"] == "quorum_loss" else at
            fault["split"] = etcd_split(recovery, since=since)
            fault["split"]["since"] = "restart" if w["kind"] == "quorum_loss" else "fault"
        if w["kind"] in ("replica_down", "replica_stall") and executor_logs is not None:
            until = float(healed) if healed is not None else end
            fault["executor_log"] = log_counts(executor_logs, at, until)
        out.append(fault)
    return out


def etcd_split(recovery: dict[str, dict], *, since: float | None) -> dict:
    """etcd's own time — its first successful request after the fault, counted from `since`
    (the members' restart after a quorum loss) — and dlock's share per lock-server prober: its
    first success after etcd's."""
    etcd_ok = recovery[ETCD_PROBER]["first_ok_after"]
    split: dict = {
        "etcd_first_ok": etcd_ok,
        "etcd_s": (
            round(max(0.0, etcd_ok - since), 3)
            if etcd_ok is not None and since is not None
            else None
        ),
        "dlock_s": {},
    }
    for name, r in recovery.items():
        if name.startswith("lockserver/"):
            first = r["first_ok_after"]
            split["dlock_s"][name] = (
                round(max(0.0, first - etcd_ok), 3)
                if first is not None and etcd_ok is not None
                else None
            )
    return split


def executor_log_lines(logdir: Path, *, wall0: float) -> list[tuple[float, str, str]]:
    """(arm time, level, event) of every JSON line the executors logged."""
    lines = []
    for path in sorted(logdir.glob("*.log")):
        for raw in path.read_text(errors="replace").splitlines():
            if not raw.startswith("{"):
                continue
            try:
                entry = json.loads(raw)
                at = datetime.fromisoformat(entry["ts"]).timestamp() - wall0
            except (ValueError, KeyError, TypeError):
                continue
            lines.append((at, str(entry.get("level", "")), str(entry.get("event", ""))))
    return lines


def log_counts(lines: list[tuple[float, str, str]], lo: float, hi: float) -> dict:
    """WARNING lines and events per second the executors logged in [lo, hi)."""
    inside = [(level, event) for at, level, event in lines if lo <= at < hi]
    seconds = max(hi - lo, 1e-9)
    events = Counter(event for _level, event in inside)
    warnings = sum(1 for level, _ in inside if level in ("WARNING", "ERROR"))
    return {
        "seconds": round(hi - lo, 3),
        "warnings": warnings,
        "warnings_per_s": round(warnings / seconds, 2),
        "events": dict(events.most_common(8)),
        "lock_failed_per_s": round(events.get("executor_lock_failed", 0) / seconds, 2),
    }


HA_KINDS = (
    "etcd_leader_kill",
    "etcd_follower_kill",
    "etcd_leader_cut",
    "quorum_loss",
    "replica_kill",
    "replica_stall",
    "replica_down",
    "pg_kill",
)


def recovery_lines(recovery: list[dict], *, goal_s: float = RECOVERY_GOAL_S) -> list[str]:
    """The per-fault, per-replica table as text (the command prints it; docs copy it)."""
    lines = [
        "fault | prober | last ok before | first ok after | outage | after restart | failed (codes)"
    ]
    for fault in recovery:
        rates = fault["payouts_per_s"]
        lines.append(
            f"{fault['kind']} {fault['target']}".strip()
            + f" @{fault['at']:.2f}s (restarted {_s(fault['restarted'])}, healthy"
            f" {_s(fault['healthy'])}); POSTED/s before {_n(rates['before'])}"
            f" during {_n(rates['during'])} after {_n(rates['after'])}"
        )
        for name, p in fault["probes"].items():
            if not name.startswith(fault["role"] + "/"):
                continue
            outage = p["outage_s"]
            if name == fault["killed"]:
                flag = "  (the killed replica: until it was restarted and ready)"
            else:
                flag = "" if outage is not None and outage <= goal_s else "  > goal"
            codes = " ".join(f"{c}×{n}" for c, n in p["failed_codes"].items()) or "-"
            lines.append(
                f"  {name:<16} {_s(p['last_ok_before']):>9} {_s(p['first_ok_after']):>9}"
                f" {_s(outage):>8} {_s(p['after_restart_s']):>8}"
                f"  {p['failed_attempts']} ({codes}){flag}"
            )
        lines += _extra_lines(fault)
    return lines


def _extra_lines(fault: dict) -> list[str]:
    lines = []
    split = fault.get("split")
    if split:
        shares = ", ".join(
            f"{name.split('/', 1)[1]} {_s(share)}"
            + ("" if share is not None and share <= DLOCK_SHARE_GOAL_S else " > goal")
            for name, share in split["dlock_s"].items()
        )
        since = "the restart" if split.get("since", "restart") == "restart" else "the fault"
        lines.append(
            f"  split: etcd's first ok {_s(split['etcd_s'])} after {since}; dlock's share"
            f" (first acquire after etcd's first ok): {shares}"
        )
    logged = fault.get("executor_log")
    if logged:
        lines.append(
            f"  executors logged {logged['warnings']} WARNING lines in {logged['seconds']:.1f}s"
            f" ({logged['warnings_per_s']:.1f}/s), executor_lock_failed"
            f" {logged['lock_failed_per_s']:.1f}/s; events {logged['events']}"
        )
    outcome = fault.get("outcome") or {}
    if "cut" in outcome:
        lines.append(f"  {outcome['victim']} cut off by {outcome['cut']}")
    if "replaced" in outcome:
        waited = [
            line.split("] ", 1)[-1].split(" is alive")[0]
            for line in outcome.get("make_up_waited", [])
        ]
        lines.append(
            f"  make up after the restart: exit {outcome['make_up_exit']}, replaced"
            f" {', '.join(outcome['replaced']) or 'nothing'}"
            + (f"; waited for {', '.join(waited)} (alive, not ready yet)" if waited else "")
        )
    return lines


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}s"


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
