"""Waiting in a key's queue on the pg backend (decision 23): queue behind the earlier waiters and
wait for the hand-off, which arrives in the NOTIFY meant for this waiter alone.

The grant is made by the statement that frees the key (release, revoke, closed session, reaper)
or, after the holder's lease lapsed, by the first waiter to notice (hand_off). A waiter holds no
pooled connection while it waits.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import TYPE_CHECKING

from django.conf import settings

from dlock.metrics import lock_waiter_wakeups
from lockserver.backends import pg_sql as sql
from lockserver.backends.base import GrantRecord
from lockserver.pg_listener import Parked

if TYPE_CHECKING:
    from lockserver.backends.pg import PgLockBackend

QUEUED_KEY_MEMORY_S = 1.0  # how long a key this process queued on is taken for a hot key


class QueuedKeys:
    """Keys this process queued on lately: an acquire of one queues at once (a hot key)."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}  # key -> when this process last queued on it

    def recent(self, key: str) -> bool:
        seen = self._seen.get(key)
        return seen is not None and time.monotonic() - seen < QUEUED_KEY_MEMORY_S

    def mark(self, key: str) -> None:
        if len(self._seen) > 4_096:
            self._seen.clear()
        self._seen[key] = time.monotonic()

    def forget(self, key: str) -> None:
        self._seen.pop(key, None)


def park(
    backend: PgLockBackend,
    *,
    key: str,
    session_id: uuid.UUID,
    owner_id: str | None,
    ttl_ms: int,
    deadline: float,
    remaining: float,
) -> GrantRecord | bool | None:
    """Queue behind the key's earlier waiters and wait for the hand-off.

    None: the wait ran out without a grant (or the entry was withdrawn with a closed session);
    False: not admitted (the session, the cap, or the session holds the key itself). The queue
    entry is gone on return.
    """
    waiter_id = uuid.uuid4()
    parked = backend.listener.park(key, str(waiter_id))
    grant: sql.GrantRow | None = None
    queued = False
    try:
        with backend._cursor(pooled=True) as cursor:
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
            backend.queued_keys.mark(key)
        backend._release_connection()
        # Freed while we queued (not held): its statement may not have seen our entry; hand it
        # over ourselves first.
        queued, grant = _await_hand_off(
            backend,
            parked,
            waiter_id=waiter_id,
            key=key,
            session_id=session_id,
            deadline=deadline,
            recheck=not held,
            ms_until_free=ms_until_free,
        )
        if queued:  # the wait ran out: leave the queue (or find we were just handed it)
            with backend._cursor(pooled=True) as cursor:
                grant = sql.withdraw(cursor, waiter_id=waiter_id, key=key, session_id=session_id)
            queued = False
    except BaseException:
        if queued:  # best effort: leave the queue, and give back a grant we cannot answer
            with contextlib.suppress(Exception):
                with backend._cursor(pooled=True) as cursor:
                    lost = sql.withdraw(cursor, waiter_id=waiter_id, key=key, session_id=session_id)
                    released = (
                        None
                        if lost is None
                        else sql.release(cursor, key=key, token=lost.fencing_token)
                    )
                if released is not None:
                    backend._hand_over(released.handed)
        raise
    finally:
        backend.listener.unpark(parked)
    if grant is None:
        return None
    owner = grant.owner_id or (owner_id or backend._owner_of(session_id))
    return GrantRecord(
        key, owner, session_id, grant.fencing_token, grant.acquired_at, grant.expires_at
    )


def _await_hand_off(
    backend: PgLockBackend,
    parked: Parked,
    *,
    waiter_id: uuid.UUID,
    key: str,
    session_id: uuid.UUID,
    deadline: float,
    recheck: bool,
    ms_until_free: int | None,
) -> tuple[bool, sql.GrantRow | None]:
    """Wait for this waiter's hand-off: (still queued, the grant handed to it, if any)."""
    while True:
        if parked.payload is not None:
            # The hand-off (or the session's close) removed the entry.
            _, handed = sql.grant_payload(parked.payload)
            if handed is None:
                return False, None
            token, acquired_at, expires_at = handed
            return False, sql.GrantRow(key, "", session_id, token, acquired_at, expires_at)
        if recheck:
            handoff = backend._hand_off(key)
            if handoff.waiter_id == waiter_id:
                return False, handoff.grant
            ms_until_free = handoff.ms_until_free
        left = deadline - time.monotonic()
        if left <= 0:
            return True, None
        # Woken by the hand-off to us (its NOTIFY, or at once by a freeing statement that ran in
        # this process: KeyListener.hand_over), or when the holder's lease lapses by the
        # database's own reckoning (nobody NOTIFYs that): then hand it over ourselves.
        timeout = left if ms_until_free is None else min(left, ms_until_free / 1000 + 0.002)
        woken = parked.event.wait(max(0.0, timeout))
        parked.event.clear()
        cause = parked.cause if parked.payload else "broadcast" if woken else "timer"
        lock_waiter_wakeups.labels(backend=backend.name, cause=cause).inc()
        recheck = parked.payload is None
