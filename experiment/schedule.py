"""The seeded fault schedule: one list of timed events, replayed identically on both arms.

Everything is derived from `random.Random(seed)`, the duration, the number of workers and the
lease TTL, so `--seed S` replays a failing run exactly (up to the scheduler's own jitter).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, replace

from experiment.naive import PHASES

# The order pauses cycle through: the phases where a stale writer does damage first.
PAUSE_ORDER = ("claimed", "submitted", "locked", "posted")
assert set(PAUSE_ORDER) == set(PHASES)

# Kinds of fault, as they appear in the report and on the chart.
PAUSE = "pause"  # SIGSTOP a worker for longer than the lease, then SIGCONT
KILL = "kill"  # kill -9 a worker mid critical section and start a replacement
RESTART = "restart"  # restart a service role (railproxy, payments, lockserver)
PG_RESTART = "pg_restart"  # restart the PostgreSQL server
RAIL_LATENCY = "rail_latency"  # rail slower than the lease TTL
RAIL_FAILURES = "rail_failures"  # 5xx, drop before booking, drop after booking
DUPLICATE_ACK = "duplicate_ack"  # the rail books a repeated clientRef twice on its own

# HA faults (issue 16 §7), only on a stack of 3 etcd members and 2 replicas per role.
ETCD_LEADER_KILL = "etcd_leader_kill"  # kill -9 the etcd leader, start it again 2 s later
QUORUM_LOSS = "quorum_loss"  # kill -9 two of three etcd members for `seconds` (≥ 5)
REPLICA_KILL = "replica_kill"  # kill -9 the second replica of a role, start it again
# Issue 27 item 6 (the recovery run): SIGSTOP the lock-server replica the executors use (the
# first URL of LOCK_SERVER_URL), SIGCONT after `seconds`; kill -9 it and keep it down for
# `seconds` (refused connections: what the clients' backoff meets); kill -9 the postmaster and
# start PostgreSQL again (etcd-backed lock-servers keep serving, none is replaced).
REPLICA_STALL = "replica_stall"
REPLICA_DOWN = "replica_down"
PG_KILL = "pg_kill"
ETCD_FOLLOWER_KILL = "etcd_follower_kill"  # kill -9 a member that is not the leader, 2 s down
# The leader partitioned from peers and clients alike for `seconds` (nftables drops its sockets'
# packets, devstack.netcut; SIGSTOP where the machine cannot): calls to it time out after they
# were sent, instead of being refused.
ETCD_LEADER_CUT = "etcd_leader_cut"
HA_FAULTS = (
    ETCD_LEADER_KILL,
    ETCD_FOLLOWER_KILL,
    ETCD_LEADER_CUT,
    QUORUM_LOSS,
    REPLICA_KILL,
    REPLICA_STALL,
    REPLICA_DOWN,
    PG_KILL,
)

RAIL_WINDOWS = (RAIL_LATENCY, RAIL_FAILURES, DUPLICATE_ACK)
RESTART_ROLES = ("railproxy", "payments", "lockserver")


# What a fault takes down (its scope): two faults never overlap on one scope (issue 27 item 4).
# Worker faults (pauses, kills) and rail windows have none.
ETCD, POSTGRES = "etcd", "postgres"
_SCOPED_BY_TARGET = (RESTART, REPLICA_KILL, REPLICA_STALL, REPLICA_DOWN)
_SCOPES = {
    ETCD_LEADER_KILL: ETCD,
    ETCD_FOLLOWER_KILL: ETCD,
    ETCD_LEADER_CUT: ETCD,
    QUORUM_LOSS: ETCD,
    PG_RESTART: POSTGRES,
    PG_KILL: POSTGRES,
}
# How long a scoped fault is expected to keep its scope busy (its own seconds come on top), and
# the gap left after it: the schedule spaces faults by these; the runner also defers a fault
# while another one on its scope is still healing, whatever the box's speed.
HEAL_S = {
    RESTART: 8.0,
    REPLICA_KILL: 8.0,
    REPLICA_STALL: 3.0,
    REPLICA_DOWN: 8.0,
    PG_RESTART: 8.0,
    PG_KILL: 8.0,
    ETCD_LEADER_KILL: 2.0 + 5.0,
    ETCD_FOLLOWER_KILL: 2.0 + 5.0,
    ETCD_LEADER_CUT: 5.0,
    QUORUM_LOSS: 5.0,
}
SCOPE_GAP_S = 2.0


def fault_scope(kind: str, target: str = "") -> str:
    """The role (or etcd, postgres) a fault takes down; "" for faults that take down none."""
    if kind in _SCOPED_BY_TARGET:
        return target
    return _SCOPES.get(kind, "")


@dataclass(frozen=True)
class FaultEvent:
    at: float  # seconds after the arm started
    kind: str
    target: str = ""  # worker index, role name or ""
    seconds: float = 0.0  # how long the fault lasts (pause, window); 0 = instantaneous
    params: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def scope(self) -> str:
        return fault_scope(self.kind, self.target)

    @property
    def span(self) -> float:
        """Seconds its scope is expected to stay busy, the gap after it included."""
        return self.seconds + HEAL_S.get(self.kind, 0.0) + SCOPE_GAP_S


def separate(events: list[FaultEvent], *, lo: float, hi: float) -> list[FaultEvent]:
    """Move scoped faults so that no two on one scope overlap: each to the first time at or
    after its own where its span is free (else the first free time after `lo`), kept before
    `hi` when there is room. Unscoped events are left alone; the HA faults give way to the
    others (so the rest of an `--ha` schedule is the schedule without it)."""
    booked: dict[str, list[tuple[float, float]]] = {}
    out = []
    for event in sorted(events, key=lambda e: (e.kind in HA_FAULTS, e.at, e.kind, e.target)):
        if not event.scope:
            out.append(event)
            continue
        taken = booked.setdefault(event.scope, [])
        at = _first_free(taken, event.at, event.span, hi)
        if at is None:
            at = _first_free(taken, lo, event.span, hi)
        if at is None:  # no room (a short run): as late as allowed; the runner defers it
            at = min(max([event.at, *(end for _, end in taken)]), hi)
        taken.append((at, at + event.span))
        out.append(replace(event, at=round(at, 2)))
    return sorted(out, key=lambda e: (e.at, e.kind, e.target))


def _first_free(taken: list[tuple[float, float]], start: float, span: float, hi: float):
    for at in sorted({start, *(end for _, end in taken if end >= start)}):
        if at + span - SCOPE_GAP_S > hi:
            return None
        if all(at + span <= lo or at >= end for lo, end in taken):
            return at
    return None


def overlapping(windows: list[dict]) -> list[dict]:
    """Double faults: pairs of injected windows on one scope whose times overlap (the runner's
    deferral makes this empty; reported, never hidden, when it is not)."""
    scoped = sorted(
        (w for w in windows if fault_scope(w["kind"], str(w.get("target", "")))),
        key=lambda w: w["start"],
    )
    found = []
    for i, first in enumerate(scoped):
        scope = fault_scope(first["kind"], str(first.get("target", "")))
        end = first["end"] if first["end"] is not None else float("inf")
        for second in scoped[i + 1 :]:
            if second["start"] >= end:
                break
            if fault_scope(second["kind"], str(second.get("target", ""))) == scope:
                found.append(
                    {
                        "scope": scope,
                        "first": f"{first['kind']} {first.get('target', '')}".strip(),
                        "second": f"{second['kind']} {second.get('target', '')}".strip(),
                        "at": round(float(second["start"]), 2),
                    }
                )
    return found


def build_schedule(
    *,
    seed: int,
    duration: float,
    workers: int,
    lease_ms: int,
    pg_restart: bool = True,
    ha: bool = False,
    pauses: int | None = None,
) -> list[FaultEvent]:
    """Every fault kind at least once; pauses cycle through every phase of the critical section.
    `ha` adds the HA faults (drawn after the others). `pauses` = exactly that many pauses, spread
    over the first half (the CI preset: the runner goes on until each has landed); None = one
    after another for as long as the fault phase lasts. No two faults overlap on one role, on
    etcd or on PostgreSQL (`separate`)."""
    rng = random.Random(seed)
    lease_s = lease_ms / 1000
    events: list[FaultEvent] = []
    start, end = 0.08 * duration, 0.85 * duration

    def when(lo: float = start, hi: float = end) -> float:
        return round(rng.uniform(lo, hi), 2)

    # Pauses, one after another (a rival must be running to take the lapsed lease over and
    # advance the fences), cycling through every phase of the critical section, random victims.
    at, i = start, 0
    step = (0.5 * duration - start) / pauses if pauses else 0.0
    while (i < pauses) if pauses else (at < end):
        seconds = round(lease_s * rng.uniform(3.0, 4.0), 2)
        events.append(
            FaultEvent(
                at=round(at, 2),
                kind=PAUSE,
                target=str(rng.randrange(workers)),
                seconds=seconds,
                # The first pause also has an operator revoke the victim's lock while it
                # sleeps (L8 + fence push): a stale writer that exists whatever the rivals do.
                params={"phase": PAUSE_ORDER[i % len(PAUSE_ORDER)], "revoke": i == 0},
            )
        )
        # Room for the real executor's armed replacement to boot before the next pause.
        gap = seconds + rng.uniform(2.5, 3.5)
        at += step if pauses else gap
        i += 1
    # kill -9 mid section, twice, in the second half with the restarts (a kill during a pause
    # would take out the rival that must take the lapsed lease over).
    for _ in range(2):
        events.append(
            FaultEvent(at=when(0.6 * duration, end), kind=KILL, target=str(rng.randrange(workers)))
        )
    # Service restarts in the second half: the first half belongs to clean stale-writer races.
    slots = sorted(when(0.6 * duration, 0.88 * duration) for _ in RESTART_ROLES)
    roles = list(RESTART_ROLES)
    rng.shuffle(roles)
    events += [
        FaultEvent(at=at, kind=RESTART, target=role) for at, role in zip(slots, roles, strict=True)
    ]
    if pg_restart:
        events.append(FaultEvent(at=when(0.6 * duration, 0.8 * duration), kind=PG_RESTART))
    events += rail_windows(rng, duration, lease_ms, start)
    if ha:
        events += ha_faults(rng, duration)
    return separate(events, lo=0.5 * duration, hi=0.95 * duration)


def rail_windows(
    rng: random.Random, duration: float, lease_ms: int, start: float
) -> list[FaultEvent]:
    """Duplicate acks early (they slow nobody); latency above the lease TTL (below the proxy's
    8 s read timeout) and failures in the middle, after the first pauses had rivals running at
    full speed. Windows may overlap; the rail's config is their merge."""

    def when(lo: float, hi: float) -> float:
        return round(rng.uniform(lo, hi), 2)

    events: list[FaultEvent] = []
    window = max(2.0, 0.18 * duration)
    events.append(
        FaultEvent(
            at=when(start, 0.45 * duration - window),
            kind=DUPLICATE_ACK,
            seconds=round(window, 2),
            params={"duplicate_ack_rate": 0.5},
        )
    )
    latency_ms = min(7000, int(lease_ms * 1.6))
    for _ in range(2):
        events.append(
            FaultEvent(
                at=when(0.45 * duration, 0.8 * duration - window),
                kind=RAIL_LATENCY,
                seconds=round(window, 2),
                params={"latency_ms": latency_ms},
            )
        )
    events.append(
        FaultEvent(
            at=when(0.45 * duration, 0.8 * duration - window),
            kind=RAIL_FAILURES,
            seconds=round(window, 2),
            params={"failure_rate": 0.3},
        )
    )
    return events


def ha_faults(rng: random.Random, duration: float) -> list[FaultEvent]:
    """The etcd leader killed early, quorum lost for ≥ 5 s mid-run, one replica of each role
    killed in the second half — apart from each other, so each recovery is measured alone."""
    outage = round(max(5.0, 0.12 * duration), 2)
    events = [
        FaultEvent(at=round(rng.uniform(0.15, 0.25) * duration, 2), kind=ETCD_LEADER_KILL),
        FaultEvent(
            at=round(rng.uniform(0.35, 0.45) * duration, 2), kind=QUORUM_LOSS, seconds=outage
        ),
    ]
    roles = list(RESTART_ROLES)
    rng.shuffle(roles)
    for n, role in enumerate(roles):
        at = (0.62 + 0.08 * n + rng.uniform(0, 0.04)) * duration
        events.append(FaultEvent(at=round(at, 2), kind=REPLICA_KILL, target=role))
    return events


# The recovery run (`--ha-recovery`): the HA faults alone, one at a time. Each waits until the
# previous one has healed (victim started and healthy) and `settle` seconds have passed.
# (kind, target): issue 16's five, then issue 27's — an etcd follower killed, the etcd leader
# partitioned (5 s), the lock-server replica the executors use stalled (SIGSTOP) for 15 s,
# then killed and kept down 5 s (refused connections), and PostgreSQL's postmaster killed -9
# and started again by `make up` (which must replace nothing).
STALL_S = 15.0
DOWN_S = 5.0
LEADER_CUT_S = 5.0
QUORUM_OUTAGE_S = 5.0
RECOVERY_FAULTS = (
    (ETCD_LEADER_KILL, ""),
    (QUORUM_LOSS, ""),
    (REPLICA_KILL, "lockserver"),
    (REPLICA_KILL, "payments"),
    (REPLICA_KILL, "railproxy"),
    (ETCD_FOLLOWER_KILL, ""),
    (ETCD_LEADER_CUT, ""),
    (REPLICA_STALL, "lockserver"),
    (REPLICA_DOWN, "lockserver"),
    (PG_KILL, ""),
)
FAULT_SECONDS = {
    QUORUM_LOSS: QUORUM_OUTAGE_S,
    REPLICA_STALL: STALL_S,
    REPLICA_DOWN: DOWN_S,
    ETCD_LEADER_CUT: LEADER_CUT_S,
}
RECOVERY_SETTLE_S = 8.0


def recovery_schedule(
    *, settle_s: float = RECOVERY_SETTLE_S, faults: tuple = RECOVERY_FAULTS
) -> list[FaultEvent]:
    """Nominal times `settle_s` apart, the first after two settles (executors boot and payouts
    flow before it); the runner defers each until the previous one healed and settled."""
    return [
        FaultEvent(
            at=round(settle_s * (n + 2), 2),
            kind=kind,
            target=target,
            seconds=FAULT_SECONDS.get(kind, 0.0),
            params={"settle": settle_s},
        )
        for n, (kind, target) in enumerate(faults)
    ]


def recovery_duration(
    settle_s: float = RECOVERY_SETTLE_S, faults: tuple = RECOVERY_FAULTS
) -> float:
    """A fault phase long enough for the recovery schedule on an idle box (it runs longer when
    a heal takes longer: the runner keeps going until the last fault healed and settled)."""
    heals = sum(FAULT_SECONDS.get(kind, 0.0) + 5.0 for kind, _ in faults)
    return round(settle_s * (len(faults) + 2) + heals, 1)


def rail_config_at(
    events: list[FaultEvent], t: float, *, base_latency_ms: int
) -> dict[str, float | int]:
    """The rail stub's config the schedule wants at time t (merge of active windows)."""
    config: dict[str, float | int] = {
        "latency_ms": base_latency_ms,
        "failure_rate": 0.0,
        "duplicate_ack_rate": 0.0,
    }
    for event in events:
        if event.kind in RAIL_WINDOWS and event.at <= t < event.at + event.seconds:
            for key, value in event.params.items():
                config[key] = max(config[key], value)
    return config
