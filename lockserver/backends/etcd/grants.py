"""Grants on etcd once made: who holds a key (after etcd's expiry verdict), L5 renew, L6
release, L7 inspect, L8 revoke."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from dlock.errors import ApiError, not_found
from dlock.timefmt import rfc3339_ms
from lockserver.backends.base import GrantRecord, LockInfoRecord, RevocationRecord
from lockserver.backends.etcd.common import (
    EXPIRY_GRACE_S,
    store_call,
    ttl_seconds,
)
from lockserver.backends.etcd.keys import (
    HELD,
    KeySpace,
    deadline_passed,
    dump_json,
    epoch_ms,
    from_epoch_ms,
    grace_left,
    utc_now,
)
from lockserver.backends.etcd.leases import LeasePool
from lockserver.backends.etcd.sessions import Sessions
from lockserver.backends.etcd.tokens import TokenAllocator
from lockserver.errors import (
    expected_token_mismatch,
    lock_contended,
    lock_lost,
    lock_not_held,
)
from lockserver.etcd_client import EtcdClient, EtcdError, EtcdUnavailable
from lockserver.etcd_ops import KeyValue, compare, delete, get, put

logger = logging.getLogger("dlock.lockserver.etcd")


class Grants:
    """Grants once made: who holds a key (after etcd's expiry verdict), L5–L8."""

    def __init__(
        self,
        *,
        name: str,
        client: EtcdClient,
        keys: KeySpace,
        tokens: TokenAllocator,
        leases: LeasePool,
        sessions: Sessions,
    ) -> None:
        self.name = name
        self.client = client
        self.keys = keys
        self.tokens = tokens
        self.leases = leases
        self.sessions = sessions

    def record(self, key: str, kv: KeyValue) -> GrantRecord:
        value = kv.json()
        return GrantRecord(
            key=key,
            owner_id=value["ownerId"],
            session_id=uuid.UUID(value["sessionId"]),
            fencing_token=value["offset"] + kv.create_revision,
            acquired_at=from_epoch_ms(value["acquiredAt"]),
            expires_at=from_epoch_ms(value["expiresAt"]),
        )

    @staticmethod
    def ms_until_free(holder: KeyValue, session: KeyValue) -> int:
        """Until the grant frees: its own deadline or its session's, whichever comes first
        (pg: LEAST(grant, session expiry))."""
        until = holder.json()["expiresAt"]
        until = min(until, session.json().get("expiresAt", until))
        return max(0, until - epoch_ms(utc_now()))

    def contended(self, key: str, holder: KeyValue, session: KeyValue) -> ApiError:
        value = holder.json()
        return lock_contended(
            key,
            holder_owner_id=value["ownerId"],
            expires_at=rfc3339_ms(from_epoch_ms(value["expiresAt"])),
            ms_until_free=self.ms_until_free(holder, session),
        )

    def holder(self, key: str) -> tuple[KeyValue | None, KeyValue | None, int]:
        """(grant, its session's key, revision); the session is None when the grant is not live
        (its session is gone, or its own or its session's recorded deadline has passed)."""
        kv, sess, revision, lapsed = self.holder_state(key)
        return kv, None if lapsed else sess, revision

    def holder_state(
        self, key: str, known: KeyValue | None = None
    ) -> tuple[KeyValue | None, KeyValue | None, int, bool]:
        """(grant, its session's key or None, revision, lapsed), once etcd has had its say.

        The deadlines recorded in both values are never earlier than etcd's own expiry of the
        leases, so when one has passed by our clock etcd has normally decided and deletes the
        key at its next lease sweep (every 500 ms): wait for that deletion (a watch, until at most
        EXPIRY_GRACE_S after the deadline; not at all once that is over). If the key is
        still there afterwards, the recorded deadline is authoritative all the same
        (lapsed=True): etcd renews every lease to its full TTL when a new leader is elected,
        and a grant must never outlive its reported expiresAt by more than about a second.

        `known`: the grant as the caller just read it (a refused create answers it), used for the
        first look instead of reading it again.
        """
        lock_key = self.keys.lock_key(key)
        for settled in (False, True):
            kv = known if known is not None and not settled else self.client.range(lock_key).first()
            if kv is None:
                return None, None, 0, True
            sess_key = self.keys.sess_key(kv.json()["sessionId"])
            read = self.client.read(get(sess_key))
            sess = read.responses[0].first()
            if sess is None:
                return kv, None, read.revision, True
            lapsed = [k for k, v in ((lock_key, kv), (sess_key, sess)) if deadline_passed(v)]
            # no wait once the sweep's grace after the deadlines is over (a renewed lease)
            grace = grace_left(
                *(v for v in (kv, sess) if deadline_passed(v)), grace_s=EXPIRY_GRACE_S
            )
            if settled or not lapsed or grace <= 0.0:
                return kv, sess, read.revision, bool(lapsed)
            self.client.wait_for_change(lapsed, after_revision=read.revision, timeout_s=grace)
        raise AssertionError("unreachable")  # pragma: no cover

    def stored(self, key: str) -> KeyValue | None:
        """The key's live grant (its session alive too), or None."""
        kv, sess, _ = self.holder(key)
        return kv if sess is not None else None

    def lost(self, key: str) -> ApiError:
        live = self.stored(key)
        return lock_lost(key, None if live is None else self.tokens.token(live))

    @store_call
    def renew(
        self, *, key: str, session_id: uuid.UUID, token: int, ttl_ms: int | None
    ) -> GrantRecord:
        self.sessions.live(session_id)
        kv, holder_session, _ = self.holder(key)
        if (
            kv is None
            or holder_session is None
            or self.tokens.token(kv) != token
            or kv.json()["sessionId"] != str(session_id)
        ):
            raise lock_lost(key, self.tokens.token(kv) if kv and holder_session else None)
        value = kv.json()
        seconds = ttl_seconds(ttl_ms) if ttl_ms else value["ttlMs"] // 1000
        for last in (False, True):
            lease, expires_ms = self.leases.grant(seconds)
            value.update(ttlMs=seconds * 1000, expiresAt=expires_ms)
            # re-attaching to a new lease is a put: ModRevision moves, create_revision (the
            # token) does not; the compare on ModRevision rejects a concurrent release or
            # takeover. A grant made by a hand-off moves its queue entry along (it ends with
            # the grant).
            queued = [put(value["queue"], HELD, lease)] if value.get("queue") else []
            try:
                result = self.client.txn(
                    [
                        compare(self.keys.lock_key(key), "MOD", "EQUAL", kv.mod_revision),
                        compare(self.keys.sess_key(session_id), "CREATE", "GREATER", 0),
                    ],
                    [
                        put(self.keys.lock_key(key), dump_json(value), lease),
                        put(self.keys.held_key(session_id, key), key, lease),
                        *queued,
                        *self.leases.unmarked(lease),
                    ],
                )
                break
            except EtcdError as exc:
                if last or not self.leases.lost(exc, lease):
                    raise
        if not result.succeeded:
            self.leases.recycle(lease)
            if self.client.range(self.keys.sess_key(session_id)).first() is None:
                raise self.sessions.gone(session_id, self.sessions.read_meta(session_id))
            raise self.lost(key)
        self.leases.marked(lease)
        if self.leases.is_ours(kv.lease):
            self.leases.recycle(kv.lease)  # the grant moved off it: empty, ours, reusable
        else:
            self.leases.revoke_quietly(kv.lease)
        return GrantRecord(
            key=key,
            owner_id=value["ownerId"],
            session_id=session_id,
            fencing_token=token,
            acquired_at=from_epoch_ms(value["acquiredAt"]),
            expires_at=from_epoch_ms(value["expiresAt"]),
        )

    @store_call
    def release(self, *, key: str, session_id: uuid.UUID, token: int) -> None:
        lock_key = self.keys.lock_key(key)
        offset = self.tokens.current_offset()
        # Fast path: the caller's session holds it and the grant has today's offset.
        # Compare-and-delete on (key, token): create_revision == token - offset; the index
        # entry, written in the grant's txn, has the same create_revision.
        result = self.client.txn(
            [
                compare(lock_key, "CREATE", "EQUAL", token - offset),
                compare(self.keys.held_key(session_id, key), "CREATE", "EQUAL", token - offset),
                compare(self.keys.sess_key(session_id), "CREATE", "GREATER", 0),
            ],
            [
                delete(lock_key, prev_kv=True),
                delete(self.keys.held_key(session_id, key)),
                get(self.keys.sess_key(session_id)),
                self.keys.queue_end(key, session_id),
            ],
            [get(lock_key)],
        )
        if result.succeeded:
            # the grant's lease is now empty and expires on its own (≤ 60 s). A grant that had
            # lapsed (etcd had decided, not yet swept) is gone either way; say so, as pg does
            deleted = result.responses[0].first() if result.responses[0] else None
            session = result.responses[2].first() if result.responses[2] else None
            if deleted is not None:
                self.leases.recycle(deleted.lease)  # its keys went with this txn
            if deadline_passed(deleted) or deadline_passed(session):
                raise lock_lost(key, None)
            return
        kv, holder_session, _ = self.holder(key)
        if kv is None or holder_session is None or self.tokens.token(kv) != token:
            raise lock_lost(key, self.tokens.token(kv) if kv and holder_session else None)
        # the right token named from another session (the predicate is (key, token) only),
        # issued under an older offset, or held by a session that has expired
        holder_sid = kv.json()["sessionId"]
        slow = self.client.txn(
            [
                compare(lock_key, "MOD", "EQUAL", kv.mod_revision),
                compare(self.keys.sess_key(holder_sid), "CREATE", "GREATER", 0),
            ],
            [
                delete(lock_key),
                delete(self.keys.held_key(holder_sid, key)),
                self.keys.queue_end(key, holder_sid),
            ],
        )
        if not slow.succeeded:
            raise self.lost(key)

    @store_call
    def inspect(self, *, key: str) -> LockInfoRecord:
        read = self.client.read(
            get(self.keys.lock_key(key)),
            get(self.keys.k("seen", key)),
            get(self.keys.wait_prefix(key), prefix=True),
        )
        kv = read.responses[0].first()
        waiters = sum(1 for entry in read.responses[2].kvs if entry.value != HELD)
        if kv is not None:
            kv = self.stored(key)
            if kv is not None:
                grant = self.record(key, kv)
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
        self.tokens.current_offset()
        lock_key = self.keys.lock_key(key)
        for _attempt in range(8):
            kv = self.stored(key)
            if kv is None:
                raise lock_not_held(key)
            value = kv.json()
            revoked = self.tokens.token(kv)
            if expected_token is not None and expected_token != revoked:
                raise expected_token_mismatch(key, expected_token=expected_token, token=revoked)
            revocation_id = uuid.uuid4()
            offset = self.tokens.current_offset()
            audit = {
                "revocationId": str(revocation_id),
                "key": key,
                "operator": operator,
                "reason": reason,
                "revokedToken": revoked,
                "revokedOwnerId": value["ownerId"],
                "revokedSessionId": value["sessionId"],
                "offset": offset,
                "revokedAt": epoch_ms(utc_now()),
            }
            # The delete and the audit record are one write at revision R; every later grant
            # has create_revision > R, so its token exceeds offset + R = newTokenFloor.
            result = self.client.txn(
                [compare(lock_key, "MOD", "EQUAL", kv.mod_revision)],
                [
                    delete(lock_key),
                    delete(self.keys.held_key(value["sessionId"], key)),
                    self.keys.queue_end(key, value["sessionId"]),
                    put(self.keys.k("revocation", str(revocation_id)), dump_json(audit)),
                ],
            )
            if result.succeeded:
                # the floor may reach a resource's fence (revoke_lock pushes it): cover it too
                self.tokens.reserve(offset + result.revision)
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
        for kv in self.client.range(self.keys.k("revocation") + "/", prefix=True).kvs:
            row = kv.json()
            row["newTokenFloor"] = row["offset"] + kv.mod_revision
            rows.append(row)
        return rows
