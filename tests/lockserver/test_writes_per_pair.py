"""Round trips to the store per acquire+release pair on the fast path (issue 39 item 2).

pg: one statement per acquire and one per release (each an autocommit write), counted at the
backend's cursor. etcd: the writes each pair sends (lease grants, write transactions, lease
revocations), counted at the client; reads (ranges, read-only transactions) are listed apart.
`make bench` reports the same per pair under load (bench.peers: writes/pair).
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from lockserver.backends.pg import PgLockBackend
from lockserver.backends.pg_sql.acquire import ACQUIRE_SQL
from lockserver.backends.pg_sql.release import RELEASE_SQL
from lockserver.backends.pg_store import PreparingCursor
from lockserver.etcd_ops import writes
from tests.lockserver.test_etcd_tokens_and_outage import backend_on


def pair(backend, session_id: uuid.UUID, key: str) -> None:
    grant = backend.acquire(key=key, session_id=session_id, owner_id=None, ttl_ms=5_000, wait_ms=0)
    backend.release(key=key, session_id=session_id, token=grant.fencing_token)


@pytest.mark.django_db(transaction=True, databases=["default", "lockdb"])
def test_pg_one_statement_per_acquire_and_one_per_release(monkeypatch):
    backend = PgLockBackend(start_listener=False)
    try:
        session = backend.open_session(owner_id="w", ttl_ms=10_000)
        key = f"k-{uuid.uuid4().hex[:8]}"
        pair(backend, session.session_id, key)  # the token floor, the key's first row
        statements: list[str] = []
        execute = PreparingCursor.execute

        def counted(self, query, params=None):
            statements.append(query)
            return execute(self, query, params)

        monkeypatch.setattr(PreparingCursor, "execute", counted)
        grant = backend.acquire(
            key=key, session_id=session.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
        )
        assert statements == [ACQUIRE_SQL]
        backend.release(key=key, session_id=session.session_id, token=grant.fencing_token)
        assert statements == [ACQUIRE_SQL, RELEASE_SQL]
    finally:
        backend.close()


WRITES = {"lease.LeaseGrant", "lease.LeaseRevoke"}


@pytest.mark.etcd
def test_etcd_writes_per_pair(own_etcd):
    backend = backend_on(own_etcd)
    try:
        session = backend.open_session(owner_id="w", ttl_ms=10_000)
        pair(backend, session.session_id, "warm")  # the offset, the token reserve
        calls: Counter[str] = Counter()
        call = backend.client.call

        def counted(method, request, *args, **kwargs):
            ops = [*request.success, *request.failure] if method == "kv.Txn" else []
            kind = "write" if method in WRITES or writes(ops) else "read"
            calls[f"{kind} {method}"] += 1
            return call(method, request, *args, **kwargs)

        backend.client.call = counted  # type: ignore[method-assign]
        pair(backend, session.session_id, f"k-{uuid.uuid4().hex[:8]}")
        # the create transaction and the compare-and-delete; the grant's lease is the one the
        # warm-up's release emptied, used as it is while it covers the grant, else refreshed
        # by a keepalive (the leader's lessor: no raft proposal; test_etcd_calls_per_pair.py),
        # where a lease grant per pair was a third durable write
        written = {call: n for call, n in calls.items() if call.startswith("write")}
        assert written == {"write kv.Txn": 2}, calls
        assert calls["read lease.LeaseKeepAlive"] <= 1, calls
    finally:
        backend.close()
