"""The PostgreSQL lock backend (lock.backend=pg): lockdb tables, tokens from fencing_token_seq.

Statements live in `lockserver.backends.pg_sql`; this module owns the transactions, the waiting and
the mapping of "no row" answers to C3 codes. Hot paths are single autocommit statements:
acquire (granted), renew, release. Every expiry is decided by the database clock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from psycopg_pool import PoolTimeout, TooManyRequests

from dlock.dbrouter import alias_for
from dlock.errors import ApiError, Code, not_found
from dlock.logs import log_event
from dlock.metrics import lock_live_grants, lock_live_sessions, lock_waiter_wakeups
from dlock.prepared import server_cursor_class
from dlock.timefmt import rfc3339_ms
from lockserver.backends import pg_sql as sql
from lockserver.backends import token_sql
from lockserver.backends.base import (
    GrantRecord,
    HeartbeatRecord,
    LockInfoRecord,
    RevocationRecord,
    SessionRecord,
)
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

if TYPE_CHECKING:
    from psycopg.abc import Params

logger = logging.getLogger("dlock.lockserver")
INT64_MAX = 2**63 - 1
QUEUED_KEY_MEMORY_S = 1.0  # how long a key this process queued on is taken for a hot key


class _PreparingCursor:
    """Every statement of backends.pg_sql is a fixed text: prepare it (per connection)."""

    def __init__(self, cursor: psycopg.Cursor) -> None:
        self._cursor = cursor

    def execute(self, query: str, params: Params | None = None) -> psycopg.Cursor:
        return self._cursor.execute(query, params, prepare=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class PgLockBackend:
    name = "pg"

    def __init__(self, *, alias: str | None = None, start_listener: bool = True) -> None:
        self.alias = alias or alias_for("lockserver")
        self.budget = RetryBudget(
            budget=settings.LOCK_RETRY_BUDGET, window_ms=settings.LOCK_RETRY_WINDOW_MS
        )
        self._floor_applied = False
        self._floor_refusal_logged = False
        self._floor_guard = threading.Lock()
        self._queued_keys: dict[str, float] = {}  # key -> when this process last queued on it
        params = dict(connections[self.alias].get_connection_params())
        for name in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(name, None)
        self.listener = KeyListener(
            params,
            channel=sql.NOTIFY_CHANNEL,
            grant_channel=sql.GRANT_CHANNEL,
            housekeeping=self._housekeep,
            housekeeping_interval_s=settings.LOCK_HOUSEKEEPING_MS / 1000,
        )
        if start_listener:
            self.listener.start()

    # ------------------------------------------------------------------ plumbing

    @contextlib.contextmanager
    def _cursor(self, *, pooled: bool = False) -> Iterator:
        """Autocommit statements; `pooled`: the hot paths' (L4/L5/L6), see _prepared_cursor."""
        # Not through _store_errors_mapped: one context manager less around every statement
        # of the hot paths; the mapping is the same `_raise_store_error`.
        try:
            with self._prepared_cursor(pooled=pooled) as cursor:
                yield cursor
        except DatabaseError as exc:
            self._raise_store_error(exc)
            raise

    @contextlib.contextmanager
    def _atomic(self) -> Iterator:
        with (
            self._store_errors_mapped(),
            transaction.atomic(using=self.alias),
            self._prepared_cursor() as cursor,
        ):
            yield cursor

    @contextlib.contextmanager
    def _store_errors_mapped(self) -> Iterator[None]:
        try:
            yield
        except DatabaseError as exc:
            self._raise_store_error(exc)
            raise

    def _raise_store_error(self, exc: DatabaseError) -> None:
        """Raise the typed error a store failure maps to; return when it maps to none."""
        error = self._store_error(exc)
        if error is not None:
            raise error from exc

    @contextlib.contextmanager
    def _prepared_cursor(self, *, pooled: bool = False) -> Iterator:
        """A server-binding psycopg cursor on Django's pooled connection for this alias.

        Django's own cursor binds client-side and never prepares, so PostgreSQL would parse and
        plan the (large, CTE) lock statements on every call; these are prepared once per pooled
        connection instead. It is Django's connection, so transaction.atomic and the pool apply;
        with `pooled` (the L4/L5/L6 statements), unless Django already holds this thread's
        connection or a transaction is open, the statement takes a connection from the same pool
        and hands it back at once instead, which skips Django's per-request connect and close
        bookkeeping (issue 18). Either way driver errors surface as django.db errors.
        """
        wrapper = connections[self.alias]
        with wrapper.wrap_database_errors:
            pool = wrapper.pool
            if (
                pooled
                and pool is not None
                and wrapper.connection is None
                and not wrapper.in_atomic_block
            ):
                # An autocommit statement with nothing of Django's open: the pool's connection
                # for this statement only, without Django's per-request connect/close work.
                if pool.closed:
                    pool.open()
                connection = pool.getconn()
                try:
                    with server_cursor_class(self.alias)(connection) as cursor:
                        yield _PreparingCursor(cursor)
                finally:
                    pool.putconn(connection)  # idle (autocommit), or discarded if broken
                return
            wrapper.ensure_connection()
            with server_cursor_class(self.alias)(wrapper.connection) as cursor:
                yield _PreparingCursor(cursor)

    def _store_error(self, exc: DatabaseError) -> ApiError | None:
        """A store that cannot take writes is NOT_LEADER (503), never a 500.

        No pool slot while the listener cannot reach the database is "database down", not
        OVERLOADED; anything else is left to dlock.handlers (None).
        """
        cause = exc.__cause__
        if isinstance(cause, PoolTimeout) and not self.listener.db_up:
            return ApiError(Code.NOT_LEADER, "lock database unreachable")
        if getattr(cause, "sqlstate", None) == "25006":  # read_only_sql_transaction
            return ApiError(Code.NOT_LEADER, "lock database is read-only (standby or fenced)")
        deadline = getattr(cause, "sqlstate", None) in ("57014", "55P03")
        overload = isinstance(cause, PoolTimeout | TooManyRequests)
        if isinstance(exc, OperationalError | InterfaceError) and not (deadline or overload):
            return ApiError(Code.NOT_LEADER, "lock database unreachable")
        return None

    def _ensure_token_floor(self) -> None:
        """Before the first token: the sequence above LOCK_TOKEN_FLOOR and above the deployment's
        token high water (tokens an etcd period issued), so no token is ever issued twice or
        below one a resource has seen. Until it is done, every call answers 503 NOT_LEADER."""
        if self._floor_applied:
            return
        with self._floor_guard:
            if self._floor_applied:
                return
            floor = settings.LOCK_TOKEN_FLOOR
            with self._atomic() as cursor:
                high_water, _ = token_sql.read_high_water(cursor)
                target = max(floor, high_water)
                if target >= INT64_MAX:
                    raise self._floor_refused(target)
                last = token_sql.apply_token_floor(cursor, floor=target)
                token_sql.raise_high_water(cursor, token=last, backend=self.name)
            log_event(
                "token_floor_checked",
                backend=self.name,
                floor=floor,
                highWater=high_water,
                lastToken=last,
            )
            self._floor_applied = True

    def _floor_refused(self, target: int) -> ApiError:
        if not self._floor_refusal_logged:
            self._floor_refusal_logged = True
            log_event(
                "token_floor_refused",
                level=logging.ERROR,
                backend=self.name,
                floor=target,
                reason="no int64 token exceeds the deployment's token high water",
            )
        return ApiError(Code.NOT_LEADER, "the token floor cannot be made safe on this store")

    def _release_connection(self) -> None:
        """Give the pooled connection back before blocking: a waiter holds no DB slot."""
        connections[self.alias].close()

    # ------------------------------------------------------------------ sessions

    def open_session(
        self, *, owner_id: str, ttl_ms: int, credential_id: str | None = None
    ) -> SessionRecord:
        """`credential_id` is recorded by lockserver.ownership (lockdb is this store)."""
        session_id = uuid.uuid4()
        with self._cursor() as cursor:
            expires_at = sql.open_session(
                cursor, session_id=session_id, owner_id=owner_id, ttl_ms=ttl_ms
            )
        return SessionRecord(session_id, owner_id, ttl_ms, expires_at)

    def heartbeat(self, *, session_id: uuid.UUID, owner_id: str) -> HeartbeatRecord:
        with self._atomic() as cursor:
            result = sql.heartbeat(cursor, session_id=session_id, owner_id=owner_id)
            if result is None:
                session = sql.get_session(cursor, session_id=session_id)
        if result is None:
            if session is None:
                raise session_unknown(session_id)
            if session.owner_id != owner_id:
                raise owner_mismatch()
            raise session_expired(session_id)
        expires_at, server_time, held = result
        return HeartbeatRecord(session_id, expires_at, server_time, held)

    def close_session(self, *, session_id: uuid.UUID, owner_id: str) -> None:
        with self._atomic() as cursor:
            # Its queue entries first: a hand-off that locked one commits before we go on, one
            # that comes later skips them (pg_sql._HEAD).
            sql.delete_session_waiters(cursor, session_id=session_id)
            # Row lock next: an acquire holding the session FOR SHARE commits before we free.
            session = sql.get_session(cursor, session_id=session_id, for_update=True)
            if session is None:
                raise session_unknown(session_id)
            if session.owner_id != owner_id:
                raise owner_mismatch()
            freed = sql.delete_session(cursor, session_id=session_id)
            for key, _token, _owner in freed:
                sql.hand_off(cursor, key=key)  # to the head of each freed key's queue
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
        self._ensure_token_floor()
        self.budget.check(session_id=session_id, key=key)
        deadline = time.monotonic() + wait_ms / 1000
        parked = refused = False  # queued once (the wait is spent); the queue refused us
        free_retries = 0
        # A key this process saw queued on lately is queued on at once: the queue entry's
        # statement says whether the key is free, and a free key is then handed to the head of
        # its queue (us, when nobody is ahead): one statement fewer per hot-key acquire.
        queue_first = wait_ms > 0 and self._recently_queued(key)
        while True:
            acquired = None
            if not queue_first:
                with self._cursor(pooled=True) as cursor:
                    acquired = sql.try_acquire(
                        cursor, key=key, session_id=session_id, owner_id=owner_id, ttl_ms=ttl_ms
                    )
            queue_first = False
            if acquired is not None:
                self._queued_keys.pop(key, None)
                return self._granted(acquired, session_id)
            remaining = deadline - time.monotonic()
            if wait_ms > 0 and remaining > 0 and not parked and not refused:
                # Queue at once (one statement checks the session too): the hot key's path
                parked_grant = self._park(
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
            with self._cursor(pooled=True) as cursor:
                session = sql.get_session(cursor, session_id=session_id)
                state = sql.key_state(cursor, key=key)
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
                self._hand_off(key)
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

    def _park(
        self,
        *,
        key: str,
        session_id: uuid.UUID,
        owner_id: str | None,
        ttl_ms: int,
        deadline: float,
        remaining: float,
    ) -> GrantRecord | bool | None:
        """Queue behind the key's earlier waiters and wait for the hand-off (decision 23).

        The grant is made by the statement that frees the key (release, revoke, closed session,
        reaper) or, after the holder's lease lapsed, by the first waiter to notice (hand_off),
        and arrives in the NOTIFY meant for this waiter alone: no statement to collect it.
        Holds no pooled connection while it waits. None: the wait ran out without a grant (or
        the entry was withdrawn with a closed session); False: not admitted (the session, the
        cap, or the session holds the key itself). The queue entry is gone on return.
        """
        waiter_id = uuid.uuid4()
        parked = self.listener.park(key, str(waiter_id))
        grant: sql.GrantRow | None = None
        queued = False
        try:
            with self._cursor(pooled=True) as cursor:
                admitted, held, ms_until_free = sql.add_waiter(
                    cursor,
                    waiter_id=waiter_id,
                    key=key,
                    session_id=session_id,
                    owner_id=owner_id,
                    wait_ms=int(remaining * 1000) + 1,
                    cap=settings.LOCK_MAX_WAITERS_PER_KEY,
                    ttl_ms=ttl_ms,
                )
            if not admitted:
                return False
            queued = True
            if held:
                self._mark_queued(key)
            # Freed while we queued: its statement may not have seen our entry; hand it over.
            recheck = not held
            self._release_connection()
            while True:
                if parked.payload is not None:
                    _, handed = sql.grant_payload(parked.payload)
                    queued = False  # the hand-off (or the session's close) removed the entry
                    if handed is not None:
                        token, acquired_at, expires_at = handed
                        grant = sql.GrantRow(key, "", session_id, token, acquired_at, expires_at)
                    break
                if recheck:
                    handoff = self._hand_off(key)
                    if handoff.waiter_id == waiter_id:
                        queued, grant = False, handoff.grant
                        break
                    ms_until_free = handoff.ms_until_free
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # Woken by the hand-off to us, or when the holder's lease lapses by the
                # database's own reckoning (nobody NOTIFYs that): then hand it over ourselves.
                timeout = left if ms_until_free is None else min(left, ms_until_free / 1000 + 0.002)
                woken = parked.event.wait(max(0.0, timeout))
                parked.event.clear()
                cause = "direct" if parked.payload else "broadcast" if woken else "timer"
                lock_waiter_wakeups.labels(backend=self.name, cause=cause).inc()
                recheck = parked.payload is None
            if queued:  # the wait ran out: leave the queue (or find we were just handed it)
                with self._cursor(pooled=True) as cursor:
                    grant = sql.withdraw(
                        cursor, waiter_id=waiter_id, key=key, session_id=session_id
                    )
                queued = False
        except BaseException:
            if queued:  # best effort: leave the queue, and give back a grant we cannot answer
                with contextlib.suppress(Exception), self._cursor(pooled=True) as cursor:
                    lost = sql.withdraw(cursor, waiter_id=waiter_id, key=key, session_id=session_id)
                    if lost is not None:
                        sql.release(cursor, key=key, token=lost.fencing_token)
            raise
        finally:
            self.listener.unpark(parked)
        if grant is None:
            return None
        owner = grant.owner_id or (owner_id or self._owner_of(session_id))
        return GrantRecord(
            key, owner, session_id, grant.fencing_token, grant.acquired_at, grant.expires_at
        )

    def _recently_queued(self, key: str) -> bool:
        seen = self._queued_keys.get(key)
        return seen is not None and time.monotonic() - seen < QUEUED_KEY_MEMORY_S

    def _mark_queued(self, key: str) -> None:
        if len(self._queued_keys) > 4_096:
            self._queued_keys.clear()
        self._queued_keys[key] = time.monotonic()

    def _owner_of(self, session_id: uuid.UUID) -> str:
        with self._cursor(pooled=True) as cursor:
            session = sql.get_session(cursor, session_id=session_id)
        return session.owner_id if session is not None else ""

    def _hand_off(self, key: str) -> sql.HandOff:
        """Give a key that is not live to the head of its queue; log the lapse it ended."""
        with self._cursor(pooled=True) as cursor:
            handed = sql.hand_off(cursor, key=key)
        if handed.lapsed_token is not None:
            log_event(
                "lock_expired",
                backend=self.name,
                key=key,
                fencingToken=handed.lapsed_token,
                ownerId=handed.lapsed_owner_id,
                sessionId=str(handed.lapsed_session_id),
            )
        return handed

    def _rotate(
        self, key: str, session_id: uuid.UUID, token: int, ttl_ms: int
    ) -> GrantRecord | None:
        """Re-acquire by the holding session: a new grant with a new, higher token (never the
        same one: a caller whose release was lost must not present a token twice, issue 16)."""
        with self._cursor(pooled=True) as cursor:
            grant = sql.rotate(cursor, key=key, session_id=session_id, token=token, ttl_ms=ttl_ms)
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
        return GrantRecord(
            key,
            grant.owner_id,
            session_id,
            grant.fencing_token,
            grant.acquired_at,
            grant.expires_at,
        )

    def _granted(self, acquired: sql.Acquired, session_id: uuid.UUID) -> GrantRecord:
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
        return GrantRecord(
            grant.key,
            grant.owner_id,
            session_id,
            grant.fencing_token,
            grant.acquired_at,
            grant.expires_at,
        )

    def renew(
        self, *, key: str, session_id: uuid.UUID, token: int, ttl_ms: int | None
    ) -> GrantRecord:
        with self._cursor(pooled=True) as cursor:
            grant = sql.renew(cursor, key=key, session_id=session_id, token=token, ttl_ms=ttl_ms)
            if grant is None:
                session = sql.get_session(cursor, session_id=session_id)
                state = sql.key_state(cursor, key=key)
        if grant is not None:
            return GrantRecord(
                key, grant.owner_id, session_id, token, grant.acquired_at, grant.expires_at
            )
        if session is None:
            raise session_unknown(session_id)
        if not session.live:
            raise session_expired(session_id)
        raise lock_lost(key, state.fencing_token)

    def release(self, *, key: str, session_id: uuid.UUID, token: int) -> None:
        with self._cursor(pooled=True) as cursor:
            released = sql.release(cursor, key=key, token=token)
            if released is None:
                state = sql.key_state(cursor, key=key)
        if released is None:
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
        with self._cursor() as cursor:
            state = sql.key_state(cursor, key=key)
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
        self._ensure_token_floor()
        revocation_id = uuid.uuid4()
        with self._atomic() as cursor:
            token, owner, session_id, live = sql.lock_key_row(cursor, key=key)
            if not live:
                raise lock_not_held(key)
            if expected_token is not None and expected_token != token:
                raise expected_token_mismatch(key, expected_token=expected_token, token=token)
            floor = sql.revoke(
                cursor,
                key=key,
                token=token,
                owner_id=owner,
                session_id=session_id,
                operator=operator,
                reason=reason,
                revocation_id=revocation_id,
            )
            sql.hand_off(cursor, key=key)  # its token is drawn after the floor: above it
        return RevocationRecord(key, token, floor, revocation_id, owner)

    # ------------------------------------------------------------------ lifecycle

    def check_ready(self) -> None:
        self._ensure_token_floor()
        with self._cursor() as cursor:
            if sql.in_recovery(cursor):
                raise ApiError(Code.NOT_LEADER, "lock database is a standby (in recovery)")

    def close(self) -> None:
        self.listener.close()

    def _housekeep(self, conn: psycopg.Connection) -> None:
        """Reaper (listener thread, own connection): expiry events, retention, gauges."""
        with conn.cursor() as cursor:
            with conn.transaction():
                lapsed = sql.reap_lapsed_grants(cursor)
                for key, _token, _owner, _session_id, waited in lapsed:
                    if waited:
                        sql.hand_off(cursor, key=key)  # a lapse hands over too (decision 23)
            for key, token, owner, session_id, _waited in lapsed:
                log_event(
                    "lock_expired",
                    backend=self.name,
                    key=key,
                    fencingToken=token,
                    ownerId=owner,
                    sessionId=str(session_id),
                )
            for session_id, owner, expired_at in sql.reap_expired_sessions(cursor):
                log_event(
                    "session_expired",
                    backend=self.name,
                    sessionId=str(session_id),
                    ownerId=owner,
                    expiredAt=rfc3339_ms(expired_at),
                )
            sql.purge(cursor, retention_ms=settings.LOCK_SESSION_RETENTION_MS)
            token_sql.mirror_sequence(cursor)
            sessions, grants = sql.live_counts(cursor)
        lock_live_sessions.labels(backend=self.name).set(sessions)
        lock_live_grants.labels(backend=self.name).set(grants)
