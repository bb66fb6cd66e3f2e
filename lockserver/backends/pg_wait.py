"""The pg backend's wait queue (decision 23): park an acquire behind the key's earlier waiters and
await the hand-off, which arrives in the NOTIFY meant for this waiter alone; withdraw when the
wait runs out; hand a key that is not live to the head of its queue; wake a waiter of this
process granted by a statement that ran here.

The grant is made by the statement that frees the key (release, revoke, closed session, reaper)
or, after the holder's lease lapsed, by the first waiter to notice (`hand_to_head`). A waiter
holds no pooled connection while it waits. The listener (`lockserver.pg_listener`) delivers the
NOTIFYs; the store (`pg_store`) runs the statements.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
from dataclasses import dataclass

from django.conf import settings

from dlock.logs import log_event
from dlock.metrics import lock_waiter_wakeups
from lockserver.backends.base import GrantRecord
from lockserver.backends.pg_sql import release as release_sql
from lockserver.backends.pg_sql import sessions as sessions_sql
from lockserver.backends.pg_sql import waiters as waiters_sql
from lockserver.backends.pg_sql.common import grant_payload
from lockserver.backends.pg_store import PgStore
from lockserver.pg_listener import KeyListener, Parked

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


@dataclass
class _Lapse:
    waiters: int = 0  # of this process, parked on the key
    due: float | None = None  # monotonic time the holder lapses; None: no lapse to watch for
    busy: bool = False  # a waiter is handing the key over now


class LapseWatch:
    """When each key's holder lapses, as the newest statement of this process said, shared by
    the process's waiters on the key. Nobody NOTIFYs a lapse: at the holder's deadline one of
    them hands the key over (one statement for the process, not one per parked waiter) and the
    others wait for what that statement found (the next holder's deadline)."""

    POLL_S = 0.005  # while another waiter's hand-off statement runs

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._keys: dict[str, _Lapse] = {}

    def enter(self, key: str) -> None:
        with self._guard:
            self._keys.setdefault(key, _Lapse()).waiters += 1

    def leave(self, key: str) -> None:
        with self._guard:
            lapse = self._keys.get(key)
            if lapse is not None:
                lapse.waiters -= 1
                if lapse.waiters <= 0:
                    del self._keys[key]

    def note(self, key: str, ms_until_free: int | None) -> None:
        """A statement said when the key's holder lapses (None: no holder) and ended a hand-off
        this process was running, if any."""
        with self._guard:
            lapse = self._keys.get(key)
            if lapse is not None:
                lapse.busy = False
                lapse.due = (
                    None if ms_until_free is None else time.monotonic() + ms_until_free / 1000
                )

    def wait_s(self, key: str, left: float) -> tuple[float, bool]:
        """How long a waiter sleeps, at most `left`, unless woken: until the holder's lapse (a
        hair after, by the database's clock), or a poll while another waiter hands it over
        (then True: not a wake-up of its own)."""
        with self._guard:
            lapse = self._keys.get(key)
            if lapse is None or lapse.due is None:
                return left, False
            if lapse.busy:
                return min(left, self.POLL_S), True
            return max(0.0, min(left, lapse.due - time.monotonic() + 0.002)), False

    def claim(self, key: str) -> bool:
        """A waiter woken by its timer: True if it is the one to hand the key over now (the
        holder's lapse is due and no other waiter of this process is doing it)."""
        with self._guard:
            lapse = self._keys.get(key)
            if lapse is None:
                return True
            if lapse.busy or (lapse.due is not None and time.monotonic() < lapse.due):
                return False
            lapse.busy = True
            return True


class WaitQueue:
    """The keys' queues as this process sees them: `park`, `hand_to_head`, `wake_granted`."""

    def __init__(self, store: PgStore, listener: KeyListener) -> None:
        self.store = store
        self.listener = listener
        self.recent_keys = QueuedKeys()
        self.lapses = LapseWatch()

    def park(
        self,
        *,
        key: str,
        session_id: uuid.UUID,
        owner_id: str | None,
        ttl_ms: int,
        deadline: float,
        remaining: float,
    ) -> GrantRecord | bool | None:
        """Queue behind the key's earlier waiters and wait for the hand-off.

        None: the wait ran out without a grant (or the entry was withdrawn with a closed
        session); False: not admitted (the session, the cap, or the session holds the key
        itself). The queue entry is gone on return.
        """
        waiter_id = uuid.uuid4()
        parked = self.listener.park(key, str(waiter_id))
        self.lapses.enter(key)
        grant: GrantRecord | None = None
        queued = False
        try:
            with self.store.cursor(pooled=True) as cursor:
                admitted, held, ms_until_free = waiters_sql.add_waiter(
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
                self.recent_keys.mark(key)
                self.lapses.note(key, ms_until_free)
            self.store.release_connection()
            # Freed while we queued (not held): its statement may not have seen our entry; hand
            # it over ourselves first.
            queued, grant = self._await_hand_off(
                parked,
                waiter_id=waiter_id,
                key=key,
                session_id=session_id,
                deadline=deadline,
                recheck=not held,
            )
            if queued:  # the wait ran out: leave the queue (or find we were just handed it)
                with self.store.cursor(pooled=True) as cursor:
                    grant = release_sql.withdraw(
                        cursor, waiter_id=waiter_id, key=key, session_id=session_id
                    )
                queued = False
        except BaseException:
            if queued:  # best effort: leave the queue, and give back a grant we cannot answer
                with contextlib.suppress(Exception):
                    self._give_back(waiter_id=waiter_id, key=key, session_id=session_id)
            raise
        finally:
            self.lapses.leave(key)
            self.listener.unpark(parked)
        if grant is None:
            return None
        owner = grant.owner_id or (owner_id or self._owner_of(session_id))
        return GrantRecord(
            key, owner, session_id, grant.fencing_token, grant.acquired_at, grant.expires_at
        )

    def hand_to_head(self, key: str) -> release_sql.HandOff:
        """Give a key that is not live to the head of its queue (nothing if it is live or
        nobody eligible waits), wake that waiter if it is parked here; log the lapse it ended."""
        with self.store.cursor(pooled=True) as cursor:
            handed = release_sql.hand_off(cursor, key=key)
        self.wake_granted(handed.payload)
        if handed.lapsed_token is not None:
            log_event(
                "lock_expired",
                backend=self.store.backend,
                key=key,
                fencingToken=handed.lapsed_token,
                ownerId=handed.lapsed_owner_id,
                sessionId=str(handed.lapsed_session_id),
            )
        return handed

    def wake_granted(self, payload: str | None) -> None:
        """Wake the waiter a hand-off granted (its grant NOTIFY's `payload`), once the statement
        that made it commits, if it is parked in this process (KeyListener.hand_over): it
        answers without waiting for the NOTIFY. None (nobody was handed the key): nothing."""
        if payload is not None:
            self.store.after_commit(functools.partial(self.listener.hand_over, payload))

    def _give_back(self, *, waiter_id: uuid.UUID, key: str, session_id: uuid.UUID) -> None:
        """Leave the queue after a failure, releasing a grant made to us that nobody will
        answer with (to the next waiter)."""
        with self.store.cursor(pooled=True) as cursor:
            lost = release_sql.withdraw(cursor, waiter_id=waiter_id, key=key, session_id=session_id)
            released = (
                None
                if lost is None
                else release_sql.release(cursor, key=key, token=lost.fencing_token)
            )
        if released is not None:
            self.wake_granted(released.handed)

    def _owner_of(self, session_id: uuid.UUID) -> str:
        with self.store.cursor(pooled=True) as cursor:
            session = sessions_sql.get_session(cursor, session_id=session_id)
        return session.owner_id if session is not None else ""

    def _await_hand_off(
        self,
        parked: Parked,
        *,
        waiter_id: uuid.UUID,
        key: str,
        session_id: uuid.UUID,
        deadline: float,
        recheck: bool,
    ) -> tuple[bool, GrantRecord | None]:
        """Wait for this waiter's hand-off: (still queued, the grant handed to it, if any)."""
        while True:
            if parked.payload is not None:
                # The hand-off (or the session's close) removed the entry. Its wake-up is counted
                # here, once, whether this waiter waited for it or it came before it waited.
                lock_waiter_wakeups.labels(backend=self.store.backend, cause=parked.cause).inc()
                _, handed = grant_payload(parked.payload)
                if handed is None:
                    return False, None
                token, acquired_at, expires_at = handed
                return False, GrantRecord(key, "", session_id, token, acquired_at, expires_at)
            if recheck:
                try:
                    handoff = self.hand_to_head(key)
                except BaseException:
                    self.lapses.note(key, 0)  # not handed over: the next waiter's turn
                    raise
                self.lapses.note(key, handoff.ms_until_free)
                if handoff.waiter_id == waiter_id:
                    return False, handoff.grant
            left = deadline - time.monotonic()
            if left <= 0:
                return True, None
            # Woken by the hand-off to us (its NOTIFY, or at once by a freeing statement that ran
            # in this process: KeyListener.hand_over), by the key's broadcast NOTIFY, or when the
            # holder's lease lapses by the database's own reckoning (nobody NOTIFYs that): then
            # one waiter of this process hands it over (LapseWatch), the others wait for it.
            timeout, polling = self.lapses.wait_s(key, left)
            woken = parked.event.wait(timeout)
            parked.event.clear()
            if parked.payload is not None:
                continue  # counted and read above
            if woken:
                cause, recheck = "broadcast", True
            else:
                cause, recheck = "timer", self.lapses.claim(key)
                if polling:
                    continue
            lock_waiter_wakeups.labels(backend=self.store.backend, cause=cause).inc()
