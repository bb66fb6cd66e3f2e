"""Sessions on etcd (L1–L3): `sess/{sid}` on the session's lease, `smeta/{sid}` on a rotated
retention lease (410 after expiry, 404 once forgotten)."""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
import uuid

from dlock.errors import ApiError
from dlock.logs import log_event
from lockserver.backends.base import HeartbeatRecord, SessionRecord
from lockserver.backends.etcd.common import (
    EXPIRY_GRACE_S,
    MAX_SESSION_TTL_S,
    store_call,
    ttl_seconds,
)
from lockserver.backends.etcd.keys import (
    KeySpace,
    deadline_passed,
    dump_json,
    epoch_ms,
    from_epoch_ms,
    grace_left,
    utc_now,
)
from lockserver.backends.etcd.tokens import TokenAllocator
from lockserver.errors import owner_mismatch, session_expired, session_unknown
from lockserver.etcd_client import EtcdClient, EtcdError, EtcdUnavailable
from lockserver.etcd_ops import KeyValue, compare, delete, get, put

logger = logging.getLogger("dlock.lockserver.etcd")


class Sessions:
    """L1–L3, and what the other parts ask of a session (its owner, whether it lives)."""

    def __init__(
        self,
        *,
        name: str,
        client: EtcdClient,
        keys: KeySpace,
        tokens: TokenAllocator,
        retention_s: int,
    ) -> None:
        self.name = name
        self.client = client
        self.keys = keys
        self.tokens = tokens
        self.retention_s = retention_s
        self._owners: dict[uuid.UUID, str] = {}
        self._retention_lease: tuple[int, float] | None = None  # (lease id, made, monotonic)
        self._retention_guard = threading.Lock()

    def _retention(self) -> int:
        """The current metadata lease: rotated every retention/2, lives retention × 1.5 plus the
        longest session TTL. A session's metadata is (re)attached at open and on heartbeats, so
        it outlives the session's expiry by at least the retention, as pg's row does, and by at
        most retention/2 + 60 s more (CHANGELOG row 33)."""
        with self._retention_guard:
            now = time.monotonic()
            if self._retention_lease is None or now - self._retention_lease[1] > (
                self.retention_s / 2
            ):
                lease, _ = self.client.lease_grant(
                    math.ceil(self.retention_s * 1.5 + MAX_SESSION_TTL_S)
                )
                self._retention_lease = (lease, now)
            return self._retention_lease[0]

    def _drop_retention(self, lease: int) -> None:
        with self._retention_guard:
            if self._retention_lease and self._retention_lease[0] == lease:
                self._retention_lease = None

    @staticmethod
    def _owned_record(meta: KeyValue | None, session_id: uuid.UUID, owner_id: str) -> dict:
        """The session's metadata, once it is known to exist and to belong to `owner_id`."""
        if meta is None:
            raise session_unknown(session_id)
        record = meta.json()
        if record["ownerId"] != owner_id:
            raise owner_mismatch()
        return record

    def gone(self, session_id: uuid.UUID, meta: KeyValue | None) -> ApiError:
        return session_unknown(session_id) if meta is None else session_expired(session_id)

    @store_call
    def open_session(
        self, *, owner_id: str, ttl_ms: int, credential_id: str | None = None
    ) -> SessionRecord:
        seconds = ttl_seconds(ttl_ms)
        lease, granted = self.client.lease_grant(seconds)
        if granted > seconds:
            logger.warning("etcd raised a %ss lease to its minimum %ss", seconds, granted)
        session_id = uuid.uuid4()
        expires_at = utc_now() + dt.timedelta(seconds=seconds)
        record = {
            "ownerId": owner_id,
            "ttlMs": seconds * 1000,
            "lease": lease,
            "expiresAt": epoch_ms(expires_at),  # never before etcd's own expiry of the lease
        }
        if credential_id is not None:
            record["credentialId"] = credential_id
        for _attempt in range(2):
            retention = self._retention()
            try:
                self.client.txn(
                    [],
                    [
                        put(self.keys.sess_key(session_id), dump_json(record), lease),
                        put(self.keys.meta_key(session_id), dump_json(record), retention),
                    ],
                )
                break
            except EtcdError as exc:
                if isinstance(exc, EtcdUnavailable) or "lease not found" not in str(exc):
                    raise
                self._drop_retention(retention)  # our retention lease vanished: make a new one
        else:  # pragma: no cover - two vanished retention leases in a row
            raise EtcdUnavailable("could not attach session metadata")
        self._owners[session_id] = owner_id
        return SessionRecord(
            session_id=session_id,
            owner_id=owner_id,
            ttl_ms=seconds * 1000,
            expires_at=expires_at,
        )

    @store_call
    def session_credential(self, session_id: uuid.UUID) -> tuple[bool, str | None]:
        """(the session is known, the credential that opened it); (True, None) for a session
        opened before its record carried one (lockserver.ownership then asks lockdb)."""
        meta = self.read_meta(session_id)
        if meta is None:
            return False, None
        return True, meta.json().get("credentialId")

    def read_meta(self, session_id: uuid.UUID) -> KeyValue | None:
        return self.client.range(self.keys.meta_key(session_id)).first()

    @store_call
    def heartbeat(self, *, session_id: uuid.UUID, owner_id: str) -> HeartbeatRecord:
        read = self.client.read(
            get(self.keys.meta_key(session_id)),
            get(self.keys.held_prefix(session_id), prefix=True),
            get(self.keys.sess_key(session_id)),
        )
        meta = read.responses[0].first()
        record = self._owned_record(meta, session_id, owner_id)
        if deadline_passed(read.responses[2].first()):
            raise session_expired(session_id)  # a lease etcd renewed past it revives nothing
        held_lock_count = self._live_grant_count(read.responses[1].kvs)
        if self.client.lease_keepalive(record["lease"]) <= 0:
            raise session_expired(session_id)
        now = utc_now()
        record["expiresAt"] = epoch_ms(now) + record["ttlMs"]
        self.client.txn(
            [compare(self.keys.sess_key(session_id), "CREATE", "GREATER", 0)],
            [put(self.keys.sess_key(session_id), dump_json(record), record["lease"])],
        )
        retention = self._retention()
        if meta.lease != retention:
            # keep the metadata at least `retention` past the last heartbeat (410 vs 404)
            self.client.txn(
                [compare(self.keys.meta_key(session_id), "MOD", "EQUAL", meta.mod_revision)],
                [put(self.keys.meta_key(session_id), meta.value, retention)],
            )
        return HeartbeatRecord(
            session_id=session_id,
            expires_at=from_epoch_ms(record["expiresAt"]),
            server_time=now,
            held_lock_count=held_lock_count,
        )

    def _live_grant_count(self, held: list[KeyValue]) -> int:
        """Grants whose own deadline has not passed (etcd deletes a lapsed grant's keys at its
        next lease sweep, up to ~500 ms later; pg counts by the deadline, and so do we)."""
        if not held:
            return 0
        grants = self.client.read(*(get(self.keys.lock_key(kv.value.decode())) for kv in held))
        return sum(
            1
            for response in grants.responses
            if (grant := response.first()) is not None and not deadline_passed(grant)
        )

    @store_call
    def close_session(self, *, session_id: uuid.UUID, owner_id: str) -> None:
        read = self.client.read(
            get(self.keys.meta_key(session_id)), get(self.keys.held_prefix(session_id), prefix=True)
        )
        meta = read.responses[0].first()
        record = self._owned_record(meta, session_id, owner_id)
        # Session lease first: from here on no acquire can attach a new grant to it. Then
        # revoking each grant's lease deletes the grant and its index entry in one step. The
        # mark tells the expiry watcher that this deletion is L3, not an expiry.
        try:
            self.client.txn(
                [compare(self.keys.sess_key(session_id), "CREATE", "GREATER", 0)],
                [
                    put(
                        self.keys.sess_key(session_id),
                        dump_json({**record, "closing": True}),
                        record["lease"],
                    )
                ],
            )
        except EtcdUnavailable:
            raise
        except EtcdError:
            pass  # the lease is already gone (the session expired): nothing to mark
        self.client.lease_revoke(record["lease"])
        held = self.client.range(self.keys.held_prefix(session_id), prefix=True).kvs
        for entry in {kv.key: kv for kv in [*read.responses[1].kvs, *held]}.values():
            key = entry.key[len(self.keys.held_prefix(session_id)) :]
            grant = self.client.range(self.keys.lock_key(key)).first()
            if entry.lease and self.client.lease_revoke(entry.lease) and grant is not None:
                log_event(
                    "lock_released",
                    backend=self.name,
                    key=key,
                    fencingToken=self.tokens.token(grant),
                    ownerId=record["ownerId"],
                    sessionId=str(session_id),
                    cause="session_closed",
                )
        self.client.txn([], [delete(self.keys.meta_key(session_id))])
        self._owners.pop(session_id, None)

    def owner(self, session_id: uuid.UUID) -> str:
        """A session's ownerId never changes, so it is cached per process (bounded)."""
        owner = self._owners.get(session_id)
        if owner is None:
            meta = self.read_meta(session_id)
            if meta is None:
                raise session_unknown(session_id)
            owner = meta.json()["ownerId"]
            if len(self._owners) > 10_000:
                self._owners.clear()
            self._owners[session_id] = owner
        return owner

    def live(self, session_id: uuid.UUID) -> KeyValue:
        """Our session's key, or SESSION_UNKNOWN / SESSION_EXPIRED (after the same grace)."""
        sess_key = self.keys.sess_key(session_id)
        for settled in (False, True):
            read = self.client.read(get(sess_key), get(self.keys.meta_key(session_id)))
            sess = read.responses[0].first()
            if sess is None:
                raise self.gone(session_id, read.responses[1].first())
            if not deadline_passed(sess):
                return sess
            grace = grace_left(sess, grace_s=EXPIRY_GRACE_S)
            if settled or grace <= 0.0:  # the recorded deadline is authoritative, whatever
                raise session_expired(session_id)  # the lease says (a renewed one: no wait)
            self.client.wait_for_change([sess_key], after_revision=read.revision, timeout_s=grace)
        raise AssertionError("unreachable")  # pragma: no cover
