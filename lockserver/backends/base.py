"""The lock-server storage interface. Views call only this; pg and etcd implement it.

Every method takes keyword-only arguments and either returns a frozen record or raises
`dlock.errors.ApiError` with a C3 code (SESSION_UNKNOWN, SESSION_EXPIRED, LOCK_CONTENDED,
CONTENTION_EXCEEDED, LOCK_LOST, FENCED_OUT, NOT_FOUND, NOT_LEADER). Inputs are already
validated by the view (key charset/length, ttl ranges, uuid, owner id, token > 0).
Expiry is decided by the store's clock (PostgreSQL clock_timestamp(), etcd lease TTL), never
the lock-server's. Wire behaviour (codes, bodies) must be identical across backends (FR-09).

Shared semantics (docs/lockserver.md): `lockserver.services` records lock_acquire_total and
emits lock_acquired / lock_released / lock_revoked for every backend; a backend emits only
lock_expired and session_expired and sets the live sessions/grants gauges. A second acquire by
the session that already holds the live grant replaces it with a new grant with a NEW, higher
token (and a new expiresAt); the old token is from then on LOCK_LOST here and fenced by every
resource the new one touches (logged once: lock_released cause=reacquired). An owner_id that
differs from the session's ownerId (heartbeat, close_session,
acquire when given) raises VALIDATION_FAILED naming X-Owner-Id and changes nothing; order of
checks: unknown session 404, owner mismatch 400, expired session 410. Renew requires the grant
to belong to session_id (else LOCK_LOST). The per-caller retry budget is
`lockserver.budget.RetryBudget`. Tokens are always > settings.LOCK_TOKEN_FLOOR (applied before
the process reports ready).
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SessionRecord:
    session_id: uuid.UUID
    owner_id: str
    ttl_ms: int  # granted (possibly clamped down)
    expires_at: dt.datetime


@dataclass(frozen=True)
class HeartbeatRecord:
    session_id: uuid.UUID
    expires_at: dt.datetime
    server_time: dt.datetime
    held_lock_count: int


@dataclass(frozen=True)
class GrantRecord:
    key: str
    owner_id: str
    session_id: uuid.UUID
    fencing_token: int
    acquired_at: dt.datetime
    expires_at: dt.datetime


@dataclass(frozen=True)
class LockInfoRecord:
    key: str
    held: bool
    owner_id: str | None
    fencing_token: int | None
    acquired_at: dt.datetime | None
    expires_at: dt.datetime | None
    waiter_count: int


@dataclass(frozen=True)
class RevocationRecord:
    key: str
    revoked_token: int
    new_token_floor: int  # every later grant's token is > this (hence > revoked_token)
    revocation_id: uuid.UUID
    revoked_owner_id: str


class LockBackend(Protocol):
    name: str  # "pg" or "etcd": the `backend` label of lock_acquire_total

    def open_session(
        self, *, owner_id: str, ttl_ms: int, credential_id: str | None = None
    ) -> SessionRecord: ...

    def heartbeat(self, *, session_id: uuid.UUID, owner_id: str) -> HeartbeatRecord: ...

    def close_session(self, *, session_id: uuid.UUID, owner_id: str) -> None:
        """Delete the session and release every attached grant."""

    def acquire(
        self, *, key: str, session_id: uuid.UUID, owner_id: str | None, ttl_ms: int, wait_ms: int
    ) -> GrantRecord:
        """Grant `key` with a NEW token, waiting up to wait_ms; else LOCK_CONTENDED."""

    def renew(
        self, *, key: str, session_id: uuid.UUID, token: int, ttl_ms: int | None
    ) -> GrantRecord:
        """Extend the live grant whose token equals `token`; the token never changes."""

    def release(self, *, key: str, session_id: uuid.UUID, token: int) -> None:
        """Compare-and-delete on (key, token) and nothing else."""

    def inspect(self, *, key: str) -> LockInfoRecord:
        """Advisory read; NOT_FOUND for a key never seen."""

    def revoke(
        self, *, key: str, operator: str, reason: str, expected_token: int | None
    ) -> RevocationRecord:
        """Delete the grant AND advance the token source past it; audit row; NOT_FOUND if free."""

    def check_ready(self) -> None:
        """Raise if the store cannot serve writes (readiness; NOT_LEADER mapping)."""

    def close(self) -> None:
        """Release background resources (listener threads, connections)."""
