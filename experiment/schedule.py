"""The seeded fault schedule: one list of timed events, replayed identically on both arms.

Everything is derived from `random.Random(seed)`, the duration, the number of workers and the
lease TTL, so `--seed S` replays a failing run exactly (up to the scheduler's own jitter).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

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
HA_FAULTS = (ETCD_LEADER_KILL, QUORUM_LOSS, REPLICA_KILL)

RAIL_WINDOWS = (RAIL_LATENCY, RAIL_FAILURES, DUPLICATE_ACK)
RESTART_ROLES = ("railproxy", "payments", "lockserver")


@dataclass(frozen=True)
class FaultEvent:
    at: float  # seconds after the arm started
    kind: str
    target: str = ""  # worker index, role name or ""
    seconds: float = 0.0  # how long the fault lasts (pause, window); 0 = instantaneous
    params: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def build_schedule(
    *,
    seed: int,
    duration: float,
    workers: int,
    lease_ms: int,
    pg_restart: bool = True,
    ha: bool = False,
) -> list[FaultEvent]:
    """Every fault kind at least once; pauses cycle through every phase of the critical section.
    `ha` adds the HA faults (drawn after the others, so the rest of the schedule is the same)."""
    rng = random.Random(seed)
    lease_s = lease_ms / 1000
    events: list[FaultEvent] = []
    start, end = 0.08 * duration, 0.85 * duration

    def when(lo: float = start, hi: float = end) -> float:
        return round(rng.uniform(lo, hi), 2)

    # Pauses, one after another (a rival must be running to take the lapsed lease over and
    # advance the fences), cycling through every phase of the critical section, random victims.
    at, i = start, 0
    while at < end:
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
        at += seconds + rng.uniform(2.5, 3.5)
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
    return sorted(events, key=lambda e: (e.at, e.kind, e.target))


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
RECOVERY_FAULTS = (
    (ETCD_LEADER_KILL, ""),
    (QUORUM_LOSS, ""),
    (REPLICA_KILL, "lockserver"),
    (REPLICA_KILL, "payments"),
    (REPLICA_KILL, "railproxy"),
)
RECOVERY_SETTLE_S = 8.0
QUORUM_OUTAGE_S = 5.0


def recovery_schedule(*, settle_s: float = RECOVERY_SETTLE_S) -> list[FaultEvent]:
    """Nominal times `settle_s` apart, the first after two settles (executors boot and payouts
    flow before it); the runner defers each until the previous one healed and settled."""
    return [
        FaultEvent(
            at=round(settle_s * (n + 2), 2),
            kind=kind,
            target=target,
            seconds=QUORUM_OUTAGE_S if kind == QUORUM_LOSS else 0.0,
            params={"settle": settle_s},
        )
        for n, (kind, target) in enumerate(RECOVERY_FAULTS)
    ]


def recovery_duration(settle_s: float = RECOVERY_SETTLE_S) -> float:
    """A fault phase long enough for the recovery schedule on an idle box (it runs longer when
    a heal takes longer: the runner keeps going until the last fault healed and settled)."""
    heals = 4.0 + (QUORUM_OUTAGE_S + 3.0) + 3 * 5.0
    return round(settle_s * (len(RECOVERY_FAULTS) + 2) + heals, 1)


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
