"""Every dlock metric, declared once; each labelled series exists at 0 from start-up.

No id (payout, account, session, key) is ever a label (NFR-09).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

FENCED_RESOURCES = ("account", "ledger", "rail")
RAIL_OUTCOMES = ("acked", "fenced", "duplicate", "timeout", "declined", "not_sent", "replayed")
EXECUTE_OUTCOMES = (
    "posted",
    "failed",
    "ambiguous",
    "fenced_out",
    "not_claimable",
    "duplicate",
    "lock_contended",
    "lock_lost",
    "error",
)
LOCK_BACKENDS = ("pg", "etcd")
ACQUIRE_OUTCOMES = (
    "granted",
    "contended",
    "contention_exceeded",
    "session_unknown",
    "session_expired",
    "not_leader",
)

lock_fenced_out = Counter(
    "lock_fenced_out",
    "Writes rejected because a newer fencing token already touched the resource.",
    ["resource"],
)
rail_duplicate_attempted = Counter(
    "rail_duplicate_attempted",
    "Submissions refused because the payout already has a rail submission record.",
)
rail_submission = Counter(
    "rail_submission", "Rail submissions by outcome (recorded by the rail proxy).", ["outcome"]
)
payout_execute = Counter(
    "payout_execute", "Executor critical sections by final outcome.", ["outcome"]
)
payout_backlog_age = Gauge(
    "payout_backlog_age_seconds", "Age of the oldest PENDING payout the executor last saw."
)
lock_acquire = Counter(
    "lock_acquire", "Lock acquire calls by backend and outcome.", ["backend", "outcome"]
)
requests_shed = Counter(
    "dlock_requests_shed",
    "Requests answered 503 OVERLOADED before Django: older than SERVER_QUEUE_DEADLINE_MS "
    "when a worker thread took them (dlock.admission).",
)
executor_inflight = Gauge(
    "executor_inflight", "Executor critical sections in flight in this process right now."
)
payout_execute_seconds = Histogram(
    "payout_execute_seconds",
    "Executor section duration, pick to posted or final state, by outcome.",
    ["outcome"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
BACKOFF_REASONS = ("fenced_out", "not_claimable", "duplicate", "error", "token_reused")
executor_backoff = Counter(
    "executor_backoff",
    "Back-off steps the executor took on an account it could not progress, by reason.",
    ["reason"],
)
lock_live_sessions = Gauge("lock_live_sessions", "Unexpired lock-server sessions.", ["backend"])
lock_live_grants = Gauge("lock_live_grants", "Unexpired lock grants.", ["backend"])


def _zero_series() -> None:
    for resource in FENCED_RESOURCES:
        lock_fenced_out.labels(resource=resource)
    for outcome in RAIL_OUTCOMES:
        rail_submission.labels(outcome=outcome)
    for outcome in EXECUTE_OUTCOMES:
        payout_execute.labels(outcome=outcome)
    for outcome in EXECUTE_OUTCOMES:
        payout_execute_seconds.labels(outcome=outcome)
    for reason in BACKOFF_REASONS:
        executor_backoff.labels(reason=reason)
    for backend in LOCK_BACKENDS:
        lock_live_sessions.labels(backend=backend)
        lock_live_grants.labels(backend=backend)
        for outcome in ACQUIRE_OUTCOMES:
            lock_acquire.labels(backend=backend, outcome=outcome)


_zero_series()
