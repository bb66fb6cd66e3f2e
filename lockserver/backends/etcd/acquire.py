"""L4 acquire on etcd: one create transaction per attempt, lapsed holders taken over, waiters
queued under `wait/{key}/` in create-revision order (the per-key cap; ARCHITECTURE decision 23).

As etcd's own lock recipe does, each waiter watches only the deletion of the entry just before
its own; the head watches the grant (and its holder's session). A release, revoke, lapse or
closed session deletes the grant, which wakes the head alone: its create txn succeeds only while
its own entry is still there, and moves that entry onto the grant's lease (a put: its place and
create revision stay, nobody wakes). A newcomer's create txn requires an empty queue, so it
never overtakes a waiter; it queues behind them."""

from __future__ import annotations

import math
import time
import uuid

from dlock.errors import ApiError
from dlock.logs import log_event
from dlock.metrics import lock_waiter_wakeups
from lockserver.backends.base import GrantRecord
from lockserver.backends.etcd.common import (
    EXPIRY_GRACE_S,
    FRESH_LEASE_S,
    store_call,
    ttl_seconds,
)
from lockserver.backends.etcd.grants import GrantsMixin
from lockserver.backends.etcd.keys import (
    HELD,
    _deadline_passed,
    _dump,
    _from_ms,
    _grace_left,
    _ms,
    _now,
)
from lockserver.backends.etcd.tokens import TokenFloorUnavailable
from lockserver.budget import RetryBudget
from lockserver.errors import contention_exceeded, lock_contended, owner_mismatch
from lockserver.etcd_client import EtcdError, EtcdUnavailable
from lockserver.etcd_ops import KeyValue, TxnResult, compare, delete, get, put


class AcquireMixin(GrantsMixin):
    budget: RetryBudget
    waiter_cap: int

    def _try_grant(
        self, *, key: str, session_id: uuid.UUID, ttl_ms: int, queue: tuple[str, int] | None
    ) -> tuple[GrantRecord | None, KeyValue | None, KeyValue | None, int]:
        """One attempt: (grant, None, None, rev) when granted, else (None, live holder, its
        session's key, rev), or (None, None, None, rev) when the key is free but others are
        queued for it (a newcomer queues behind them). `queue`: our entry (key, create
        revision) when we are queued; _Withdrawn when it is gone.

        Raises the session codes when our session is gone. A holder whose session died is
        removed (guarded by its ModRevision) and the attempt repeats. The holder's own session
        asking again gets a new grant with a new, higher token (as on pg).
        """
        seconds = ttl_seconds(ttl_ms)
        owner = self._session_owner(session_id)
        lease, expires_ms = self._grant_lease(seconds)
        leased_at = time.monotonic()
        try:
            for _attempt in range(8):
                if time.monotonic() - leased_at > FRESH_LEASE_S:
                    # after a wait, take the lease again so the reported expiresAt runs from
                    # this attempt and the lease still covers it (`_grant_lease`)
                    self._recycle(lease)
                    lease = 0
                    lease, expires_ms = self._grant_lease(seconds)
                    leased_at = time.monotonic()
                try:
                    grant, result = self._create_grant(
                        key=key,
                        session_id=session_id,
                        owner=owner,
                        seconds=seconds,
                        lease=lease,
                        expires_ms=expires_ms,
                        queue=queue,
                    )
                except EtcdError as exc:
                    if not self._lease_lost(exc, lease):
                        raise
                    lease = 0  # gone: the next attempt takes a fresh one
                    lease, expires_ms = self._grant_lease(seconds)
                    leased_at = time.monotonic()
                    continue
                if grant is not None:
                    lease = 0  # now owned by the grant
                    return grant, None, None, result.revision
                if result.responses[0].first() is None:  # refused with the key free
                    if queue is None and result.responses[3].count:
                        return None, None, None, result.revision  # queued ahead of us
                    if queue is not None and result.responses[3].first() is None:
                        raise _Withdrawn
                ours = result.responses[1].first()
                if ours is None:
                    raise self._session_gone(session_id, self._read_meta(session_id))
                if _deadline_passed(ours):
                    # our session is past its recorded deadline, so etcd is about to sweep it:
                    # wait for its verdict (as for a holder) — 410 beats "contended, retry"
                    self._live_session(session_id)
                outcome = self._settle_holder(
                    key=key, session_id=session_id, holder=result.responses[0].first()
                )
                if outcome is not None:
                    return outcome
            raise EtcdUnavailable("acquire did not settle after repeated races")
        finally:
            if lease:
                self._recycle(lease)  # unused: no key on it

    def _create_grant(
        self,
        *,
        key: str,
        session_id: uuid.UUID,
        owner: str,
        seconds: int,
        lease: int,
        expires_ms: int,
        queue: tuple[str, int] | None,
    ) -> tuple[GrantRecord | None, TxnResult]:
        """The create transaction: the grant when the key was free and our session alive.

        The txn also compares the token offset this process holds with the one stored: another
        replica may have raised it (its start-up found lockdb's reserved ceiling above
        offset + revision). A grant issued with the stale offset would carry a token below
        that replica's, so the stored offset is adopted and the create tried again."""
        for _attempt in range(4):
            grant, result, offset_moved = self._create_grant_once(
                key=key,
                session_id=session_id,
                owner=owner,
                seconds=seconds,
                lease=lease,
                expires_ms=expires_ms,
                queue=queue,
            )
            if not offset_moved:
                return grant, result
            self._refresh_offset()
        raise EtcdUnavailable("the token offset kept moving under the acquire")

    def _create_grant_once(
        self,
        *,
        key: str,
        session_id: uuid.UUID,
        owner: str,
        seconds: int,
        lease: int,
        expires_ms: int,
        queue: tuple[str, int] | None,
    ) -> tuple[GrantRecord | None, TxnResult, bool]:
        """One create txn: (grant or None, result, whether our offset is not the one stored).

        expiresAt is the lease's (`_grant_lease`), never later than etcd's own expiry."""
        now = _now()
        offset = self._current_offset()
        value = {
            "ownerId": owner,
            "sessionId": str(session_id),
            "offset": offset,
            "ttlMs": seconds * 1000,
            "acquiredAt": _ms(now),
            "expiresAt": expires_ms,
        }
        lock_key = self._lock_key(key)
        if queue is None:  # a newcomer: nobody may be queued (decision 23)
            in_turn = compare(self._wait_prefix(key), "CREATE", "EQUAL", 0, prefix=True)
            turn_state = get(self._wait_prefix(key), prefix=True, count_only=True)
            moved: list[dict] = []
        else:  # the head of the queue: its entry still there; it moves onto the grant's lease
            value["queue"] = queue[0]
            in_turn = compare(queue[0], "CREATE", "EQUAL", queue[1])
            turn_state = get(queue[0])
            moved = [put(queue[0], HELD, lease)]
        # create_revision == 0: nobody holds the key; our session's key exists: alive; the
        # offset we issue with is the one in force; our turn
        result = self.client.txn(
            [
                compare(lock_key, "CREATE", "EQUAL", 0),
                compare(self._sess_key(session_id), "CREATE", "GREATER", 0),
                compare(self._offset_key, "VALUE", "EQUAL", str(offset)),
                in_turn,
            ],
            [
                put(lock_key, _dump(value), lease),
                put(self._held_key(session_id, key), key, lease),
                self._first_grant(key),
                get(self._sess_key(session_id)),
                *moved,
                *self._unmarked(lease),
            ],
            [get(lock_key), get(self._sess_key(session_id)), get(self._offset_key), turn_state],
        )
        if not result.succeeded:
            stored = result.responses[2].first() if result.responses[2] else None
            return None, result, stored is None or stored.value != str(offset).encode()
        self._marked(lease)
        if _deadline_passed(result.responses[3].first()):
            self._undo_if_session_lapsed(key, session_id, result.revision)
        try:
            self._reserve(offset + result.revision)
        except TokenFloorUnavailable:
            self._withdraw(key, session_id, result.revision)  # nobody saw it
            raise
        grant = GrantRecord(
            key=key,
            owner_id=owner,
            session_id=session_id,
            fencing_token=offset + result.revision,
            acquired_at=now,
            expires_at=_from_ms(value["expiresAt"]),
        )
        return grant, result, False

    def _settle_holder(
        self, *, key: str, session_id: uuid.UUID, holder: KeyValue | None
    ) -> tuple[GrantRecord | None, KeyValue | None, KeyValue | None, int] | None:
        """After a refused create (`holder`: the grant it answered, if any): the answer of
        _try_grant, or None to try again (the key was freed, or its lapsed holder was removed
        here)."""
        holder, holder_session, revision, lapsed = self._holder_state(key, known=holder)
        if holder is None:
            return None  # released (or swept) since our txn: try again
        holder_sid = holder.json()["sessionId"]
        if not lapsed and holder_sid == str(session_id):
            self._end_own_grant(key, session_id, holder)
            return None  # the next create issues a new, higher token
        if not lapsed:
            return None, holder, holder_session, revision
        self._take_over(key, holder, holder_session)
        return None

    def _take_over(self, key: str, holder: KeyValue, holder_session: KeyValue | None) -> None:
        """Remove a grant that is no longer live: its session is gone, or its own or its
        session's recorded deadline passed (whatever etcd's leases say). Guarded by the
        ModRevisions we judged, so a renew or heartbeat in between keeps it alive."""
        lock_key = self._lock_key(key)
        holder_sid = holder.json()["sessionId"]
        sess_key = self._sess_key(holder_sid)
        taken = self.client.txn(
            [
                compare(lock_key, "MOD", "EQUAL", holder.mod_revision),
                compare(sess_key, "CREATE", "EQUAL", 0)
                if holder_session is None
                else compare(sess_key, "MOD", "EQUAL", holder_session.mod_revision),
            ],
            [
                delete(lock_key),
                delete(self._held_key(holder_sid, key)),
                self._queue_end(key, holder_sid),
            ],
        )
        if not taken.succeeded:
            return
        self._revoke_quietly(holder.lease)
        session_lapsed = holder_session is None or _deadline_passed(holder_session)
        log_event(
            "lock_expired",
            backend=self.name,
            key=key,
            fencingToken=self._token(holder),
            ownerId=holder.json()["ownerId"],
            sessionId=holder_sid,
            cause="session_expired" if session_lapsed else "deadline_passed",
        )

    def _end_own_grant(self, key: str, session_id: uuid.UUID, holder: KeyValue) -> None:
        """Re-acquire by the holding session: end its grant so the next create issues a new,
        higher token (never the same one twice, issue 16). etcd cannot delete and create one key
        in a txn, so another session may win the key in between, as after a release."""
        lock_key = self._lock_key(key)
        ended = self.client.txn(
            [compare(lock_key, "MOD", "EQUAL", holder.mod_revision)],
            [
                delete(lock_key),
                delete(self._held_key(session_id, key)),
                self._queue_end(key, session_id),
            ],
        )
        if not ended.succeeded:
            return  # renewed, released or taken over meanwhile: the caller looks again
        self._revoke_quietly(holder.lease)
        log_event(
            "lock_released",
            backend=self.name,
            key=key,
            fencingToken=self._token(holder),
            ownerId=holder.json()["ownerId"],
            sessionId=str(session_id),
            cause="reacquired",
        )

    def _withdraw(self, key: str, session_id: uuid.UUID, revision: int) -> None:
        """Delete the grant this process created at `revision`, before anyone learned of it."""
        self.client.txn(
            [compare(self._lock_key(key), "MOD", "EQUAL", revision)],
            [
                delete(self._lock_key(key)),
                delete(self._held_key(session_id, key)),
                self._queue_end(key, session_id),
            ],
        )

    def _undo_if_session_lapsed(self, key: str, session_id: uuid.UUID, revision: int) -> None:
        """We granted on a session whose deadline had passed, before etcd swept its key: if etcd
        now deletes it, withdraw the grant (nobody saw it) and answer 410 as pg would."""
        try:
            self._live_session(session_id)
        except ApiError:
            self._withdraw(key, session_id, revision)
            # ... and the "ever seen" mark, if this grant is what created it (L7 answers 404
            # for a key never granted, as pg does when the acquire is refused)
            self.client.txn(
                [compare(self._k("seen", key), "CREATE", "EQUAL", revision)],
                [delete(self._k("seen", key))],
            )
            raise

    @store_call
    def acquire(
        self, *, key: str, session_id: uuid.UUID, owner_id: str | None, ttl_ms: int, wait_ms: int
    ) -> GrantRecord:
        self._current_offset()  # the token floor is ensured before any grant
        self.budget.check(session_id=session_id, key=key)
        owner = self._session_owner(session_id)
        if owner_id is not None and owner != owner_id:
            raise owner_mismatch()
        deadline = time.monotonic() + wait_ms / 1000
        waiter: int | None = None  # the waiter lease while we are queued
        queue: tuple[str, int] | None = None  # our queue entry (key, create revision)
        handed = False  # granted from the queue: the entry moved onto the grant's lease
        look: TxnResult | None = None  # the queue and the grant as our registration saw them
        try:
            while True:
                try:
                    grant, holder, holder_session, _ = self._try_grant(
                        key=key, session_id=session_id, ttl_ms=ttl_ms, queue=queue
                    )
                except _Withdrawn:
                    # our entry went (its lease lapsed, or it was ended with a grant of our
                    # session): one last attempt as a newcomer answers with the right code
                    queue, deadline = None, time.monotonic()
                    continue
                if grant is not None:
                    handed = queue is not None
                    return grant
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.budget.spend(session_id=session_id, key=key)
                    if holder is None or holder_session is None:
                        raise lock_contended(
                            key, holder_owner_id=None, expires_at=None, ms_until_free=None
                        )
                    raise self._contended(key, holder, holder_session)
                if queue is None:
                    waiter, queue, look = self._register_waiter(
                        key=key,
                        session_id=session_id,
                        wait_ms=wait_ms,
                        holder=holder,
                        session=holder_session,
                    )
                self._await_turn(
                    key=key, session_id=session_id, queue=queue, timeout_s=remaining, look=look
                )
                look = None
        finally:
            if waiter is not None and handed:
                self._recycle(waiter)  # empty: our entry is on the grant's lease by now
            elif waiter is not None:
                self._revoke_quietly(waiter)  # leave the queue: the next waiter wakes

    def _await_turn(
        self,
        *,
        key: str,
        session_id: uuid.UUID,
        queue: tuple[str, int],
        timeout_s: float,
        look: TxnResult | None = None,
    ) -> None:
        """Wait until it may be our turn: the deletion of the entry just before ours, or, at the
        head, of the grant or its holder's session; or of our own session. Returns at once when
        we are the head and the key is free. `look`: the queue and the grant at one revision,
        as the registration just read them (else read here)."""
        lock_key = self._lock_key(key)
        read = look or self.client.read(get(self._wait_prefix(key), prefix=True), get(lock_key))
        entries = read.responses[0].kvs
        if not any(entry.key == queue[0] for entry in entries):
            raise _Withdrawn
        earlier = [
            entry for entry in entries if entry.create_revision < queue[1] and entry.value != HELD
        ]
        holder = read.responses[1].first()
        if earlier:
            watched = [max(earlier, key=lambda entry: entry.create_revision).key]
        elif holder is None:
            return  # the head, and the key is free: our turn
        else:
            watched = [lock_key, self._sess_key(holder.json()["sessionId"])]
            # etcd deletes a lapsed grant up to LEASE_SLACK_S after its recorded deadline; the
            # head looks again by then + the grace, when a contender would take it over
            timeout_s = min(timeout_s, _grace_left(holder, grace_s=EXPIRY_GRACE_S))
        woken = self.client.wait_for_change(
            [*watched, self._sess_key(session_id)],
            after_revision=read.revision,
            timeout_s=timeout_s,
            deletions_only=True,
        )
        lock_waiter_wakeups.labels(backend=self.name, cause="direct" if woken else "timer").inc()

    def _register_waiter(
        self,
        *,
        key: str,
        session_id: uuid.UUID,
        wait_ms: int,
        holder: KeyValue | None,
        session: KeyValue | None,
    ) -> tuple[int, tuple[str, int], TxnResult]:
        """A queue entry on its own short lease: (the lease, (entry, its create revision), the
        queue and the grant as the registering txn saw them, for the first `_await_turn`);
        beyond the cap → 429 CONTENTION_EXCEEDED.

        The cap is decided by rank (create revision) among the waiters at the registration's
        revision (a txn's ranges see its own put), so two concurrent registrations cannot both
        slip under it.
        """
        # a lease this process emptied, refreshed (no Raft proposal), when one is kept
        own = self._k("wait", key, str(session_id), uuid.uuid4().hex)
        for last in (False, True):
            lease, _ = self._grant_lease(math.ceil(wait_ms / 1000) + 2)
            try:
                written = self.client.txn(
                    [],
                    [
                        put(own, "1", lease),
                        get(self._wait_prefix(key), prefix=True),
                        get(self._lock_key(key)),
                    ],
                )
                break
            except EtcdError as exc:
                if not last and self._lease_lost(exc, lease):
                    continue  # gone behind our back: once more on a fresh lease
                self._revoke_quietly(lease)
                raise
            except BaseException:
                self._revoke_quietly(lease)
                raise
        waiters = written.responses[1].kvs
        earlier = sum(
            1 for kv in waiters if kv.create_revision < written.revision and kv.value != HELD
        )
        if earlier >= self.waiter_cap:
            self._revoke_quietly(lease)
            ms_until_free = (
                None if holder is None or session is None else self._ms_until_free(holder, session)
            )
            raise contention_exceeded(key, cap=self.waiter_cap, ms_until_free=ms_until_free)
        look = TxnResult(written.succeeded, written.revision, written.responses[1:])
        return lease, (own, written.revision), look


class _Withdrawn(Exception):
    """Our queue entry is gone: the wait ran out (its lease lapsed) or the session's grant
    ended it."""
