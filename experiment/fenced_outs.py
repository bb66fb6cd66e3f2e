"""Which fenced-outs the fault schedule explains, and which it does not.

A fenced-out is the system's alarm: a writer presented a token below a resource's fence, so
someone newer holds (or held) the lock. In the experiment that is the point — but only when a
fault we injected made the writer stale. A lock server handing out tokens below the fences
(restarted on another backend, a token reused after a timed-out release) fences out writers
that were never stale, and a run full of those must never read as "stale writers fenced out".

A fenced-out event (from the executor's own `executor_fenced_out` log line: owner, token, time,
resource) is **explained** when both hold:

1. its writer could really be stale: its grant was revoked by the schedule (same key, token at
   or below the revoked one), or the section had outlived its lease (time since the grant or
   its last renewal ≥ the lease TTL, less a small tolerance for logging after the grant);
2. a scheduled fault overlapped the section and can make a section outlive its lease: a pause
   or kill of that very worker, or a window that slows every worker (rail latency, rail
   failures that hold the connection, a restart of a service role or of PostgreSQL; on an HA
   stack an etcd leader kill, a loss of quorum, a replica kill).

Anything else is **unexplained**, with the reason. Server-side fenced-outs no executor logged
(counted by /metrics or the proxy's FENCED rows) are attributed to a kill -9 of a worker in
the middle of that write, at most one per payout it had in flight (its `--concurrency`) per
kill; the rest are unexplained.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from experiment.recovery import HA_KINDS

# Fault kinds that slow every worker's section, and kinds that hit one worker.
SLOWING = ("rail_latency", "rail_failures", "restart", "pg_restart", *HA_KINDS)
PER_WORKER = ("pause", "kill")
REVOKE = "revoke"


@dataclass(frozen=True)
class Fault:
    """A fault as it was really injected: a window of time (seconds since the arm started)."""

    kind: str
    start: float
    end: float
    owner: str = ""  # pause / kill: the worker it hit
    key: str = ""  # revoke: the lock key
    token: int | None = None  # revoke: the token evicted
    target: str = ""  # restart: the role
    phase: str = ""  # pause: the phase the worker stopped in; revoke: its pause's phase

    def label(self) -> str:
        who = self.owner or self.key or self.target
        return f"{self.kind} {who}".strip() + f" @{self.start:.1f}–{self.end:.1f}s"


@dataclass(frozen=True)
class FencedOutEvent:
    at: float  # seconds since the arm started
    owner: str
    token: int | None
    resource: str
    key: str = ""
    payout_id: str = ""
    granted_at: float | None = None  # this section's grant (seconds since the arm started)
    valid_from: float | None = None  # the grant or its last renewal, whichever is later
    source: str = "executor log"


def classify_one(
    event: FencedOutEvent, faults: Iterable[Fault], *, lease_s: float
) -> tuple[bool, str]:
    """(explained, why) for one fenced-out event."""
    ok, why, _fault = _classify(event, list(faults), lease_s=lease_s)
    return ok, why


def _classify(
    event: FencedOutEvent, faults: list[Fault], *, lease_s: float
) -> tuple[bool, str, Fault | None]:
    """(explained, why, the fault that explains it)."""
    for fault in faults:
        if (
            fault.kind == REVOKE
            and fault.key
            and fault.key == event.key
            and event.at >= fault.start
            and (fault.token is None or event.token is None or event.token <= fault.token)
        ):
            return True, f"its grant was revoked: {fault.label()}", fault
    if event.granted_at is None:
        return False, "no section start for this owner and token in the worker's log", None
    valid_from = event.valid_from if event.valid_from is not None else event.granted_at
    age = event.at - valid_from
    tolerance = min(0.5, 0.25 * lease_s)  # the grant is logged a moment after it was issued
    if age < lease_s - tolerance:
        return (
            False,
            f"the writer was not stale: its grant was {age:.2f}s old (lease {lease_s:g}s) and"
            " not revoked — a fence above the lock server's tokens (a lock server on another"
            " backend or cluster? a token handed out twice?)",
            None,
        )
    for fault in faults:
        overlaps = fault.start <= event.at and fault.end >= event.granted_at
        if not overlaps:
            continue
        if fault.kind in PER_WORKER and fault.owner == event.owner:
            return True, f"its section outlived the lease ({age:.2f}s): {fault.label()}", fault
        if fault.kind in SLOWING:
            return True, f"its section outlived the lease ({age:.2f}s): {fault.label()}", fault
    return (
        False,
        f"its section outlived the lease ({age:.2f}s, lease {lease_s:g}s) but no scheduled"
        " fault overlapped it",
        None,
    )


def classify(
    events: Iterable[FencedOutEvent],
    faults: Iterable[Fault],
    *,
    lease_s: float,
    unseen: dict[str, int] | None = None,
    kills: int = 0,
    per_kill: int = 1,
) -> dict:
    """Every fenced-out, explained or unexplained. `unseen`: per resource, fenced-outs counted
    server-side that no executor logged (attributed to kills, at most `per_kill` each: a
    process with N payouts in flight can be killed in the middle of N writes)."""
    faults = list(faults)
    explained: list[dict] = []
    unexplained: list[dict] = []
    by_phase: dict[str, int] = {}
    for event in sorted(events, key=lambda e: e.at):
        ok, why, fault = _classify(event, faults, lease_s=lease_s)
        entry = {**asdict(event), "why": why}
        (explained if ok else unexplained).append(entry)
        if ok and fault is not None:
            # the critical-section phase its pause stopped it in; else the fault's kind
            phase = fault.phase or fault.kind
            entry["phase"] = phase
            by_phase[phase] = by_phase.get(phase, 0) + 1
    kills_left = kills * max(1, per_kill)
    for resource, n in sorted((unseen or {}).items()):
        for _ in range(n):
            entry = {"resource": resource, "source": "server-side count, no executor log line"}
            if kills_left > 0:
                kills_left -= 1
                explained.append({**entry, "why": "a worker killed -9 during this write"})
                by_phase["kill"] = by_phase.get("kill", 0) + 1
            else:
                unexplained.append(
                    {**entry, "why": "counted by the resource, logged by no executor, no kill"}
                )
    return {
        "explained": len(explained),
        "unexplained": len(unexplained),
        "explained_by_phase": dict(sorted(by_phase.items())),
        "explained_events": explained[:200],
        "unexplained_events": unexplained[:200],
    }


def _seconds(ts: str | None, wall0: float) -> float | None:
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts).timestamp() - wall0
    except ValueError:
        return None


def events_from_logs(logdir: Path, *, wall0: float) -> list[FencedOutEvent]:
    """`executor_fenced_out` lines of the executors' logs, each with its section's grant time
    (`executor_section_started`) and last renewal (`executor_renewed`), same owner and token."""
    events: list[FencedOutEvent] = []
    for path in sorted(logdir.glob("*.log")):
        # A section is (owner, token): tokens are unique across keys (PostgreSQL's sequence,
        # etcd's revision), so the interleaved lines of one concurrent executor's sections
        # (issue 17: one owner id, several sections at once) never mix.
        granted: dict[tuple[str, object], tuple[float | None, str]] = {}
        renewed: dict[tuple[str, object], float | None] = {}
        for line in path.read_text(errors="replace").splitlines():
            if '"executor_' not in line:
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            name = entry.get("event")
            ident = (str(entry.get("ownerId") or ""), entry.get("token"))
            at = _seconds(entry.get("ts"), wall0)
            if name == "executor_section_started":
                granted[ident] = (at, str(entry.get("key") or ""))
                renewed.pop(ident, None)
            elif name == "executor_renewed":
                renewed[ident] = at
            elif name == "executor_fenced_out" and at is not None:
                details = entry.get("details") or {}
                granted_at, key = granted.get(ident, (None, ""))
                renewal = renewed.get(ident)
                events.append(
                    FencedOutEvent(
                        at=at,
                        owner=ident[0],
                        token=_int(entry.get("token")),
                        resource=str(details.get("resourceType") or "unknown"),
                        key=key,
                        payout_id=str(entry.get("payoutId") or ""),
                        granted_at=granted_at,
                        valid_from=max(granted_at, renewal)
                        if granted_at is not None and renewal is not None
                        else granted_at,
                    )
                )
    return events


def _int(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
