"""Every dlock metric, declared once; each labelled series exists at 0 from start-up.

No id (payout, account, session, key) is ever a label (NFR-09). Declared unregistered: each role
exports only its own domain series (`register_role_metrics`, called once from DlockConfig.ready),
next to the process and request metrics every role has, so `min()`/`avg()` over a metric never
mixes in zeros from roles that cannot move it.
"""

from __future__ import annotations

import os

from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

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
    registry=None,
)
rail_duplicate_attempted = Counter(
    "rail_duplicate_attempted",
    "Submissions refused because the payout already has a rail submission record.",
    registry=None,
)
rail_submission = Counter(
    "rail_submission",
    "Rail submissions by outcome (recorded by the rail proxy).",
    ["outcome"],
    registry=None,
)
payout_execute = Counter(
    "payout_execute", "Executor critical sections by final outcome.", ["outcome"], registry=None
)
payout_backlog_age = Gauge(
    "payout_backlog_age_seconds",
    "Age of the oldest PENDING payout the executor last saw.",
    registry=None,
    multiprocess_mode="livemostrecent",
)
lock_acquire = Counter(
    "lock_acquire",
    "Lock acquire calls by backend and outcome.",
    ["backend", "outcome"],
    registry=None,
)
# Every time a parked acquire (L4 with waitMillis) wakes: `direct` (a NOTIFY or watch meant for it
# alone: the lock was handed to it, or its queue entry was withdrawn), `local` (pg: the same, by
# a statement that ran in the waiter's own process: woken without the NOTIFY), `broadcast` (told to
# re-check its key with the key's other waiters) or `timer` (its holder's lease lapsed, or its
# wait ran out). One release wakes one waiter (ARCHITECTURE decision 23): no herd.
lock_waiter_wakeups = Counter(
    "lock_waiter_wakeups",
    "Wake-ups of parked lock acquires by backend and cause.",
    ["backend", "cause"],
    registry=None,
)
WAKEUP_CAUSES = ("direct", "local", "broadcast", "timer")
requests_shed = Counter(
    "dlock_requests_shed",
    "Requests answered 503 OVERLOADED before Django: older than SERVER_QUEUE_DEADLINE_MS "
    "when a worker thread took them (dlock.admission).",
    registry=None,
)
executor_inflight = Gauge(
    "executor_inflight",
    "Executor critical sections in flight in this process right now.",
    registry=None,
)
payout_execute_seconds = Histogram(
    "payout_execute_seconds",
    "Executor section duration, pick to posted or final state, by outcome.",
    ["outcome"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=None,
)
BACKOFF_REASONS = ("fenced_out", "not_claimable", "duplicate", "error")
executor_backoff = Counter(
    "executor_backoff",
    "Back-off steps the executor took on an account it could not progress, by reason.",
    ["reason"],
    registry=None,
)
# Several gunicorn workers each run the reaper that sets these: the most recent value of a live
# worker is the answer (prometheus_client multiprocess mode; ignored with one process).
lock_live_sessions = Gauge(
    "lock_live_sessions",
    "Unexpired lock-server sessions.",
    ["backend"],
    registry=None,
    multiprocess_mode="livemostrecent",
)
lock_live_grants = Gauge(
    "lock_live_grants",
    "Unexpired lock grants.",
    ["backend"],
    registry=None,
    multiprocess_mode="livemostrecent",
)


# The admin role's log-ins (dlock.adminpages; docs/security.md "Admin log-ins"): never a user
# name or an address as a label.
admin_login_failed = Counter(
    "admin_login_failed",
    "Failed admin log-ins (wrong password, unknown user name, or refused while locked out).",
    registry=None,
)
admin_lockouts = Counter(
    "admin_lockouts",
    "Admin log-ins refused by django-axes' lockout (a user name from one address, or an "
    "address, over DLOCK_ADMIN_LOGIN_FAILURE_LIMIT failures).",
    registry=None,
)


# Which role moves which series (ops runs every app in one process: the suite, management commands).
FENCED_BY_ROLE = {
    "payments": ("account", "ledger"),
    "railproxy": ("rail",),
    "ops": FENCED_RESOURCES,
}
ROLE_METRICS = {
    "lockserver": (
        lock_acquire,
        lock_live_sessions,
        lock_live_grants,
        lock_waiter_wakeups,
        requests_shed,
    ),
    "payments": (lock_fenced_out, requests_shed),
    "railproxy": (lock_fenced_out, rail_duplicate_attempted, rail_submission, requests_shed),
    "railstub": (requests_shed,),
    "admin": (admin_login_failed, admin_lockouts, requests_shed),
    "executor": (
        payout_execute,
        payout_backlog_age,
        executor_inflight,
        payout_execute_seconds,
        executor_backoff,
    ),
}
ROLE_METRICS["ops"] = tuple(dict.fromkeys(m for ms in ROLE_METRICS.values() for m in ms))
_registered: set[int] = set()


def register_role_metrics(
    role: str, *, backend: str, registry: CollectorRegistry = REGISTRY
) -> None:
    """Export this role's domain series, each at 0 from start-up: `lock_acquire_total` and the
    live gauges only for the configured lock backend, `lock_fenced_out_total` only for the
    resources this role fences. Idempotent per registry."""
    if id(registry) in _registered:
        return
    _registered.add(id(registry))
    chosen = ROLE_METRICS.get(role, ())
    for metric in chosen:
        registry.register(metric)
    backends = LOCK_BACKENDS if role == "ops" else (backend,)
    if lock_fenced_out in chosen:
        for resource in FENCED_BY_ROLE.get(role, ()):
            lock_fenced_out.labels(resource=resource)
    for outcome in RAIL_OUTCOMES:
        rail_submission.labels(outcome=outcome)
    for outcome in EXECUTE_OUTCOMES:
        payout_execute.labels(outcome=outcome)
    for outcome in EXECUTE_OUTCOMES:
        payout_execute_seconds.labels(outcome=outcome)
    for reason in BACKOFF_REASONS:
        executor_backoff.labels(reason=reason)
    for name in backends:
        lock_live_sessions.labels(backend=name)
        lock_live_grants.labels(backend=name)
        for outcome in ACQUIRE_OUTCOMES:
            lock_acquire.labels(backend=name, outcome=outcome)
        for cause in WAKEUP_CAUSES:
            lock_waiter_wakeups.labels(backend=name, cause=cause)


def scrape_registry() -> CollectorRegistry:
    """What /metrics exports. One process: the default registry. Several gunicorn workers
    (PROMETHEUS_MULTIPROC_DIR set, see settings/gunicorn.py): every counter, histogram and gauge
    summed over the workers from their files, plus the collectors that compute at scrape time
    (payments' database collectors, process/platform/gc of the answering worker), those first so
    a value they set is already in the files the multiprocess collector reads."""
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        return REGISTRY
    registry = CollectorRegistry(auto_describe=False)
    # prometheus_client has no public listing of a registry's collectors.
    for collector in list(getattr(REGISTRY, "_collector_to_names", {})):
        if not isinstance(collector, MetricWrapperBase):
            registry.register(collector)
    MultiProcessCollector(registry, path=directory)
    return registry


def export(request: HttpRequest) -> HttpResponse:
    """GET /metrics in the Prometheus text format (aggregated over workers when there are
    several)."""
    return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)


# Clients: outlier ejection in dlock.client.Endpoints and the executor's
# outage episodes. `peer` is a service name, never an endpoint URL or an id.
CLIENT_PEERS = ("lockserver", "payments", "railproxy")
client_endpoint_ejected = Counter(
    "client_endpoint_ejected",
    "Times a client demoted one of a service's endpoints for new calls (timed out, refused, "
    "or answered 503/504), by service.",
    ["peer"],
    registry=None,
)
executor_peer_unreachable = Counter(
    "executor_peer_unreachable",
    "Executor calls that found a service unreachable (no answer, or 503/504) while an outage "
    "episode lasted (one WARNING line per episode, this counter per attempt), by service.",
    ["peer"],
    registry=None,
)
for _peer in CLIENT_PEERS:
    client_endpoint_ejected.labels(peer=_peer)
    executor_peer_unreachable.labels(peer=_peer)
ROLE_METRICS["executor"] = (
    *ROLE_METRICS["executor"],
    client_endpoint_ejected,
    executor_peer_unreachable,
)
ROLE_METRICS["ops"] = (*ROLE_METRICS["ops"], client_endpoint_ejected, executor_peer_unreachable)
