"""Grants on etcd once made: who holds a key (after etcd's expiry verdict), L5 renew, L6
release, L7 inspect, L8 revoke."""

from __future__ import annotations

import logging
import threading
import uuid
from time import monotonic
from typing import Any

from dlock.errors import ApiError, not_found
from dlock.timefmt import rfc3339_ms
from lockserver.backends.base import GrantRecord, LockInfoRecord, RevocationRecord
from lockserver.backends.etcd.common import (
    EXPIRY_GRACE_S,
    LEASE_COVER_MARGIN_S,
    LEASE_SLACK_S,
    store_call,
    ttl_seconds,
)
from lockserver.backends.etcd.keys import (
    HELD,
    _deadline_passed,
    _dump,
    _from_ms,
    _grace_left,
    _ms,
    _now,
)
from lockserver.backends.etcd.sessions import SessionsMixin
from lockserver.backends.etcd.tokens import TokensMixin
from lockserver.errors import (
    expected_token_mismatch,
    lock_contended,
    lock_lost,
    lock_not_held,
)
from lockserver.etcd_client import EtcdError, EtcdUnavailable
from lockserver.etcd_ops import KeyValue, RequestOp, compare, delete, get, put

logger = logging.getLogger("dlock.lockserver.etcd")


class GrantsMixin(TokensMixin, SessionsMixin):
    _grant_leases: dict[int, int]
    _spare_leases: dict[int, list[int]]
    _lease_cover: dict[int, float]
    _lease_guard: threading.Lock
    _marked_leases: set[int]

    def _grant_record(self, key: str, kv: KeyValue) -> GrantRecord:
        value = kv.json()
        return GrantRecord(
            key=key,
            owner_id=value["ownerId"],
            session_id=uuid.UUID(value["sessionId"]),
            fencing_token=value["offset"] + kv.create_revision,
            acquired_at=_from_ms(value["acquiredAt"]),
            expires_at=_from_ms(value["expiresAt"]),
        )

    @staticmethod
    def _ms_until_free(holder: KeyValue, session: KeyValue) -> int:
        """Until the grant frees: its own deadline or its session's, whichever comes first
        (pg: LEAST(grant, session expiry))."""
        until = holder.json()["expiresAt"]
        until = min(until, session.json().get("expiresAt", until))
        return max(0, until - _ms(_now()))

    def _contended(self, key: str, holder: KeyValue, session: KeyValue) -> ApiError:
        value = holder.json()
        return lock_contended(
            key,
            holder_owner_id=value["ownerId"],
            expires_at=rfc3339_ms(_from_ms(value["expiresAt"])),
            ms_until_free=self._ms_until_free(holder, session),
        )

    def _grant_lease(self, seconds: int) -> tuple[int, int]:
        """(a lease with no key on it that lives at least `seconds` from now, its expiresAt in
        epoch ms: now + `seconds`). Both clocks are read before the lease is granted or
        refreshed, so the reported deadline is never later than etcd's own expiry of the lease:
        a successor's acquiredAt cannot fall before its predecessor's expiresAt.

        A lease this process emptied (`_recycle`) carries the next grant of the same TTL. Grant
        leases are granted LEASE_SLACK_S longer than the grant, and each remembers the lower
        bound of etcd's expiry its last grant or keepalive answer gave (sent at + TTL answered,
        on this process's monotonic clock): while that still covers the new grant's deadline
        (with LEASE_COVER_MARGIN_S to spare) the lease is used as it is, no call at all;
        otherwise a keepalive resets it (the leader's lessor: no raft proposal). Either way a
        pair costs two durable writes, the create and the compare-and-delete, as etcd's own
        lock recipe does."""
        while True:
            now = monotonic()
            expires_ms = _ms(_now()) + seconds * 1000
            with self._lease_guard:
                spare = self._spare_leases.get(seconds)
                lease = spare.pop() if spare else 0
                covered = self._lease_cover.get(lease, 0.0)
                if lease and covered - now >= seconds + LEASE_COVER_MARGIN_S:
                    self._grant_leases[lease] = seconds
                    return lease, expires_ms
            if not lease:
                break
            try:
                ttl = self.client.lease_keepalive(lease)
                if ttl > 0:
                    with self._lease_guard:
                        self._grant_leases[lease] = seconds
                        self._lease_cover[lease] = now + ttl
                    return lease, expires_ms
            except EtcdUnavailable:
                raise
            except EtcdError:
                pass  # expired meanwhile: try the next, or grant one
            with self._lease_guard:
                self._lease_cover.pop(lease, None)
        lease, ttl = self.client.lease_grant(seconds + LEASE_SLACK_S)
        with self._lease_guard:
            if len(self._grant_leases) > 10_000:
                self._grant_leases.clear()
                self._lease_cover.clear()
            self._grant_leases[lease] = seconds
            self._lease_cover[lease] = now + ttl
        return lease, expires_ms

    def _recycle(self, lease: int) -> None:
        """A grant lease of ours that no key is attached to any more: kept for the next grant of
        the same TTL (it expires on its own if none comes); one not made here is left alone."""
        with self._lease_guard:
            seconds = self._grant_leases.pop(lease, None)
            if seconds is None:
                return
            spare = self._spare_leases.setdefault(seconds, [])
            if len(spare) < 256:
                spare.append(lease)
            else:
                self._lease_cover.pop(lease, None)

    def _lease_lost(self, exc: EtcdError, lease: int) -> bool:
        """`exc` says a put named a lease etcd no longer has (revoked behind this process's
        back, or a store restored without it): forget it and every kept lease of its TTL (they
        are suspect alike), so the next `_grant_lease` grants a fresh one; False for any other
        error."""
        if isinstance(exc, EtcdUnavailable) or "lease not found" not in str(exc):
            return False
        with self._lease_guard:
            seconds = self._grant_leases.pop(lease, None)
            self._lease_cover.pop(lease, None)
            for spare in self._spare_leases.pop(seconds, []) if seconds is not None else []:
                self._lease_cover.pop(spare, None)
        return True

    def _unmarked(self, lease: int) -> list[RequestOp]:
        """The lease's `glease/` marker, for the txn that puts the first grant on it (the
        expiry watcher's signal: keys.py); nothing once a grant txn on it succeeded."""
        with self._lease_guard:
            return [] if lease in self._marked_leases else [self._lease_marker(lease)]

    def _marked(self, lease: int) -> None:
        with self._lease_guard:
            if len(self._marked_leases) > 20_000:
                self._marked_leases.clear()  # a marker put again is harmless
            self._marked_leases.add(lease)

    def _revoke_quietly(self, lease: int) -> None:
        try:
            self.client.lease_revoke(lease)
        except EtcdError:
            logger.info("could not revoke unused lease %s (it expires on its own)", lease)

    def _holder(self, key: str) -> tuple[KeyValue | None, KeyValue | None, int]:
        """(grant, its session's key, revision); the session is None when the grant is not live
        (its session is gone, or its own or its session's recorded deadline has passed)."""
        kv, sess, revision, lapsed = self._holder_state(key)
        return kv, None if lapsed else sess, revision

    def _holder_state(
        self, key: str, known: KeyValue | None = None
    ) -> tuple[KeyValue | None, KeyValue | None, int, bool]:
        """(grant, its session's key or None, revision, lapsed), once etcd has had its say.

        The deadlines recorded in both values are never earlier than etcd's own expiry of the
        leases, so when one has passed by our clock etcd has normally decided and deletes the
        key at its next lease sweep (every 500 ms): wait for that deletion (a watch, until at most
        EXPIRY_GRACE_S after the deadline; not at all once that is over). If the key is
        still there afterwards, the recorded deadline is authoritative all the same
        (lapsed=True): etcd renews every lease to its full TTL when a new leader is elected,
        and a grant must never outlive its reported expiresAt by more than about a second
        (issue 16 item 4).

        `known`: the grant as the caller just read it (a refused create answers it), used for the
        first look instead of reading it again.
        """
        lock_key = self._lock_key(key)
        for settled in (False, True):
            kv = known if known is not None and not settled else self.client.range(lock_key).first()
            if kv is None:
                return None, None, 0, True
            sess_key = self._sess_key(kv.json()["sessionId"])
            read = self.client.read(get(sess_key))
            sess = read.responses[0].first()
            if sess is None:
                return kv, None, read.revision, True
            lapsed = [k for k, v in ((lock_key, kv), (sess_key, sess)) if _deadline_passed(v)]
            # no wait once the sweep's grace after the deadlines is over (a renewed lease)
            grace = _grace_left(
                *(v for v in (kv, sess) if _deadline_passed(v)), grace_s=EXPIRY_GRACE_S
            )
            if settled or not lapsed or grace <= 0.0:
                return kv, sess, read.revision, bool(lapsed)
            self.client.wait_for_change(lapsed, after_revision=read.revision, timeout_s=grace)
        raise AssertionError("unreachable")  # pragma: no cover

    def _stored(self, key: str) -> KeyValue | None:
        """The key's live grant (its session alive too), or None."""
        kv, sess, _ = self._holder(key)
        return kv if sess is not None else None

    def _lost(self, key: str) -> ApiError:
        live = self._stored(key)
        return lock_lost(key, None if live is None else self._token(live))

    @store_call
    def renew(
        self, *, key: str, session_id: uuid.UUID, token: int, ttl_ms: int | None
    ) -> GrantRecord:
        self._live_session(session_id)
        kv, holder_session, _ = self._holder(key)
        if (
            kv is None
            or holder_session is None
            or self._token(kv) != token
            or kv.json()["sessionId"] != str(session_id)
        ):
            raise lock_lost(key, self._token(kv) if kv and holder_session else None)
        value = kv.json()
        seconds = ttl_seconds(ttl_ms) if ttl_ms else value["ttlMs"] // 1000
        for last in (False, True):
            lease, expires_ms = self._grant_lease(seconds)
            value.update(ttlMs=seconds * 1000, expiresAt=expires_ms)
            # re-attaching to a new lease is a put: ModRevision moves, create_revision (the
            # token) does not; the compare on ModRevision rejects a concurrent release or
            # takeover. A grant made by a hand-off moves its queue entry along (it ends with
            # the grant).
            queued = [put(value["queue"], HELD, lease)] if value.get("queue") else []
            try:
                result = self.client.txn(
                    [
                        compare(self._lock_key(key), "MOD", "EQUAL", kv.mod_revision),
                        compare(self._sess_key(session_id), "CREATE", "GREATER", 0),
                    ],
                    [
                        put(self._lock_key(key), _dump(value), lease),
                        put(self._held_key(session_id, key), key, lease),
                        *queued,
                        *self._unmarked(lease),
                    ],
                )
                break
            except EtcdError as exc:
                if last or not self._lease_lost(exc, lease):
                    raise
        if not result.succeeded:
            self._recycle(lease)
            if self.client.range(self._sess_key(session_id)).first() is None:
                raise self._session_gone(session_id, self._read_meta(session_id))
            raise self._lost(key)
        self._marked(lease)
        if kv.lease in self._grant_leases:
            self._recycle(kv.lease)  # the grant moved off it: empty, ours, reusable
        else:
            self._revoke_quietly(kv.lease)
        return GrantRecord(
            key=key,
            owner_id=value["ownerId"],
            session_id=session_id,
            fencing_token=token,
            acquired_at=_from_ms(value["acquiredAt"]),
            expires_at=_from_ms(value["expiresAt"]),
        )

    @store_call
    def release(self, *, key: str, session_id: uuid.UUID, token: int) -> None:
        lock_key = self._lock_key(key)
        offset = self._current_offset()
        # Fast path: the caller's session holds it and the grant has today's offset.
        # Compare-and-delete on (key, token): create_revision == token - offset; the index
        # entry, written in the grant's txn, has the same create_revision.
        result = self.client.txn(
            [
                compare(lock_key, "CREATE", "EQUAL", token - offset),
                compare(self._held_key(session_id, key), "CREATE", "EQUAL", token - offset),
                compare(self._sess_key(session_id), "CREATE", "GREATER", 0),
            ],
            [
                delete(lock_key, prev_kv=True),
                delete(self._held_key(session_id, key)),
                get(self._sess_key(session_id)),
                self._queue_end(key, session_id),
            ],
            [get(lock_key)],
        )
        if result.succeeded:
            # the grant's lease is now empty and expires on its own (≤ 60 s). A grant that had
            # lapsed (etcd had decided, not yet swept) is gone either way; say so, as pg does
            deleted = result.responses[0].first() if result.responses[0] else None
            session = result.responses[2].first() if result.responses[2] else None
            if deleted is not None:
                self._recycle(deleted.lease)  # its keys went with this txn
            if _deadline_passed(deleted) or _deadline_passed(session):
                raise lock_lost(key, None)
            return
        kv, holder_session, _ = self._holder(key)
        if kv is None or holder_session is None or self._token(kv) != token:
            raise lock_lost(key, self._token(kv) if kv and holder_session else None)
        # the right token named from another session (the predicate is (key, token) only),
        # issued under an older offset, or held by a session that has expired
        holder_sid = kv.json()["sessionId"]
        slow = self.client.txn(
            [
                compare(lock_key, "MOD", "EQUAL", kv.mod_revision),
                compare(self._sess_key(holder_sid), "CREATE", "GREATER", 0),
            ],
            [
                delete(lock_key),
                delete(self._held_key(holder_sid, key)),
                self._queue_end(key, holder_sid),
            ],
        )
        if not slow.succeeded:
            raise self._lost(key)

    @store_call
    def inspect(self, *, key: str) -> LockInfoRecord:
        read = self.client.read(
            get(self._lock_key(key)),
            get(self._k("seen", key)),
            get(self._wait_prefix(key), prefix=True),
        )
        kv = read.responses[0].first()
        waiters = sum(1 for entry in read.responses[2].kvs if entry.value != HELD)
        if kv is not None:
            kv = self._stored(key)
            if kv is not None:
                grant = self._grant_record(key, kv)
                return LockInfoRecord(
                    key=key,
                    held=True,
                    owner_id=grant.owner_id,
                    fencing_token=grant.fencing_token,
                    acquired_at=grant.acquired_at,
                    expires_at=grant.expires_at,
                    waiter_count=waiters,
                )
        elif read.responses[1].first() is None:
            raise not_found("lock", key)
        return LockInfoRecord(
            key=key,
            held=False,
            owner_id=None,
            fencing_token=None,
            acquired_at=None,
            expires_at=None,
            waiter_count=waiters,
        )

    @store_call
    def revoke(
        self, *, key: str, operator: str, reason: str, expected_token: int | None
    ) -> RevocationRecord:
        self._current_offset()
        lock_key = self._lock_key(key)
        for _attempt in range(8):
            kv = self._stored(key)
            if kv is None:
                raise lock_not_held(key)
            value = kv.json()
            revoked = self._token(kv)
            if expected_token is not None and expected_token != revoked:
                raise expected_token_mismatch(key, expected_token=expected_token, token=revoked)
            revocation_id = uuid.uuid4()
            offset = self._current_offset()
            audit = {
                "revocationId": str(revocation_id),
                "key": key,
                "operator": operator,
                "reason": reason,
                "revokedToken": revoked,
                "revokedOwnerId": value["ownerId"],
                "revokedSessionId": value["sessionId"],
                "offset": offset,
                "revokedAt": _ms(_now()),
            }
            # The delete and the audit record are one write at revision R; every later grant
            # has create_revision > R, so its token exceeds offset + R = newTokenFloor.
            result = self.client.txn(
                [compare(lock_key, "MOD", "EQUAL", kv.mod_revision)],
                [
                    delete(lock_key),
                    delete(self._held_key(value["sessionId"], key)),
                    self._queue_end(key, value["sessionId"]),
                    put(self._k("revocation", str(revocation_id)), _dump(audit)),
                ],
            )
            if result.succeeded:
                # the floor may reach a resource's fence (revoke_lock pushes it): cover it too
                self._reserve(offset + result.revision)
                return RevocationRecord(
                    key=key,
                    revoked_token=revoked,
                    new_token_floor=offset + result.revision,
                    revocation_id=revocation_id,
                    revoked_owner_id=value["ownerId"],
                )
        raise EtcdUnavailable("revoke did not settle after repeated races")

    def revocations(self) -> list[dict[str, Any]]:
        """Every audit record (tests and operators); newTokenFloor = offset + its revision."""
        rows = []
        for kv in self.client.range(self._k("revocation") + "/", prefix=True).kvs:
            row = kv.json()
            row["newTokenFloor"] = row["offset"] + kv.mod_revision
            rows.append(row)
        return rows
