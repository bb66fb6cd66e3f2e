"""The queue of waiters on a key (ARCHITECTURE decision 23), as etcd's own lock recipe keeps it:
entries under `wait/{key}/` in create-revision order, each on a short lease of its own; a waiter
watches only the entry just before its own, the head watches the grant and its holder's
session; the per-key cap is decided by rank at the registration's revision."""

from __future__ import annotations

import math
import uuid

from dlock.metrics import lock_waiter_wakeups
from lockserver.backends.etcd.common import EXPIRY_GRACE_S
from lockserver.backends.etcd.grants import Grants
from lockserver.backends.etcd.keys import HELD, KeySpace, grace_left
from lockserver.backends.etcd.leases import LeasePool
from lockserver.errors import contention_exceeded
from lockserver.etcd_client import EtcdClient, EtcdError
from lockserver.etcd_ops import KeyValue, TxnResult, get, put


class Waiters:
    """Registration in a key's queue and the wait for one's turn."""

    def __init__(
        self, *, name: str, client: EtcdClient, keys: KeySpace, leases: LeasePool, cap: int
    ) -> None:
        self.name = name
        self.client = client
        self.keys = keys
        self.leases = leases
        self.waiter_cap = cap

    def await_turn(
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
        lock_key = self.keys.lock_key(key)
        read = look or self.client.read(get(self.keys.wait_prefix(key), prefix=True), get(lock_key))
        entries = read.responses[0].kvs
        if not any(entry.key == queue[0] for entry in entries):
            raise Withdrawn
        earlier = [
            entry for entry in entries if entry.create_revision < queue[1] and entry.value != HELD
        ]
        holder = read.responses[1].first()
        if earlier:
            watched = [max(earlier, key=lambda entry: entry.create_revision).key]
        elif holder is None:
            return  # the head, and the key is free: our turn
        else:
            watched = [lock_key, self.keys.sess_key(holder.json()["sessionId"])]
            # etcd deletes a lapsed grant up to LEASE_SLACK_S after its recorded deadline; the
            # head looks again by then + the grace, when a contender would take it over
            timeout_s = min(timeout_s, grace_left(holder, grace_s=EXPIRY_GRACE_S))
        woken = self.client.wait_for_change(
            [*watched, self.keys.sess_key(session_id)],
            after_revision=read.revision,
            timeout_s=timeout_s,
            deletions_only=True,
        )
        lock_waiter_wakeups.labels(backend=self.name, cause="direct" if woken else "timer").inc()

    def register(
        self,
        *,
        key: str,
        session_id: uuid.UUID,
        wait_ms: int,
        holder: KeyValue | None,
        session: KeyValue | None,
    ) -> tuple[int, tuple[str, int], TxnResult]:
        """A queue entry on its own short lease: (the lease, (entry, its create revision), the
        queue and the grant as the registering txn saw them, for the first `await_turn`);
        beyond the cap → 429 CONTENTION_EXCEEDED.

        The cap is decided by rank (create revision) among the waiters at the registration's
        revision (a txn's ranges see its own put), so two concurrent registrations cannot both
        slip under it.
        """
        # a lease this process emptied, refreshed (no Raft proposal), when one is kept
        own = self.keys.k("wait", key, str(session_id), uuid.uuid4().hex)
        for last in (False, True):
            lease, _ = self.leases.grant(math.ceil(wait_ms / 1000) + 2)
            try:
                written = self.client.txn(
                    [],
                    [
                        put(own, "1", lease),
                        get(self.keys.wait_prefix(key), prefix=True),
                        get(self.keys.lock_key(key)),
                    ],
                )
                break
            except EtcdError as exc:
                if not last and self.leases.lost(exc, lease):
                    continue  # gone behind our back: once more on a fresh lease
                self.leases.revoke_quietly(lease)
                raise
            except BaseException:
                self.leases.revoke_quietly(lease)
                raise
        waiters = written.responses[1].kvs
        earlier = sum(
            1 for kv in waiters if kv.create_revision < written.revision and kv.value != HELD
        )
        if earlier >= self.waiter_cap:
            self.leases.revoke_quietly(lease)
            ms_until_free = (
                None if holder is None or session is None else Grants.ms_until_free(holder, session)
            )
            raise contention_exceeded(key, cap=self.waiter_cap, ms_until_free=ms_until_free)
        look = TxnResult(written.succeeded, written.revision, written.responses[1:])
        return lease, (own, written.revision), look


class Withdrawn(Exception):
    """Our queue entry is gone: the wait ran out (its lease lapsed) or the session's grant
    ended it."""
