"""etcd calls per acquire and per release on the etcd backend (issue 39 item 2; the pg
analogue is test_writes_per_pair.py): counted at the client's one transport method, on a real
etcd. The lease clock (`leases.monotonic`) is pinned, so whether a kept lease still covers the
next grant is decided by the test, not by how busy the box is."""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest

from lockserver.backends.etcd import leases
from lockserver.backends.etcd.common import LEASE_SLACK_S
from lockserver.etcd_ops import put, writes
from tests.lockserver.test_etcd_tokens_and_outage import backend_on

pytestmark = [pytest.mark.etcd]


class _Calls:
    """Every etcd call of the backend, by method, per thread."""

    def __init__(self, backend) -> None:
        self.by_thread: dict[str, list[str]] = {}
        call = backend.client.call

        def counted(method, request, *args, **kwargs):
            self.by_thread.setdefault(threading.current_thread().name, []).append(method)
            return call(method, request, *args, **kwargs)

        backend.client.call = counted

    def of(self, thread: str) -> Counter[str]:
        return Counter(self.by_thread.pop(thread, []))


def test_own_key_pair_is_two_calls_while_the_kept_lease_covers_the_grant(own_etcd, monkeypatch):
    now = [1_000.0]
    monkeypatch.setattr(leases, "monotonic", lambda: now[0])
    backend = backend_on(own_etcd)
    try:
        session = backend.open_session(owner_id="w", ttl_ms=10_000).session_id
        key = f"k-{uuid.uuid4().hex[:8]}"

        def pair() -> None:
            grant = backend.acquire(
                key=key, session_id=session, owner_id=None, ttl_ms=5_000, wait_ms=0
            )
            backend.release(key=key, session_id=session, token=grant.fencing_token)

        pair()  # the token floor, the offset, a lease granted for 5 + LEASE_SLACK_S s
        calls = _Calls(backend)
        me = threading.current_thread().name
        grant = backend.acquire(key=key, session_id=session, owner_id=None, ttl_ms=5_000, wait_ms=0)
        assert calls.of(me) == {"kv.Txn": 1}  # the create: the kept lease covers 5 s, no call
        backend.release(key=key, session_id=session, token=grant.fencing_token)
        assert calls.of(me) == {"kv.Txn": 1}  # the compare-and-delete
        # the lease's cover is now under 5 s + the margin: one keepalive refreshes it
        now[0] += LEASE_SLACK_S
        pair()
        assert calls.of(me) == {"lease.LeaseKeepAlive": 1, "kv.Txn": 2}
        pair()  # refreshed: covered again
        assert calls.of(me) == {"kv.Txn": 2}
    finally:
        backend.close()


def test_hot_key_hand_off_is_one_call_for_the_release_and_one_for_the_head(own_etcd, monkeypatch):
    now = [1_000.0]
    monkeypatch.setattr(leases, "monotonic", lambda: now[0])
    backend = backend_on(own_etcd)
    try:
        holder = backend.open_session(owner_id="a", ttl_ms=10_000).session_id
        waiter = backend.open_session(owner_id="b", ttl_ms=10_000).session_id
        key = f"hot-{uuid.uuid4().hex[:8]}"
        for session in (holder, waiter):  # warm: both sessions' owners, a kept lease each
            grant = backend.acquire(
                key=key, session_id=session, owner_id=None, ttl_ms=5_000, wait_ms=0
            )
            backend.release(key=key, session_id=session, token=grant.fencing_token)
        held = backend.acquire(key=key, session_id=holder, owner_id=None, ttl_ms=5_000, wait_ms=0)
        calls = _Calls(backend)
        parked = threading.Event()
        watch = backend.client.wait_for_change

        def watching(*args, **kwargs):
            parked.set()
            return watch(*args, **kwargs)

        backend.client.wait_for_change = watching
        handed: list = []
        thread = threading.Thread(
            target=lambda: handed.append(
                backend.acquire(
                    key=key, session_id=waiter, owner_id=None, ttl_ms=5_000, wait_ms=60_000
                )
            ),
            name="waiter",
        )
        thread.start()
        parked.wait()
        parking = calls.of("waiter")
        me = threading.current_thread().name
        backend.release(key=key, session_id=holder, token=held.fencing_token)
        thread.join()
        assert handed and handed[0].fencing_token > held.fencing_token
        # parking: the refused create (it answers the holder), the holder's session read, a
        # lease for the grant and one for the queue entry (no kept lease of those TTLs here),
        # the entry's put with the queue and the grant read in the same txn; then the watch
        assert parking == {"kv.Txn": 3, "lease.LeaseGrant": 2}
        assert calls.of(me) == {"kv.Txn": 1}  # the release: compare-and-delete
        assert calls.of("waiter") == {"kv.Txn": 1}  # woken once, granted by its create
        assert not any(calls.by_thread.values())
    finally:
        backend.close()


def test_a_kept_lease_revoked_behind_the_servers_back_is_replaced_not_an_error(
    own_etcd, monkeypatch
):
    """An operator's `etcdctl lease revoke`, or a store restored without the lease: a kept
    lease used with no keepalive is gone, and the put naming it is refused. The acquire, the
    renew and a waiter's registration each take a fresh lease instead of failing."""
    now = [1_000.0]
    monkeypatch.setattr(leases, "monotonic", lambda: now[0])
    backend = backend_on(own_etcd)
    try:
        session = backend.open_session(owner_id="w", ttl_ms=10_000).session_id
        other = backend.open_session(owner_id="o", ttl_ms=10_000).session_id
        key = f"k-{uuid.uuid4().hex[:8]}"

        def revoke_the_kept_leases(seconds: int) -> list[int]:
            kept = list(backend.leases.spare_leases.get(seconds, []))
            assert kept
            for lease in kept:
                assert backend.client.lease_revoke(lease)
            return kept

        first = backend.acquire(key=key, session_id=session, owner_id=None, ttl_ms=5_000, wait_ms=0)
        backend.release(key=key, session_id=session, token=first.fencing_token)
        gone = revoke_the_kept_leases(5)
        grant = backend.acquire(key=key, session_id=session, owner_id=None, ttl_ms=5_000, wait_ms=0)
        assert grant.fencing_token > first.fencing_token
        assert backend.client.range(backend.keys.lock_key(key)).first().lease not in gone

        # renew onto a kept lease of another TTL that is gone too
        spare = backend.acquire(
            key="spare", session_id=session, owner_id=None, ttl_ms=7_000, wait_ms=0
        )
        backend.release(key="spare", session_id=session, token=spare.fencing_token)
        gone = revoke_the_kept_leases(7)
        renewed = backend.renew(
            key=key, session_id=session, token=grant.fencing_token, ttl_ms=7_000
        )
        assert renewed.fencing_token == grant.fencing_token
        assert backend.client.range(backend.keys.lock_key(key)).first().lease not in gone

        # a waiter's registration on a kept waiter lease that is gone (wait 1 s: a 3 s lease)
        waiter = backend.leases.grant(3)[0]
        backend.leases.recycle(waiter)
        revoke_the_kept_leases(3)
        with pytest.raises(Exception) as refused:  # held by `session`: 409 once the wait is over
            backend.acquire(key=key, session_id=other, owner_id=None, ttl_ms=5_000, wait_ms=1)
        assert getattr(refused.value, "code", None) == "LOCK_CONTENDED", refused.value
    finally:
        backend.close()


def _store_work(requests) -> Counter[str]:
    """Keys written (puts, deletes: a prefix delete counts as one) and compares, over the
    write transactions sent; a nested transaction's compares count, its writes only where
    they ran (`ran`: the nested ops etcd answered with a TxnResponse that succeeded)."""
    work: Counter[str] = Counter()
    for request, answer in requests:
        work["compares"] += len(request.compare)
        for op, response in zip(request.success, answer.responses, strict=True):
            kind = op.WhichOneof("request")
            if kind in ("request_put", "request_delete_range"):
                work["key writes"] += 1
            elif kind == "request_txn":
                work["compares"] += len(op.request_txn.compare)
                if response.response_txn.succeeded:
                    work["key writes"] += len(op.request_txn.success)
    return work


def _recording(backend) -> list:
    """(request, answer) of every write transaction the backend sends from now on."""
    sent: list = []
    call = backend.client.call

    def recorded(method, request, *args, **kwargs):
        answer = call(method, request, *args, **kwargs)
        if method == "kv.Txn" and writes([*request.success, *request.failure]):
            sent.append((request, answer))
        return answer

    backend.client.call = recorded
    return sent


def test_an_uncontended_pair_writes_the_recipes_keys_and_the_sessions_index_only(
    own_etcd, monkeypatch
):
    """The recipe: a put and a delete. dlock adds the session's index entry (`held/`: L2's
    heldLockCount and L3 without scanning every grant). The `seen/` marker is checked by the
    first grant of a key this process makes and written by a key's first grant only; a
    release re-puts nothing and deletes the queue's prefix only when a compare finds an
    entry under it (none when nobody queued: etcd deletes nothing and counts no delete)."""
    now = [1_000.0]
    monkeypatch.setattr(leases, "monotonic", lambda: now[0])
    backend = backend_on(own_etcd)
    try:
        session = backend.open_session(owner_id="w", ttl_ms=10_000).session_id
        key = f"k-{uuid.uuid4().hex[:8]}"
        sent = _recording(backend)
        first = backend.acquire(key=key, session_id=session, owner_id=None, ttl_ms=5_000, wait_ms=0)
        backend.release(key=key, session_id=session, token=first.fencing_token)
        first_acquire, _ = sent
        # seen/ and the fresh lease's glease/ marker too
        assert _store_work([first_acquire]) == {"key writes": 4, "compares": 5}
        sent.clear()
        before = backend.client.read().revision
        grant = backend.acquire(key=key, session_id=session, owner_id=None, ttl_ms=5_000, wait_ms=0)
        backend.release(key=key, session_id=session, token=grant.fencing_token)
        acquire, release = sent
        assert [op.WhichOneof("request") for op in acquire[0].success] == [
            "request_put",  # lock/{key}
            "request_put",  # held/{sid}/{key}
            "request_range",  # the session, for its deadline
            "request_txn",  # seen/{key} only if never granted: no write here
        ]
        assert [op.WhichOneof("request") for op in release[0].success] == [
            "request_delete_range",  # lock/{key}
            "request_delete_range",  # held/{sid}/{key}
            "request_range",
            "request_txn",  # the session's queue entries, only if there are any
        ]
        assert _store_work([acquire]) == {"key writes": 2, "compares": 5}
        assert _store_work([release]) == {"key writes": 2, "compares": 4}
        # what etcd did: two revisions, each the pair's own keys only
        after = backend.client.read().revision
        assert after == before + 2
        seen = backend.client.range(f"dlock/seen/{key}").first()
        assert seen is not None and seen.mod_revision < before  # written by the first grant
    finally:
        backend.close()


def test_a_release_deletes_the_sessions_queue_entries_when_there_are_some(own_etcd):
    """The queue prefix delete runs in a branch: a grant handed off from the queue carries its
    entry (`held`), and a second parked acquire of the same session has one too; the release
    deletes both (the parked one then wakes, Withdrawn), and another session's entry stays."""
    backend = backend_on(own_etcd)
    try:
        session = backend.open_session(owner_id="w", ttl_ms=10_000).session_id
        other = backend.open_session(owner_id="o", ttl_ms=10_000).session_id
        key = f"k-{uuid.uuid4().hex[:8]}"
        grant = backend.acquire(key=key, session_id=session, owner_id=None, ttl_ms=5_000, wait_ms=0)
        lease = backend.client.lease_grant(30)[0]
        mine = [backend.keys.k("wait", key, str(session), name) for name in ("a", "b")]
        theirs = backend.keys.k("wait", key, str(other), "c")
        for entry in [*mine, theirs]:
            backend.client.txn([], [put(entry, "", lease)])
        sent = _recording(backend)
        backend.release(key=key, session_id=session, token=grant.fencing_token)
        (release,) = sent
        assert _store_work([release]) == {"key writes": 3, "compares": 4}
        left = backend.client.range(backend.keys.wait_prefix(key), prefix=True).kvs
        assert [kv.key for kv in left] == [theirs]
    finally:
        backend.close()


def test_a_release_is_no_event_for_any_replicas_expiry_watcher(own_etcd):
    """Every lock-server replica streams the expiry watcher's prefixes; a pair puts and deletes
    nothing there, so no replica hears of it (only a lease's end or a session's is an event)."""
    backend = backend_on(own_etcd)
    try:
        session = backend.open_session(owner_id="w", ttl_ms=10_000).session_id
        before = backend.client.read().revision
        for _ in range(3):
            key = f"k-{uuid.uuid4().hex[:8]}"
            grant = backend.acquire(
                key=key, session_id=session, owner_id=None, ttl_ms=5_000, wait_ms=0
            )
            backend.release(key=key, session_id=session, token=grant.fencing_token)
        events = list(
            backend.client.deletions(
                backend.housekeeping.expiry_watch_prefixes(),
                after_revision=before,
                idle_timeout_s=0.5,
            )
        )
        assert events == [(before, None)]  # the idle end of the stream, no deletion
    finally:
        backend.close()
