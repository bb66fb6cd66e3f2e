"""L4 acquire on etcd: one create transaction per attempt, lapsed holders taken over, waiters
queued under `wait/{key}/` in create-revision order (the per-key cap; ARCHITECTURE decision 23).

As etcd's own lock recipe does, each waiter watches only the deletion of the entry just before
its own; the head watches the grant (and its holder's session). A release, revoke, lapse or
closed session deletes the grant, which wakes the head alone: its create txn succeeds only while
its own entry is still there, and moves that entry onto the grant's lease (a put: its place and
create revision stay, nobody wakes). A newcomer's create txn requires an empty queue, so it
never overtakes a waiter; it queues behind them."""

from __future__ import annotations

import time
import uuid

from dlock.errors import ApiError
from dlock.logs import log_event
from lockserver.backends.base import GrantRecord
from lockserver.backends.etcd.common import (
    FRESH_LEASE_S,
    store_call,
    ttl_seconds,
)
from lockserver.backends.etcd.grants import Grants
from lockserver.backends.etcd.keys import (
    HELD,
    KeySpace,
    deadline_passed,
    dump_json,
    epoch_ms,
    from_epoch_ms,
    utc_now,
)
from lockserver.backends.etcd.leases import LeasePool
from lockserver.backends.etcd.sessions import Sessions
from lockserver.backends.etcd.tokens import TokenAllocator, TokenFloorUnavailable
from lockserver.backends.etcd.waiters import Waiters, Withdrawn
from lockserver.budget import RetryBudget
from lockserver.errors import lock_contended, owner_mismatch
from lockserver.etcd_client import EtcdClient, EtcdError, EtcdUnavailable
from lockserver.etcd_ops import KeyValue, TxnResult, compare, delete, get, put


class Acquirer:
    """L4: one create transaction per attempt, lapsed holders taken over, waiters queued."""

    def __init__(
        self,
        *,
        name: str,
        client: EtcdClient,
        keys: KeySpace,
        tokens: TokenAllocator,
        leases: LeasePool,
        sessions: Sessions,
        grants: Grants,
        waiters: Waiters,
        budget: RetryBudget,
    ) -> None:
        self.name = name
        self.client = client
        self.keys = keys
        self.tokens = tokens
        self.leases = leases
        self.sessions = sessions
        self.grants = grants
        self.waiters = waiters
        self.budget = budget

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
        owner = self.sessions.owner(session_id)
        lease, expires_ms = self.leases.grant(seconds)
        leased_at = time.monotonic()
        try:
            for _attempt in range(8):
                if time.monotonic() - leased_at > FRESH_LEASE_S:
                    # after a wait, take the lease again so the reported expiresAt runs from
                    # this attempt and the lease still covers it (`_grant_lease`)
                    self.leases.recycle(lease)
                    lease = 0
                    lease, expires_ms = self.leases.grant(seconds)
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
                    if not self.leases.lost(exc, lease):
                        raise
                    lease = 0  # gone: the next attempt takes a fresh one
                    lease, expires_ms = self.leases.grant(seconds)
                    leased_at = time.monotonic()
                    continue
                if grant is not None:
                    lease = 0  # now owned by the grant
                    return grant, None, None, result.revision
                if result.responses[0].first() is None:  # refused with the key free
                    if queue is None and result.responses[3].count:
                        return None, None, None, result.revision  # queued ahead of us
                    if queue is not None and result.responses[3].first() is None:
                        raise Withdrawn
                ours = result.responses[1].first()
                if ours is None:
                    raise self.sessions.gone(session_id, self.sessions.read_meta(session_id))
                if deadline_passed(ours):
                    # our session is past its recorded deadline, so etcd is about to sweep it:
                    # wait for its verdict (as for a holder) — 410 beats "contended, retry"
                    self.sessions.live(session_id)
                outcome = self._settle_holder(
                    key=key, session_id=session_id, holder=result.responses[0].first()
                )
                if outcome is not None:
                    return outcome
            raise EtcdUnavailable("acquire did not settle after repeated races")
        finally:
            if lease:
                self.leases.recycle(lease)  # unused: no key on it

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
            self.tokens.refresh_offset()
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
        now = utc_now()
        offset = self.tokens.current_offset()
        value = {
            "ownerId": owner,
            "sessionId": str(session_id),
            "offset": offset,
            "ttlMs": seconds * 1000,
            "acquiredAt": epoch_ms(now),
            "expiresAt": expires_ms,
        }
        lock_key = self.keys.lock_key(key)
        if queue is None:  # a newcomer: nobody may be queued (decision 23)
            in_turn = compare(self.keys.wait_prefix(key), "CREATE", "EQUAL", 0, prefix=True)
            turn_state = get(self.keys.wait_prefix(key), prefix=True, count_only=True)
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
                compare(self.keys.sess_key(session_id), "CREATE", "GREATER", 0),
                compare(self.keys.offset_key, "VALUE", "EQUAL", str(offset)),
                in_turn,
            ],
            [
                put(lock_key, dump_json(value), lease),
                put(self.keys.held_key(session_id, key), key, lease),
                get(self.keys.sess_key(session_id)),
                self.keys.first_grant(key),
                *moved,
                *self.leases.unmarked(lease),
            ],
            [
                get(lock_key),
                get(self.keys.sess_key(session_id)),
                get(self.keys.offset_key),
                turn_state,
            ],
        )
        if not result.succeeded:
            stored = result.responses[2].first() if result.responses[2] else None
            return None, result, stored is None or stored.value != str(offset).encode()
        self.leases.marked(lease)
        if deadline_passed(result.responses[2].first()):
            self._undo_if_session_lapsed(key, session_id, result.revision)
        try:
            self.tokens.reserve(offset + result.revision)
        except TokenFloorUnavailable:
            self._withdraw(key, session_id, result.revision)  # nobody saw it
            raise
        grant = GrantRecord(
            key=key,
            owner_id=owner,
            session_id=session_id,
            fencing_token=offset + result.revision,
            acquired_at=now,
            expires_at=from_epoch_ms(value["expiresAt"]),
        )
        return grant, result, False

    def _settle_holder(
        self, *, key: str, session_id: uuid.UUID, holder: KeyValue | None
    ) -> tuple[GrantRecord | None, KeyValue | None, KeyValue | None, int] | None:
        """After a refused create (`holder`: the grant it answered, if any): the answer of
        _try_grant, or None to try again (the key was freed, or its lapsed holder was removed
        here)."""
        holder, holder_session, revision, lapsed = self.grants.holder_state(key, known=holder)
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
        lock_key = self.keys.lock_key(key)
        holder_sid = holder.json()["sessionId"]
        sess_key = self.keys.sess_key(holder_sid)
        taken = self.client.txn(
            [
                compare(lock_key, "MOD", "EQUAL", holder.mod_revision),
                compare(sess_key, "CREATE", "EQUAL", 0)
                if holder_session is None
                else compare(sess_key, "MOD", "EQUAL", holder_session.mod_revision),
            ],
            [
                delete(lock_key),
                delete(self.keys.held_key(holder_sid, key)),
                self.keys.queue_end(key, holder_sid),
            ],
        )
        if not taken.succeeded:
            return
        self.leases.revoke_quietly(holder.lease)
        session_lapsed = holder_session is None or deadline_passed(holder_session)
        log_event(
            "lock_expired",
            backend=self.name,
            key=key,
            fencingToken=self.tokens.token(holder),
            ownerId=holder.json()["ownerId"],
            sessionId=holder_sid,
            cause="session_expired" if session_lapsed else "deadline_passed",
        )

    def _end_own_grant(self, key: str, session_id: uuid.UUID, holder: KeyValue) -> None:
        """Re-acquire by the holding session: end its grant so the next create issues a new,
        higher token (never the same one twice). etcd cannot delete and create one key
        in a txn, so another session may win the key in between, as after a release."""
        lock_key = self.keys.lock_key(key)
        ended = self.client.txn(
            [compare(lock_key, "MOD", "EQUAL", holder.mod_revision)],
            [
                delete(lock_key),
                delete(self.keys.held_key(session_id, key)),
                self.keys.queue_end(key, session_id),
            ],
        )
        if not ended.succeeded:
            return  # renewed, released or taken over meanwhile: the caller looks again
        self.leases.revoke_quietly(holder.lease)
        log_event(
            "lock_released",
            backend=self.name,
            key=key,
            fencingToken=self.tokens.token(holder),
            ownerId=holder.json()["ownerId"],
            sessionId=str(session_id),
            cause="reacquired",
        )

    def _withdraw(self, key: str, session_id: uuid.UUID, revision: int) -> None:
        """Delete the grant this process created at `revision`, before anyone learned of it."""
        self.client.txn(
            [compare(self.keys.lock_key(key), "MOD", "EQUAL", revision)],
            [
                delete(self.keys.lock_key(key)),
                delete(self.keys.held_key(session_id, key)),
                self.keys.queue_end(key, session_id),
            ],
        )

    def _undo_if_session_lapsed(self, key: str, session_id: uuid.UUID, revision: int) -> None:
        """We granted on a session whose deadline had passed, before etcd swept its key: if etcd
        now deletes it, withdraw the grant (nobody saw it) and answer 410 as pg would."""
        try:
            self.sessions.live(session_id)
        except ApiError:
            self._withdraw(key, session_id, revision)
            # ... and the "ever seen" mark, if this grant is what created it and nobody has
            # been granted the key since (L7 answers 404 for a key never granted, as pg does
            # when the acquire is refused)
            self.client.txn(
                [
                    compare(self.keys.k("seen", key), "CREATE", "EQUAL", revision),
                    compare(self.keys.lock_key(key), "CREATE", "EQUAL", 0),
                ],
                [delete(self.keys.k("seen", key))],
            )
            raise

    @store_call
    def acquire(
        self, *, key: str, session_id: uuid.UUID, owner_id: str | None, ttl_ms: int, wait_ms: int
    ) -> GrantRecord:
        self.tokens.current_offset()  # the token floor is ensured before any grant
        self.budget.check(session_id=session_id, key=key)
        owner = self.sessions.owner(session_id)
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
                except Withdrawn:
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
                    raise self.grants.contended(key, holder, holder_session)
                if queue is None:
                    waiter, queue, look = self.waiters.register(
                        key=key,
                        session_id=session_id,
                        wait_ms=wait_ms,
                        holder=holder,
                        session=holder_session,
                    )
                self.waiters.await_turn(
                    key=key, session_id=session_id, queue=queue, timeout_s=remaining, look=look
                )
                look = None
        finally:
            if waiter is not None and handed:
                self.leases.recycle(waiter)  # empty: our entry is on the grant's lease by now
            elif waiter is not None:
                self.leases.revoke_quietly(waiter)  # leave the queue: the next waiter wakes
