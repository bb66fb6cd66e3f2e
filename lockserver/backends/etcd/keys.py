"""Key layout and stored values of the etcd lock backend (lock.backend=etcd).

Layout under settings.ETCD_PREFIX (default `dlock/`); lock keys match [a-zA-Z0-9:._-]+, so
`/` separates safely:

  sess/{sid}          the session is alive: attached to the session's lease (TTL = ttlMillis)
  smeta/{sid}         session metadata (ownerId, ttl, lease): attached to a long *retention*
                      lease, so an expired session answers 410 and an unknown one 404
  lock/{key}          the grant: attached to a lease of its own (TTL = the grant's whole
                      seconds + LEASE_SLACK_S, so an emptied lease carries the next grant
                      without a keepalive; the value's expiresAt is the grant's deadline);
                      token = offset + create_revision (the ModRevision of the creating put)
  held/{sid}/{key}    index of a session's grants (same lease, same txn as the grant)
  seen/{key}          the key was granted at least once (L7 answers 404 otherwise): written
                      by the first grant of the key only (a nested txn guarded by
                      CREATE == 0), never again
  glease/{id}         marks lease {id} as a grant lease of this backend: put with the first
                      grant on the lease, on the lease, never deleted by anything but the
                      lease's end, so its deletion (watched by every replica: one event per
                      lease that ends, none per release) is when a grant on it may have
                      expired; the grant is the lock/ key on that lease just before
  wait/{key}/{sid}/{id}  a parked acquire of session sid: the key's queue, in create-revision
                      order (ARCHITECTURE decision 23); on a short lease of its own while it
                      waits. The grant txn of the head re-puts it as `held` on the grant's
                      lease (its create revision, its place, unchanged: no watcher wakes), and
                      every txn that ends that grant deletes wait/{key}/{sid}/ with it
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
import uuid
from typing import Any

from lockserver.etcd_ops import KeyValue, RequestOp, compare, delete, nested_txn, put

INT64_MAX = 2**63 - 1
HELD = b"held"  # a queue entry whose waiter now holds the key: its place, no longer waiting


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def epoch_ms(value: dt.datetime) -> int:
    return int(value.timestamp() * 1000)


def from_epoch_ms(value: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(value / 1000, dt.UTC)


def deadline_passed(kv: KeyValue | None) -> bool:
    """The deadline recorded in a grant or session value has passed by our clock."""
    return kv is not None and kv.json().get("expiresAt", INT64_MAX) <= epoch_ms(utc_now())


def grace_left(*kvs: KeyValue | None, grace_s: float) -> float:
    """Seconds left of etcd's chance to delete keys whose recorded deadline passed: until the
    latest such deadline + `grace_s`. 0 when that is over — a key still there then was kept by
    a lease renewal (a new leader renews every lease to its full TTL, e.g. after a quorum
    loss), and waiting longer for its deletion would only delay the caller."""
    now = epoch_ms(utc_now())
    left = [
        kv.json()["expiresAt"] + grace_s * 1000 - now
        for kv in kvs
        if kv is not None and "expiresAt" in kv.json()
    ]
    return max(0.0, max(left, default=0.0) / 1000)


def dump_json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


class KeySpace:
    """The backend's key names, all under `prefix`, and the ops every part writes with them."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def k(self, *parts: str) -> str:
        return self.prefix + "/".join(parts)

    def lock_key(self, key: str) -> str:
        return self.k("lock", key)

    def sess_key(self, sid: uuid.UUID | str) -> str:
        return self.k("sess", str(sid))

    def meta_key(self, sid: uuid.UUID | str) -> str:
        return self.k("smeta", str(sid))

    def held_key(self, sid: uuid.UUID | str, key: str) -> str:
        return self.k("held", str(sid), key)

    def held_prefix(self, sid: uuid.UUID | str) -> str:
        return self.k("held", str(sid)) + "/"

    def first_grant(self, key: str) -> RequestOp:
        """In every create txn: `seen/{key}` written when the key was never granted, else no
        write at all (L7's 404 for a key never granted)."""
        seen = self.k("seen", key)
        return nested_txn([compare(seen, "CREATE", "EQUAL", 0)], [put(seen, "1")])

    def lease_marker(self, lease: int) -> RequestOp:
        """`glease/{id}` on the lease: its deletion is the lease's end (the expiry watcher)."""
        return put(self.k("glease", f"{lease:x}"), "", lease)

    def wait_prefix(self, key: str) -> str:
        return self.k("wait", key) + "/"

    def queue_end(self, key: str, sid: uuid.UUID | str) -> RequestOp:
        """In every txn that ends a grant of session sid: its queue entries, if it has any (a
        grant handed off from the queue, or another parked acquire of the same session). A
        nested txn whose compare (CREATE > 0 over the prefix: false when no key is under it)
        runs the prefix delete only then, so the common release, by a session that never
        queued, deletes nothing and etcd counts no delete."""
        entries = self.k("wait", key, str(sid)) + "/"
        return nested_txn(
            [compare(entries, "CREATE", "GREATER", 0, prefix=True)],
            [delete(entries, prefix=True)],
        )

    @property
    def offset_key(self) -> str:
        return self.k("meta", "token_offset")
