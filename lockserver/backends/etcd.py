"""The lock backend on etcd v3 (lock.backend=etcd): same wire behaviour as pg (FR-09).

Layout under settings.ETCD_PREFIX (default `dlock/`); lock keys match [a-zA-Z0-9:._-]+, so
`/` separates safely:

  sess/{sid}          the session is alive: attached to the session's lease (TTL = ttlMillis)
  smeta/{sid}         session metadata (ownerId, ttl, lease): attached to a long *retention*
                      lease, so an expired session answers 410 and an unknown one 404
  lock/{key}          the grant: attached to a lease of its own (TTL = the grant's ttlMillis);
                      token = offset + create_revision (the ModRevision of the creating put)
  held/{sid}/{key}    index of a session's grants (same lease, same txn as the grant)
  seen/{key}          the key was granted at least once (L7 answers 404 otherwise)
  wait/{key}/{id}     a blocked acquire (waiterCount, waiter cap); on a short lease of its own
  revocation/{id}     L8 audit record (operator, reason, revoked token, new floor)
  meta/token_offset   the token offset, persisted so token = offset + revision > LOCK_TOKEN_FLOOR

A grant is live iff `lock/{key}` exists AND its session's `sess/{sid}` exists: a grant outlives
neither its own TTL (its lease) nor its session (checked in every compare), exactly like pg's
`grant.expires_at > now AND session.expires_at > now`. A grant whose session died is taken over
by the next acquire (delete guarded by ModRevision, then the normal create).

Tokens are create revisions, so renew can re-attach the grant to a fresh lease (new TTL)
without changing the token; every grant stores the offset in force when it was made, so raising
the offset later never changes an issued token.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from dlock.errors import ApiError, Code, not_found
from dlock.logs import log_event
from dlock.metrics import lock_live_grants, lock_live_sessions
from dlock.timefmt import rfc3339_ms
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
from lockserver.etcd_client import (
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    compare,
    delete,
    get,
    put,
)

logger = logging.getLogger("dlock.lockserver.etcd")

F = TypeVar("F", bound=Callable[..., Any])
INT64_MAX = 2**63 - 1
# etcd's lessor revokes expired leases every 500 ms; this bounds how long a call waits for the
# store to act on an expiry that has already happened (only then; it never extends a lease)
EXPIRY_GRACE_S = 0.75
# L1 caps a session TTL at 60 s: the longest a session can outlive its last heartbeat.
MAX_SESSION_TTL_S = 60
FRESH_LEASE_S = 0.1


class TokenFloorError(RuntimeError):
    """The backend cannot guarantee that its next token exceeds LOCK_TOKEN_FLOOR."""


def _setting(name: str, default: Any) -> Any:
    """A Django setting, or the default when Django is not configured (bench, scripts)."""
    try:
        return getattr(settings, name, default)
    except ImproperlyConfigured:
        return default


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _ms(value: dt.datetime) -> int:
    return int(value.timestamp() * 1000)


def _from_ms(value: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(value / 1000, dt.UTC)


def _deadline_passed(kv: KeyValue | None) -> bool:
    """The deadline recorded in a grant or session value has passed by our clock."""
    return kv is not None and kv.json().get("expiresAt", INT64_MAX) <= _ms(_now())


def _dump(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def _not_leader(exc: Exception) -> ApiError:
    return ApiError(
        Code.NOT_LEADER,
        "the lock store is unreachable or has no leader; nothing was changed",
        retry_after_ms=_setting("LOCK_NOT_LEADER_RETRY_MS", 1_000),
    )


def store_call(method: F) -> F:
    """Every etcd failure that is about availability becomes 503 NOT_LEADER, never a 500."""

    @wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except EtcdUnavailable as exc:
            raise _not_leader(exc) from exc

    return wrapper  # type: ignore[return-value]


def ttl_seconds(ttl_ms: int) -> int:
    """etcd leases count whole seconds: the granted TTL is ttlMillis rounded down (≥ 1 s)."""
    return max(1, ttl_ms // 1000)


class EtcdLockBackend:
    name = "etcd"

    def __init__(
        self,
        *,
        url: str | None = None,
        prefix: str | None = None,
        token_floor: int | None = None,
        ensure_floor: bool = True,
        adopt_pg_sequence: bool | None = None,
        housekeeping: bool = True,
    ) -> None:
        self.url = url or _setting("ETCD_URL", "http://127.0.0.1:2379")
        self.prefix = prefix if prefix is not None else _setting("ETCD_PREFIX", "dlock/")
        self.client = EtcdClient(
            self.url,
            connect_timeout=_setting("ETCD_CONNECT_TIMEOUT_MS", 500) / 1000,
            read_timeout=_setting("ETCD_REQUEST_TIMEOUT_MS", 2_000) / 1000,
        )
        self.token_floor = (
            token_floor if token_floor is not None else _setting("LOCK_TOKEN_FLOOR", 0)
        )
        self.retention_s = max(60, _setting("LOCK_SESSION_RETENTION_MS", 3_600_000) // 1000)
        self.waiter_cap = _setting("LOCK_MAX_WAITERS_PER_KEY", 8)
        self.budget = RetryBudget(
            budget=_setting("LOCK_RETRY_BUDGET", 20),
            window_ms=_setting("LOCK_RETRY_WINDOW_MS", 10_000),
        )
        self._stopping = threading.Event()
        self._offset: int | None = None
        self._owners: dict[uuid.UUID, str] = {}
        self._offset_guard = threading.Lock()
        self._retention_lease: tuple[int, float] | None = None  # (lease id, created monotonic)
        self._retention_guard = threading.Lock()
        self.adopt_pg_sequence = (
            adopt_pg_sequence
            if adopt_pg_sequence is not None
            else _setting("LOCK_TOKEN_FLOOR_FROM_PG", True)
        )
        if ensure_floor:
            try:
                self.ensure_token_floor()
            except EtcdUnavailable:
                # not a refusal: no token is issued before the floor is ensured (every grant
                # needs _current_offset()), and requests answer 503 NOT_LEADER until then
                logger.warning("etcd unreachable at start-up; token floor checked on first use")
        if housekeeping:
            threading.Thread(
                target=self._housekeep_forever,
                args=(_setting("LOCK_HOUSEKEEPING_MS", 1_000) / 1000,),
                name="dlock-etcd-housekeeping",
                daemon=True,
            ).start()
            threading.Thread(
                target=self._watch_expiries_forever, name="dlock-etcd-expiries", daemon=True
            ).start()

    # ------------------------------------------------------------------ keys

    def _k(self, *parts: str) -> str:
        return self.prefix + "/".join(parts)

    def _lock_key(self, key: str) -> str:
        return self._k("lock", key)

    def _sess_key(self, sid: uuid.UUID | str) -> str:
        return self._k("sess", str(sid))

    def _meta_key(self, sid: uuid.UUID | str) -> str:
        return self._k("smeta", str(sid))

    def _held_key(self, sid: uuid.UUID | str, key: str) -> str:
        return self._k("held", str(sid), key)

    def _held_prefix(self, sid: uuid.UUID | str) -> str:
        return self._k("held", str(sid)) + "/"

    def _wait_prefix(self, key: str) -> str:
        return self._k("wait", key) + "/"

    # ------------------------------------------------------------------ token offset / floor

    @property
    def _offset_key(self) -> str:
        return self._k("meta", "token_offset")

    def ensure_token_floor(self) -> int:
        """Persist (or raise) the token offset so that every next token exceeds the floor.

        token = offset + create_revision and every later create_revision exceeds the current
        store revision R, so offset + R >= floor suffices. Raising the offset is always safe
        (grants keep the offset they were issued with); the only unsafe case is an int64
        overflow, which raises TokenFloorError. Returns the offset in force.
        """
        floor = max(int(self.token_floor or 0), self._pg_sequence_floor())
        if floor < 0 or floor >= INT64_MAX // 2:
            raise TokenFloorError(f"LOCK_TOKEN_FLOOR={floor} is outside 0..{INT64_MAX // 2}")
        while True:
            read = self.client.read(get(self._offset_key))
            revision = read.revision
            current = read.responses[0].first() if read.responses[0] else None
            if current is None:
                offset = max(0, floor - revision)
                guard = compare(self._offset_key, "CREATE", "EQUAL", 0)
            else:
                try:
                    stored = int(current.value)
                except ValueError:
                    raise TokenFloorError(
                        f"{self._offset_key} holds {current.value!r}, not an integer"
                    ) from None
                if stored + revision >= floor:
                    self._offset = stored
                    return stored
                offset = floor - revision
                guard = compare(self._offset_key, "MOD", "EQUAL", current.mod_revision)
            result = self.client.txn([guard], [put(self._offset_key, str(offset))])
            if result.succeeded:
                log_event(
                    "token_offset_set",
                    backend="etcd",
                    offset=offset,
                    floor=floor,
                    revision=revision,
                    previous=None if current is None else int(current.value),
                )
                self._offset = offset
                return offset
            # another lock-server replica wrote it first: read again

    def _pg_sequence_floor(self) -> int:
        """The PostgreSQL backend's last token, when lockdb is configured and reachable.

        A lock-server switched from pg to etcd keeps its LOCK_DATABASE_URL, so the highest token
        pg ever issued is an automatic floor (read-only; 0 when there is no such sequence).
        """
        if not self.adopt_pg_sequence:
            return 0
        try:
            import psycopg
            from django.db import connections

            from dlock.dbrouter import alias_for

            # a connection of its own: this runs at start-up, before Django's pool is in use
            params = dict(connections[alias_for("lockserver")].get_connection_params())
            for name in ("cursor_factory", "context", "prepare_threshold", "pool"):
                params.pop(name, None)
            params["connect_timeout"] = 2
            params["autocommit"] = True
            with psycopg.connect(**params) as conn:
                if not conn.execute(
                    "SELECT to_regclass('fencing_token_seq') IS NOT NULL"
                ).fetchone()[0]:
                    return 0
                last_value, is_called = conn.execute(
                    "SELECT last_value, is_called FROM fencing_token_seq"
                ).fetchone()
                return int(last_value if is_called else last_value - 1)
        except Exception as exc:  # unreachable lockdb: the configured floor still applies
            logger.warning("could not read fencing_token_seq from lockdb: %s", exc)
            return 0

    def _current_offset(self) -> int:
        if self._offset is None:
            with self._offset_guard:
                if self._offset is None:
                    self.ensure_token_floor()
        assert self._offset is not None
        return self._offset

    def next_token_lower_bound(self) -> int:
        """Every token issued from now on is greater than this (operators: the switch floor)."""
        revision = self.client.read(get(self._offset_key)).revision
        return self._current_offset() + revision

    # ------------------------------------------------------------------ sessions

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

    def _session_gone(self, session_id: uuid.UUID, meta: KeyValue | None) -> ApiError:
        return session_unknown(session_id) if meta is None else session_expired(session_id)

    @store_call
    def open_session(self, *, owner_id: str, ttl_ms: int) -> SessionRecord:
        seconds = ttl_seconds(ttl_ms)
        lease, granted = self.client.lease_grant(seconds)
        if granted > seconds:
            logger.warning("etcd raised a %ss lease to its minimum %ss", seconds, granted)
        session_id = uuid.uuid4()
        expires_at = _now() + dt.timedelta(seconds=seconds)
        record = {
            "ownerId": owner_id,
            "ttlMs": seconds * 1000,
            "lease": lease,
            "expiresAt": _ms(expires_at),  # never before etcd's own expiry of the lease
        }
        for _attempt in range(2):
            retention = self._retention()
            try:
                self.client.txn(
                    [],
                    [
                        put(self._sess_key(session_id), _dump(record), lease),
                        put(self._meta_key(session_id), _dump(record), retention),
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

    def _read_meta(self, session_id: uuid.UUID) -> KeyValue | None:
        return self.client.range(self._meta_key(session_id)).first()

    @store_call
    def heartbeat(self, *, session_id: uuid.UUID, owner_id: str) -> HeartbeatRecord:
        read = self.client.read(
            get(self._meta_key(session_id)),
            get(self._held_prefix(session_id), prefix=True),
        )
        meta = read.responses[0].first()
        record = self._owned_record(meta, session_id, owner_id)
        held_lock_count = self._live_grant_count(read.responses[1].kvs)
        if self.client.lease_keepalive(record["lease"]) <= 0:
            raise session_expired(session_id)
        now = _now()
        record["expiresAt"] = _ms(now) + record["ttlMs"]
        self.client.txn(
            [compare(self._sess_key(session_id), "CREATE", "GREATER", 0)],
            [put(self._sess_key(session_id), _dump(record), record["lease"])],
        )
        retention = self._retention()
        if meta.lease != retention:
            # keep the metadata at least `retention` past the last heartbeat (410 vs 404)
            self.client.txn(
                [compare(self._meta_key(session_id), "MOD", "EQUAL", meta.mod_revision)],
                [put(self._meta_key(session_id), meta.value, retention)],
            )
        return HeartbeatRecord(
            session_id=session_id,
            expires_at=_from_ms(record["expiresAt"]),
            server_time=now,
            held_lock_count=held_lock_count,
        )

    def _live_grant_count(self, held: list[KeyValue]) -> int:
        """Grants whose own deadline has not passed (etcd deletes a lapsed grant's keys at its
        next lease sweep, up to ~500 ms later; pg counts by the deadline, and so do we)."""
        if not held:
            return 0
        grants = self.client.read(*(get(self._lock_key(kv.value.decode())) for kv in held))
        return sum(
            1
            for response in grants.responses
            if (grant := response.first()) is not None and not _deadline_passed(grant)
        )

    @store_call
    def close_session(self, *, session_id: uuid.UUID, owner_id: str) -> None:
        read = self.client.read(
            get(self._meta_key(session_id)), get(self._held_prefix(session_id), prefix=True)
        )
        meta = read.responses[0].first()
        record = self._owned_record(meta, session_id, owner_id)
        # Session lease first: from here on no acquire can attach a new grant to it. Then
        # revoking each grant's lease deletes the grant and its index entry in one step. The
        # mark tells the expiry watcher that this deletion is L3, not an expiry.
        try:
            self.client.txn(
                [compare(self._sess_key(session_id), "CREATE", "GREATER", 0)],
                [
                    put(
                        self._sess_key(session_id),
                        _dump({**record, "closing": True}),
                        record["lease"],
                    )
                ],
            )
        except EtcdUnavailable:
            raise
        except EtcdError:
            pass  # the lease is already gone (the session expired): nothing to mark
        self.client.lease_revoke(record["lease"])
        held = self.client.range(self._held_prefix(session_id), prefix=True).kvs
        for entry in {kv.key: kv for kv in [*read.responses[1].kvs, *held]}.values():
            key = entry.key[len(self._held_prefix(session_id)) :]
            grant = self.client.range(self._lock_key(key)).first()
            if entry.lease and self.client.lease_revoke(entry.lease) and grant is not None:
                log_event(
                    "lock_released",
                    backend=self.name,
                    key=key,
                    fencingToken=self._token(grant),
                    ownerId=record["ownerId"],
                    sessionId=str(session_id),
                    cause="session_closed",
                )
        self.client.txn([], [delete(self._meta_key(session_id))])
        self._owners.pop(session_id, None)

    # ------------------------------------------------------------------ grants

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

    def _session_owner(self, session_id: uuid.UUID) -> str:
        """A session's ownerId never changes, so it is cached per process (bounded)."""
        owner = self._owners.get(session_id)
        if owner is None:
            meta = self._read_meta(session_id)
            if meta is None:
                raise session_unknown(session_id)
            owner = meta.json()["ownerId"]
            if len(self._owners) > 10_000:
                self._owners.clear()
            self._owners[session_id] = owner
        return owner

    def _token(self, kv: KeyValue) -> int:
        return kv.json()["offset"] + kv.create_revision

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

    def _try_grant(
        self, *, key: str, session_id: uuid.UUID, ttl_ms: int
    ) -> tuple[GrantRecord | None, KeyValue | None, KeyValue | None, int]:
        """One attempt: (grant, None, None, rev) when granted, else (None, live holder, its
        session's key, rev).

        Raises the session codes when our session is gone. A holder whose session died is
        removed (guarded by its ModRevision) and the attempt repeats. The holder's own session
        asking again gets its grant back unchanged (as on pg: re-acquire is idempotent).
        """
        seconds = ttl_seconds(ttl_ms)
        owner = self._session_owner(session_id)
        lease, _ = self.client.lease_grant(seconds)
        leased_at = time.monotonic()
        try:
            for _attempt in range(8):
                if time.monotonic() - leased_at > FRESH_LEASE_S:
                    # the lease's TTL runs from its grant: after a wait, start a fresh one so the
                    # reported expiresAt stays within milliseconds of etcd's own expiry
                    self._revoke_quietly(lease)
                    lease = 0
                    lease, _ = self.client.lease_grant(seconds)
                    leased_at = time.monotonic()
                now = _now()
                offset = self._current_offset()
                value = {
                    "ownerId": owner,
                    "sessionId": str(session_id),
                    "offset": offset,
                    "ttlMs": seconds * 1000,
                    "acquiredAt": _ms(now),
                    "expiresAt": _ms(now) + seconds * 1000,
                }
                lock_key = self._lock_key(key)
                # create_revision == 0: nobody holds the key; our session's key exists: alive
                result = self.client.txn(
                    [
                        compare(lock_key, "CREATE", "EQUAL", 0),
                        compare(self._sess_key(session_id), "CREATE", "GREATER", 0),
                    ],
                    [
                        put(lock_key, _dump(value), lease),
                        put(self._held_key(session_id, key), key, lease),
                        put(self._k("seen", key), "1"),
                        get(self._sess_key(session_id)),
                    ],
                    [get(lock_key), get(self._sess_key(session_id))],
                )
                if result.succeeded:
                    lease = 0  # now owned by the grant
                    if _deadline_passed(result.responses[3].first()):
                        self._undo_if_session_lapsed(key, session_id, result.revision)
                    grant = GrantRecord(
                        key=key,
                        owner_id=owner,
                        session_id=session_id,
                        fencing_token=offset + result.revision,
                        acquired_at=now,
                        expires_at=_from_ms(value["expiresAt"]),
                    )
                    return grant, None, None, result.revision
                ours = result.responses[1].first()
                if ours is None:
                    raise self._session_gone(session_id, self._read_meta(session_id))
                if _deadline_passed(ours):
                    # our session is past its recorded deadline, so etcd is about to sweep it:
                    # wait for its verdict (as for a holder) — 410 beats "contended, retry"
                    self._live_session(session_id)
                holder, holder_session, revision = self._holder(key)
                if holder is None:
                    continue  # released (or swept) since our txn: try again
                holder_sid = holder.json()["sessionId"]
                if holder_session is not None and holder_sid == str(session_id):
                    return self._grant_record(key, holder), None, None, revision
                if holder_session is not None:
                    return None, holder, holder_session, revision
                # the holder's session expired: its grant is released (lazily, here)
                taken = self.client.txn(
                    [
                        compare(lock_key, "MOD", "EQUAL", holder.mod_revision),
                        compare(self._sess_key(holder_sid), "CREATE", "EQUAL", 0),
                    ],
                    [delete(lock_key), delete(self._held_key(holder_sid, key))],
                )
                if taken.succeeded:
                    log_event(
                        "lock_expired",
                        backend=self.name,
                        key=key,
                        fencingToken=self._token(holder),
                        ownerId=holder.json()["ownerId"],
                        sessionId=holder_sid,
                        cause="session_expired",
                    )
            raise EtcdUnavailable("acquire did not settle after repeated races")
        finally:
            if lease:
                self._revoke_quietly(lease)

    def _undo_if_session_lapsed(self, key: str, session_id: uuid.UUID, revision: int) -> None:
        """We granted on a session whose deadline had passed, before etcd swept its key: if etcd
        now deletes it, withdraw the grant (nobody saw it) and answer 410 as pg would."""
        try:
            self._live_session(session_id)
        except ApiError:
            self.client.txn(
                [compare(self._lock_key(key), "MOD", "EQUAL", revision)],
                [delete(self._lock_key(key)), delete(self._held_key(session_id, key))],
            )
            # ... and the "ever seen" mark, if this grant is what created it (L7 answers 404
            # for a key never granted, as pg does when the acquire is refused)
            self.client.txn(
                [compare(self._k("seen", key), "CREATE", "EQUAL", revision)],
                [delete(self._k("seen", key))],
            )
            raise

    def _revoke_quietly(self, lease: int) -> None:
        try:
            self.client.lease_revoke(lease)
        except EtcdError:
            logger.info("could not revoke unused lease %s (it expires on its own)", lease)

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
        waiter: int | None = None  # the waiter lease while we are registered
        try:
            while True:
                grant, holder, holder_session, revision = self._try_grant(
                    key=key, session_id=session_id, ttl_ms=ttl_ms
                )
                if grant is not None:
                    return grant
                assert holder is not None and holder_session is not None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.budget.spend(session_id=session_id, key=key)
                    raise self._contended(key, holder, holder_session)
                if waiter is None and wait_ms > 0:
                    waiter = self._register_waiter(
                        key=key, wait_ms=wait_ms, holder=holder, session=holder_session
                    )
                # a release deletes lock/{key}; a holder's expiry deletes sess/{holder}
                self.client.wait_for_change(
                    [self._lock_key(key), self._sess_key(holder.json()["sessionId"])],
                    after_revision=revision,
                    timeout_s=remaining,
                )
        finally:
            if waiter is not None:
                self._revoke_quietly(waiter)

    def _register_waiter(
        self, *, key: str, wait_ms: int, holder: KeyValue, session: KeyValue
    ) -> int:
        """A waiter key on its own short lease; beyond the cap → 429 CONTENTION_EXCEEDED.

        The cap is decided by rank (create revision) among the current waiters, so two
        concurrent registrations cannot both slip under it.
        """
        lease, _ = self.client.lease_grant(math.ceil(wait_ms / 1000) + 2)
        own = self._wait_prefix(key) + uuid.uuid4().hex
        try:
            written = self.client.txn([], [put(own, "1", lease)])
            waiters = self.client.range(self._wait_prefix(key), prefix=True).kvs
            earlier = sum(1 for kv in waiters if kv.create_revision < written.revision)
        except BaseException:
            self._revoke_quietly(lease)
            raise
        if earlier >= self.waiter_cap:
            self._revoke_quietly(lease)
            raise contention_exceeded(
                key, cap=self.waiter_cap, ms_until_free=self._ms_until_free(holder, session)
            )
        return lease

    def _holder(self, key: str) -> tuple[KeyValue | None, KeyValue | None, int]:
        """(grant, its session's key or None, revision), once etcd has had its say.

        The deadlines recorded in both values are never earlier than etcd's own expiry of the
        leases, so when one has passed by our clock etcd has already decided and deletes the
        key at its next lease sweep (every 500 ms). Rather than answer from a key about to
        vanish, wait for that deletion (a watch, at most EXPIRY_GRACE_S); if the key is still
        there afterwards, etcd's verdict (alive) stands.
        """
        lock_key = self._lock_key(key)
        for settled in (False, True):
            kv = self.client.range(lock_key).first()
            if kv is None:
                return None, None, 0
            sess_key = self._sess_key(kv.json()["sessionId"])
            read = self.client.read(get(sess_key))
            sess = read.responses[0].first()
            if sess is None:
                return kv, None, read.revision
            lapsed = [k for k, v in ((lock_key, kv), (sess_key, sess)) if _deadline_passed(v)]
            if settled or not lapsed:
                return kv, sess, read.revision
            self.client.wait_for_change(
                lapsed, after_revision=read.revision, timeout_s=EXPIRY_GRACE_S
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _stored(self, key: str) -> KeyValue | None:
        """The key's live grant (its session alive too), or None."""
        kv, sess, _ = self._holder(key)
        return kv if sess is not None else None

    def _live_session(self, session_id: uuid.UUID) -> KeyValue:
        """Our session's key, or SESSION_UNKNOWN / SESSION_EXPIRED (after the same grace)."""
        sess_key = self._sess_key(session_id)
        for settled in (False, True):
            read = self.client.read(get(sess_key), get(self._meta_key(session_id)))
            sess = read.responses[0].first()
            if sess is None:
                raise self._session_gone(session_id, read.responses[1].first())
            if settled or not _deadline_passed(sess):
                return sess
            self.client.wait_for_change(
                [sess_key], after_revision=read.revision, timeout_s=EXPIRY_GRACE_S
            )
        raise AssertionError("unreachable")  # pragma: no cover

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
        lease, _ = self.client.lease_grant(seconds)
        now = _now()
        value.update(ttlMs=seconds * 1000, expiresAt=_ms(now) + seconds * 1000)
        # re-attaching to a new lease is a put: ModRevision moves, create_revision (the token)
        # does not; the compare on ModRevision rejects a concurrent release or takeover
        result = self.client.txn(
            [
                compare(self._lock_key(key), "MOD", "EQUAL", kv.mod_revision),
                compare(self._sess_key(session_id), "CREATE", "GREATER", 0),
            ],
            [
                put(self._lock_key(key), _dump(value), lease),
                put(self._held_key(session_id, key), key, lease),
            ],
        )
        if not result.succeeded:
            self._revoke_quietly(lease)
            if self.client.range(self._sess_key(session_id)).first() is None:
                raise self._session_gone(session_id, self._read_meta(session_id))
            raise self._lost(key)
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
            ],
            [get(lock_key)],
        )
        if result.succeeded:
            # the grant's lease is now empty and expires on its own (≤ 60 s). A grant that had
            # lapsed (etcd had decided, not yet swept) is gone either way; say so, as pg does
            deleted = result.responses[0].first() if result.responses[0] else None
            session = result.responses[2].first() if result.responses[2] else None
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
            [delete(lock_key), delete(self._held_key(holder_sid, key))],
        )
        if not slow.succeeded:
            raise self._lost(key)

    @store_call
    def inspect(self, *, key: str) -> LockInfoRecord:
        read = self.client.read(
            get(self._lock_key(key)),
            get(self._k("seen", key)),
            get(self._wait_prefix(key), prefix=True, count_only=True),
        )
        kv = read.responses[0].first()
        waiters = read.responses[2].count
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
                    put(self._k("revocation", str(revocation_id)), _dump(audit)),
                ],
            )
            if result.succeeded:
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

    # ------------------------------------------------------------------ health / lifecycle

    def check_ready(self) -> None:
        """Readiness: the member has a leader and the token floor is in force."""
        if not self.client.has_leader():
            raise EtcdUnavailable("the etcd member has no leader")
        self._current_offset()

    def live_counts(self) -> tuple[int, int]:
        """(sessions, grant keys) for the gauges (a grant of a just-expired session may count
        until the takeover or its own lease removes it)."""
        read = self.client.read(
            get(self._k("sess") + "/", prefix=True, count_only=True),
            get(self._k("lock") + "/", prefix=True, count_only=True),
        )
        return read.responses[0].count, read.responses[1].count

    def _housekeep_forever(self, interval_s: float) -> None:
        while not self._stopping.wait(interval_s):
            try:
                sessions, grants = self.live_counts()
            except EtcdError:
                continue
            lock_live_sessions.labels(backend=self.name).set(sessions)
            lock_live_grants.labels(backend=self.name).set(grants)

    def _watch_expiries_forever(self) -> None:
        """Log `session_expired` and `lock_expired` for keys etcd deleted at a lease's expiry.

        A deleted `sess/` key whose value is not marked closing (L3 marks it first) expired; a
        deleted `lock/` key whose recorded deadline had passed expired (an explicit release or
        revoke deletes it before). Every lock-server replica logs what it sees (as pg's reaper
        does once, a deployment with N replicas has N such lines per expiry).
        """
        revision = 0
        while not self._stopping.is_set():
            try:
                if revision == 0:
                    revision = self.client.read().revision
                for seen, kv in self.client.deletions(
                    [self._k("sess") + "/", self._k("lock") + "/"],
                    after_revision=revision,
                    idle_timeout_s=5.0,
                ):
                    revision = seen
                    if kv is not None:
                        self._log_expiry(kv)
                    if self._stopping.is_set():
                        return
            except (EtcdError, ValueError, KeyError):
                self._stopping.wait(1.0)  # etcd down: try again; NOT_LEADER is the requests' job

    def _log_expiry(self, kv: KeyValue) -> None:
        value = kv.json()
        if kv.key.startswith(self._k("sess") + "/"):
            if not value.get("closing"):
                log_event(
                    "session_expired",
                    backend=self.name,
                    sessionId=kv.key.rsplit("/", 1)[-1],
                    ownerId=value.get("ownerId"),
                    expiredAt=rfc3339_ms(_from_ms(value["expiresAt"])),
                )
        elif _deadline_passed(kv):
            log_event(
                "lock_expired",
                backend=self.name,
                key=kv.key[len(self._k("lock") + "/") :],
                fencingToken=self._token(kv),
                ownerId=value.get("ownerId"),
                sessionId=value.get("sessionId"),
            )

    def close(self) -> None:
        self._stopping.set()
        self.client.close()


def start_up() -> None:
    """Once per lock-server process with LOCK_BACKEND=etcd (called from lockserver/apps.py).

    Builds the backend, which persists or raises the token offset so every next token exceeds
    LOCK_TOKEN_FLOOR (and pg's last token). A floor that cannot be made safe stops the process
    with one line; an unreachable etcd does not (the floor is then ensured before the first
    grant, and readiness stays DOWN until it is).
    """
    import sys
    from pathlib import Path

    from lockserver.backends import get_backend

    if Path(sys.argv[0]).name in ("manage.py", "django-admin"):
        return  # migrate and friends: the serving process checks the floor, not the tools
    try:
        get_backend()
    except TokenFloorError as exc:
        sys.stderr.write(f"dlock lock-server: refusing to start: {exc}\n")
        sys.stderr.flush()
        raise SystemExit(3) from None
