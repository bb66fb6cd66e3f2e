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
from collections import Counter
from collections.abc import Callable
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
FAULT_ROLES = {"etcd_leader_kill": "lockserver", "quorum_loss": "lockserver"}


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
) -> list[dict]:
    """Per HA fault (in the order injected): every prober's recovery, and payouts/s in the
    `settle_s` before the fault, while it lasted (kill → victim healthy again) and the
    `settle_s` after. `posted` = the arm-clock times of the POSTED transitions."""
    faults = sorted((w for w in windows if w["kind"] in HA_KINDS), key=lambda w: w["start"])
    out = []
    for w in faults:
        at = float(w.get("killed", w["start"]))
        healed = w.get("restarted")
        end = float(w["end"])
        role = fault_role(w["kind"], w["target"])
        out.append(
            {
                "kind": w["kind"],
                "target": w["target"],
                "role": role,
                # kill_replica kills `<role>-2`, the second URL of the role's list
                "killed": f"{role}/r2" if w["kind"] == "replica_kill" else None,
                "at": round(at, 3),
                "restarted": None if healed is None else round(float(healed), 3),
                "healthy": round(end, 3),
                "probes": {
                    name: probe_recovery(attempts, at=at, healed=healed, healthy=end)
                    for name, attempts in probes.items()
                },
                "payouts_per_s": {
                    "before": rate(posted, at - settle_s, at),
                    "during": rate(posted, at, end),
                    "after": rate(posted, end, end + settle_s),
                },
                "window_s": {"before": settle_s, "during": round(end - at, 3), "after": settle_s},
            }
        )
    return out


HA_KINDS = ("etcd_leader_kill", "quorum_loss", "replica_kill")


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
    return lines


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}s"


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
