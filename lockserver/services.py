"""Lock-server actions: one call into the configured backend, plus the backend-agnostic
metrics and events (`lock_acquire_total{backend,outcome}`, `lock_acquired`, `lock_released`,
`lock_revoked`). Backends emit only what they alone can see: `lock_expired`, `session_expired`
and the live sessions/grants gauges.

`lock_acquired` and `lock_released` (cause release) are DEBUG lines: two per acquire + release
pair would be the lock server's busiest log output and a measurable share of its CPU per pair
(bench.lockpath). The counter (`lock_acquire_total{outcome="granted"}`) keeps the count; what
is not routine stays at INFO or above (`lock_expired`, `lock_released` with cause reacquired or
session_closed, `lock_release_lost`, `lock_revoked`). `DLOCK_LOG_LEVEL=DEBUG` shows every grant.
"""

from __future__ import annotations

import logging
import threading
import uuid
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from prometheus_client import Counter

from dlock.errors import ApiError, Code
from dlock.logs import event_enabled, log_event
from dlock.metrics import lock_acquire
from dlock.timefmt import rfc3339_ms
from lockserver.backends import get_backend
from lockserver.backends.base import (
    GrantRecord,
    HeartbeatRecord,
    LockBackend,
    LockInfoRecord,
    RevocationRecord,
    SessionRecord,
)

_ACQUIRE_OUTCOME = {
    Code.LOCK_CONTENDED: "contended",
    Code.CONTENTION_EXCEEDED: "contention_exceeded",
    Code.SESSION_UNKNOWN: "session_unknown",
    Code.SESSION_EXPIRED: "session_expired",
    Code.NOT_LEADER: "not_leader",
}


@cache
def _acquire_counter(backend: str, outcome: str) -> Counter:
    """`lock_acquire_total{backend,outcome}`'s child, looked up once per label pair (a bounded set:
    two backends, the outcomes above)."""
    return lock_acquire.labels(backend=backend, outcome=outcome)


def granted_ttl_ms(ttl_ms: int) -> int:
    """TTLs are granted in whole seconds on every backend (etcd leases have second granularity),
    so pg and etcd answer identically (FR-09); C3 allows clamping down, never up."""
    return max(1_000, ttl_ms // 1_000 * 1_000)


def open_session(*, owner_id: str, ttl_ms: int, credential_id: str | None = None) -> SessionRecord:
    return get_backend().open_session(
        owner_id=owner_id, ttl_ms=granted_ttl_ms(ttl_ms), credential_id=credential_id
    )


def heartbeat(*, session_id: uuid.UUID, owner_id: str) -> HeartbeatRecord:
    return get_backend().heartbeat(session_id=session_id, owner_id=owner_id)


def close_session(*, session_id: uuid.UUID, owner_id: str) -> None:
    get_backend().close_session(session_id=session_id, owner_id=owner_id)


_wait_slots: threading.BoundedSemaphore | None = None
_wait_slots_guard = threading.Lock()


def _wait_slot() -> bool:
    """Take one of the process's LOCK_MAX_WAITS_PER_PROCESS server-side wait slots, if free.

    A waiting acquire holds a worker thread for up to waitMillis; the bound keeps enough
    threads for every other request (L7, heartbeats, releases, probes) however many callers
    wait (CHANGELOG row 45)."""
    global _wait_slots
    if _wait_slots is None:
        with _wait_slots_guard:
            if _wait_slots is None:
                _wait_slots = threading.BoundedSemaphore(settings.LOCK_MAX_WAITS_PER_PROCESS)
    return _wait_slots.acquire(blocking=False)


def _waits_exhausted(key: str, contended: ApiError) -> ApiError:
    return ApiError(
        Code.CONTENTION_EXCEEDED,
        f"the lock server already holds {settings.LOCK_MAX_WAITS_PER_PROCESS} waiting acquires;"
        " retry after retryAfterMillis",
        details={"key": key, "processWaitCap": settings.LOCK_MAX_WAITS_PER_PROCESS},
        retry_after_ms=contended.retry_after_ms,
    )


def _backend_acquire(
    backend: LockBackend,
    *,
    key: str,
    session_id: uuid.UUID,
    owner_id: str | None,
    ttl_ms: int,
    wait_ms: int,
) -> GrantRecord:
    """The backend's acquire; a wait only while a wait slot is free. Without one the caller
    still gets a free key at once, and 429 CONTENTION_EXCEEDED instead of a parked thread."""
    call: dict[str, Any] = {
        "key": key,
        "session_id": session_id,
        "owner_id": owner_id,
        "ttl_ms": ttl_ms,
    }
    if wait_ms <= 0:
        return backend.acquire(**call, wait_ms=0)
    if not _wait_slot():
        try:
            return backend.acquire(**call, wait_ms=0)
        except ApiError as exc:
            if exc.code == Code.LOCK_CONTENDED:
                raise _waits_exhausted(key, exc) from None
            raise
    try:
        return backend.acquire(**call, wait_ms=wait_ms)
    finally:
        assert _wait_slots is not None
        _wait_slots.release()


def acquire(
    *, key: str, session_id: uuid.UUID, owner_id: str | None, ttl_ms: int, wait_ms: int
) -> GrantRecord:
    backend = get_backend()
    try:
        grant = _backend_acquire(
            backend,
            key=key,
            session_id=session_id,
            owner_id=owner_id,
            ttl_ms=granted_ttl_ms(ttl_ms),
            wait_ms=wait_ms,
        )
    except ApiError as exc:
        outcome = _ACQUIRE_OUTCOME.get(exc.code)
        if outcome is not None:
            _acquire_counter(backend.name, outcome).inc()
        raise
    except DatabaseError:
        _acquire_counter(backend.name, "not_leader").inc()
        raise
    _acquire_counter(backend.name, "granted").inc()
    if not event_enabled(logging.DEBUG):
        return grant
    log_event(
        "lock_acquired",
        level=logging.DEBUG,
        backend=backend.name,
        key=grant.key,
        fencingToken=grant.fencing_token,
        ownerId=grant.owner_id,
        sessionId=str(grant.session_id),
        expiresAt=rfc3339_ms(grant.expires_at),
    )
    return grant


def renew(*, key: str, session_id: uuid.UUID, token: int, ttl_ms: int | None) -> GrantRecord:
    granted = granted_ttl_ms(ttl_ms) if ttl_ms is not None else None
    return get_backend().renew(key=key, session_id=session_id, token=token, ttl_ms=granted)


def release(*, key: str, session_id: uuid.UUID, token: int) -> None:
    backend = get_backend()
    backend.release(key=key, session_id=session_id, token=token)
    if not event_enabled(logging.DEBUG):
        return
    log_event(
        "lock_released",
        level=logging.DEBUG,
        backend=backend.name,
        key=key,
        fencingToken=token,
        sessionId=str(session_id),
        cause="release",
    )


def inspect(*, key: str) -> LockInfoRecord:
    return get_backend().inspect(key=key)


def revoke(*, key: str, operator: str, reason: str, expected_token: int | None) -> RevocationRecord:
    backend = get_backend()
    record = backend.revoke(
        key=key, operator=operator, reason=reason, expected_token=expected_token
    )
    log_event(
        "lock_revoked",
        level=logging.WARNING,
        backend=backend.name,
        key=key,
        revokedToken=record.revoked_token,
        newTokenFloor=record.new_token_floor,
        revocationId=str(record.revocation_id),
        ownerId=record.revoked_owner_id,
        operator=operator,
        reason=reason,
    )
    return record
