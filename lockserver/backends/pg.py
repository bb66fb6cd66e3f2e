"""The PostgreSQL lock backend (lock.backend=pg): lockdb tables, tokens from fencing_token_seq.

`PgLockBackend` composes three parts, each with a public interface: the store (`pg_store.PgStore`:
cursors, store errors, the token floor), the wait queue (`pg_wait.WaitQueue`: park, hand to the
head, wake a local waiter; the listener thread `lockserver.pg_listener.KeyListener` delivers its
NOTIFYs) and the housekeeper (`pg_housekeeping.Housekeeper`, run by the listener thread).
Statements live in `lockserver.backends.pg_sql`; this module owns the transactions and the
mapping of "no row" answers to C3 codes. Hot paths are single autocommit statements: acquire
(granted), renew, release. Every expiry is decided by the database clock.
"""

from __future__ import annotations

import time
import uuid

from django.conf import settings
from django.db import connections

from dlock.dbrouter import alias_for
from dlock.errors import ApiError, Code, not_found
from dlock.logs import log_event
from dlock.timefmt import rfc3339_ms
from lockserver.backends.base import (
    GrantRecord,
    HeartbeatRecord,
    LockInfoRecord,
    RevocationRecord,
    SessionRecord,
)
from lockserver.backends.pg_housekeeping import Housekeeper
from lockserver.backends.pg_sql import acquire as acquire_sql
from lockserver.backends.pg_sql import housekeeping as housekeeping_sql
from lockserver.backends.pg_sql import release as release_sql
from lockserver.backends.pg_sql import sessions as sessions_sql
from lockserver.backends.pg_sql.common import GRANT_CHANNEL, NOTIFY_CHANNEL
from lockserver.backends.pg_store import PgStore
from lockserver.backends.pg_wait import WaitQueue
from lockserver.budget import RetryBudget
from lockserver.errors import (
    contention_exceeded,
    expected_token_mismatch,
    lock_contended,
    lock_lost,
    lock_not_held,
    owner_mismatch,
    session_expired,
    session_unknown,
)
from lockserver.pg_listener import KeyListener


class PgLockBackend:
    """`LockBackend` on lockdb: the store, the wait queue and the housekeeper composed."""

    name = "pg"

    def __init__(self, *, alias: str | None = None, start_listener: bool = True) -> None:
        alias = alias or alias_for("lockserver")
        self.budget = RetryBudget(
            budget=settings.LOCK_RETRY_BUDGET, window_ms=settings.LOCK_RETRY_WINDOW_MS
        )
        # The listener's own connections take Django's parameters minus what psycopg.connect
        # does not take.
        params = dict(connections[alias].get_connection_params())
        for name in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(name, None)
        self.housekeeper = Housekeeper(backend=self.name)
        self.listener = KeyListener(
            params,
            channel=NOTIFY_CHANNEL,
            grant_channel=GRANT_CHANNEL,
            housekeeping=self.housekeeper.run,
            housekeeping_interval_s=settings.LOCK_HOUSEKEEPING_MS / 1000,
        )
        self.store = PgStore(alias=alias, backend=self.name, reachability=self.listener)
        self.queue = WaitQueue(self.store, self.listener)
        if start_listener:
            self.listener.start()

    def open_session(
        self, *, owner_id: str, ttl_ms: int, credential_id: str | None = None
    ) -> SessionRecord:
        """`credential_id` is recorded by lockserver.ownership (lockdb is this store)."""
        session_id = uuid.uuid4()
        with self.store.cursor() as cursor:
            expires_at = sessions_sql.open_session(
                cursor, session_id=session_id, owner_id=owner_id, ttl_ms=ttl_ms
            )
        return SessionRecord(session_id, owner_id, ttl_ms, expires_at)

    def heartbeat(self, *, session_id: uuid.UUID, owner_id: str) -> HeartbeatRecord:
        with self.store.atomic() as cursor:
            result = sessions_sql.heartbeat(cursor, session_id=session_id, owner_id=owner_id)
            if result is None:
                session = sessions_sql.get_session(cursor, session_id=session_id)
        if result is None:
            if session is None:
                raise session_unknown(session_id)
            if session.owner_id != owner_id:
                raise owner_mismatch()
            raise session_expired(session_id)
        expires_at, server_time, held = result
        return HeartbeatRecord(session_id, expires_at, server_time, held)

    def close_session(self, *, session_id: uuid.UUID, owner_id: str) -> None:
        with self.store.atomic() as cursor:
            # Its queue entries first: a hand-off that locked one commits before we go on, one
            # that comes later skips them (pg_sql.common.HEAD).
            for withdrawn in sessions_sql.delete_session_waiters(cursor, session_id=session_id):
                self.queue.wake_granted(withdrawn)  # a parked acquire of ours answers at once
            # Row lock next: an acquire holding the session FOR SHARE commits before we free.
            session = sessions_sql.get_session(cursor, session_id=session_id, for_update=True)
            if session is None:
                raise session_unknown(session_id)
            if session.owner_id != owner_id:
                raise owner_mismatch()
            freed = sessions_sql.delete_session(cursor, session_id=session_id)
            # each freed key to the head of its queue, in one statement
            for payload in release_sql.hand_off_keys(cursor, keys=[key for key, _, _ in freed]):
                self.queue.wake_granted(payload)
        for key, token, owner in freed:
            log_event(
                "lock_released",
                backend=self.name,
                key=key,
                fencingToken=token,
                ownerId=owner,
                sessionId=str(session_id),
                cause="session_closed",
            )

    # ------------------------------------------------------------------ grants

    def acquire(
        self, *, key: str, session_id: uuid.UUID, owner_id: str | None, ttl_ms: int, wait_ms: int
    ) -> GrantRecord:
        self.store.ensure_token_floor()
        self.budget.check(session_id=session_id, key=key)
        deadline = time.monotonic() + wait_ms / 1000
        parked = refused = False  # queued once (the wait is spent); the queue refused us
        free_retries = 0
        # A key this process saw queued on lately is queued on at once: the queue entry's
        # statement says whether the key is free, and a free key is then handed to the head of
        # its queue (us, when nobody is ahead): one statement fewer per hot-key acquire.
        queue_first = wait_ms > 0 and self.queue.recent_keys.recent(key)
        while True:
            acquired = None
            if not queue_first:
                with self.store.cursor(pooled=True) as cursor:
                    acquired = acquire_sql.try_acquire(
                        cursor, key=key, session_id=session_id, owner_id=owner_id, ttl_ms=ttl_ms
                    )
            queue_first = False
            if acquired is not None:
                self.queue.recent_keys.forget(key)
                return self._granted(acquired)
            remaining = deadline - time.monotonic()
            if wait_ms > 0 and remaining > 0 and not parked and not refused:
                # Queue at once (one statement checks the session too): the hot key's path
                parked_grant = self.queue.park(
                    key=key,
                    session_id=session_id,
                    owner_id=owner_id,
                    ttl_ms=ttl_ms,
                    deadline=deadline,
                    remaining=remaining,
                )
                if isinstance(parked_grant, GrantRecord):
                    return parked_grant
                if parked_grant is None:
                    # The wait ran out (or the entry went with a closed session) without a
                    # hand-off: one last attempt answers with the right code.
                    parked = True
                    continue
                refused = True  # not admitted: say why below
            with self.store.cursor(pooled=True) as cursor:
                session = sessions_sql.get_session(cursor, session_id=session_id)
                state = acquire_sql.key_state(cursor, key=key)
            if session is None:
                raise session_unknown(session_id)
            if owner_id is not None and session.owner_id != owner_id:
                raise owner_mismatch()
            if not session.live:
                raise session_expired(session_id)
            if state.live and state.session_id == session_id:
                rotated = self._rotate(key, session_id, state.fencing_token, ttl_ms)
                if rotated is not None:
                    return rotated
                continue  # released, lapsed or revoked meanwhile: an ordinary attempt
            if not state.live and free_retries < 3:
                # Free (or lapsed) but refused: waiters are queued on it. Hand it to the head of
                # the queue (decision 23), then queue behind it; or freed between our two
                # statements: try again at once.
                free_retries += 1
                refused = False
                self.queue.hand_to_head(key)
                continue
            if refused and state.live:
                raise contention_exceeded(
                    key, cap=settings.LOCK_MAX_WAITERS_PER_KEY, ms_until_free=state.ms_until_free
                )
            self.budget.spend(session_id=session_id, key=key)
            raise lock_contended(
                key,
                holder_owner_id=state.owner_id,
                expires_at=rfc3339_ms(state.expires_at),
                ms_until_free=state.ms_until_free,
            )

    def _rotate(
        self, key: str, session_id: uuid.UUID, token: int, ttl_ms: int
    ) -> GrantRecord | None:
        """Re-acquire by the holding session: a new grant with a new, higher token (never the
        same one: a caller whose release was lost must not present a token twice)."""
        with self.store.cursor(pooled=True) as cursor:
            grant = acquire_sql.rotate(
                cursor, key=key, session_id=session_id, token=token, ttl_ms=ttl_ms
            )
        if grant is None:
            return None
        log_event(
            "lock_released",
            backend=self.name,
            key=key,
            fencingToken=token,
            ownerId=grant.owner_id,
            sessionId=str(session_id),
            cause="reacquired",
            supersededBy=grant.fencing_token,
        )
        return grant

    def _granted(self, acquired: acquire_sql.Acquired) -> GrantRecord:
        grant = acquired.grant
        if acquired.replaced_token is not None:
            log_event(
                "lock_expired",
                backend=self.name,
                key=grant.key,
                fencingToken=acquired.replaced_token,
                ownerId=acquired.replaced_owner_id,
                takenOverBy=grant.fencing_token,
            )
        return grant

    def renew(
        self, *, key: str, session_id: uuid.UUID, token: int, ttl_ms: int | None
    ) -> GrantRecord:
        with self.store.cursor(pooled=True) as cursor:
            grant = acquire_sql.renew(
                cursor, key=key, session_id=session_id, token=token, ttl_ms=ttl_ms
            )
            if grant is None:
                session = sessions_sql.get_session(cursor, session_id=session_id)
                state = acquire_sql.key_state(cursor, key=key)
        if grant is not None:
            return grant
        if session is None:
            raise session_unknown(session_id)
        if not session.live:
            raise session_expired(session_id)
        raise lock_lost(key, state.fencing_token)

    def release(self, *, key: str, session_id: uuid.UUID, token: int) -> None:
        with self.store.cursor(pooled=True) as cursor:
            released = release_sql.release(cursor, key=key, token=token)
            if released is not None:
                # committed (autocommit): wake the next holder before anything else of ours,
                # the pool's return of this connection and our own answer
                self.queue.wake_granted(released.handed)
                return
            state = acquire_sql.key_state(cursor, key=key)
        log_event(
            "lock_release_lost",
            backend=self.name,
            key=key,
            presentedToken=token,
            storedToken=state.fencing_token,
            sessionId=str(session_id),
        )
        raise lock_lost(key, state.fencing_token)

    def inspect(self, *, key: str) -> LockInfoRecord:
        with self.store.cursor() as cursor:
            state = acquire_sql.key_state(cursor, key=key)
        if state.in_recovery:
            raise ApiError(Code.NOT_LEADER, "lock database is a standby (in recovery)")
        if not state.seen:
            raise not_found("lock", key)
        return LockInfoRecord(
            key,
            state.live,
            state.owner_id,
            state.fencing_token,
            state.acquired_at,
            state.expires_at,
            state.waiter_count,
        )

    def revoke(
        self, *, key: str, operator: str, reason: str, expected_token: int | None
    ) -> RevocationRecord:
        self.store.ensure_token_floor()
        revocation_id = uuid.uuid4()
        with self.store.atomic() as cursor:
            token, owner, session_id, live = release_sql.lock_key_row(cursor, key=key)
            if not live:
                raise lock_not_held(key)
            if expected_token is not None and expected_token != token:
                raise expected_token_mismatch(key, expected_token=expected_token, token=token)
            floor = release_sql.revoke(
                cursor,
                key=key,
                token=token,
                owner_id=owner,
                session_id=session_id,
                operator=operator,
                reason=reason,
                revocation_id=revocation_id,
            )
            # its token is drawn after the floor: above it
            self.queue.wake_granted(release_sql.hand_off(cursor, key=key).payload)
        return RevocationRecord(key, token, floor, revocation_id, owner)

    # ------------------------------------------------------------------ lifecycle

    def check_ready(self) -> None:
        self.store.ensure_token_floor()
        with self.store.cursor() as cursor:
            if housekeeping_sql.in_recovery(cursor):
                raise ApiError(Code.NOT_LEADER, "lock database is a standby (in recovery)")

    def close(self) -> None:
        self.listener.close()
