"""The HA recovery measurement: per fault and per replica, how long until the service answered
again, what the payouts did in the windows around it, and the lines the report prints.

The faults themselves are in `experiment.ha`; the probers that feed this in `experiment.probes`.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from experiment.probes import Attempt

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
