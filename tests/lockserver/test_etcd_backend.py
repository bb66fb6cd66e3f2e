"""The etcd backend, called directly against a real etcd (no HTTP): sessions, grants, tokens."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import uuid

import pytest
import requests

from dlock.errors import ApiError, Code
from lockserver.backends.etcd.backend import EtcdLockBackend
from lockserver.etcd_ops import put

pytestmark = pytest.mark.etcd


@pytest.fixture
def backend(etcd_server):
    """A backend in a namespace of its own (a fresh key prefix) on the shared etcd."""
    instance = EtcdLockBackend(
        url=etcd_server.url,
        prefix=f"t-{uuid.uuid4().hex[:12]}/",
        adopt_pg_sequence=False,
        housekeeping=False,
    )
    yield instance
    instance.close()


def key() -> str:
    return f"payout:acct-{uuid.uuid4().hex[:10]}"


def code_of(call) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


def test_session_heartbeat_counts_held_locks_and_unknown_session_is_404(backend):
    session = backend.open_session(owner_id="worker-1", ttl_ms=5_000)
    assert session.ttl_ms == 5_000 and session.owner_id == "worker-1"
    backend.acquire(
        key=key(), session_id=session.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
    )
    beat = backend.heartbeat(session_id=session.session_id, owner_id="worker-1")
    assert beat.held_lock_count == 1
    error = code_of(lambda: backend.heartbeat(session_id=uuid.uuid4(), owner_id="worker-1"))
    assert error.code == Code.SESSION_UNKNOWN and error.status == 404


def test_ttl_is_granted_in_whole_seconds_rounded_down(backend):
    assert backend.open_session(owner_id="w", ttl_ms=2_999).ttl_ms == 2_000
    assert backend.open_session(owner_id="w", ttl_ms=1_000).ttl_ms == 1_000


def test_expired_session_answers_410_and_its_grant_goes_to_the_next_caller(backend):
    lock = key()
    short = backend.open_session(owner_id="sleeper", ttl_ms=1_000)
    first = backend.acquire(
        key=lock, session_id=short.session_id, owner_id=None, ttl_ms=30_000, wait_ms=0
    )
    time.sleep(2.2)  # the session's lease lapses; the grant's own 30 s lease does not
    error = code_of(lambda: backend.heartbeat(session_id=short.session_id, owner_id="sleeper"))
    assert error.code == Code.SESSION_EXPIRED and error.status == 410
    other = backend.open_session(owner_id="next", ttl_ms=10_000)
    second = backend.acquire(
        key=lock, session_id=other.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
    )
    assert second.fencing_token > first.fencing_token
    assert backend.inspect(key=lock).owner_id == "next"


def test_grant_lease_expires_while_the_holder_sleeps_and_the_holder_is_lost(backend):
    lock = key()
    holder = backend.open_session(owner_id="holder", ttl_ms=30_000)
    grant = backend.acquire(
        key=lock, session_id=holder.session_id, owner_id=None, ttl_ms=1_000, wait_ms=0
    )
    time.sleep(1.6)  # the holder "pauses" past its grant TTL while its session stays alive
    other = backend.open_session(owner_id="other", ttl_ms=30_000)
    newer = backend.acquire(
        key=lock, session_id=other.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
    )
    assert newer.fencing_token > grant.fencing_token
    renew = code_of(
        lambda: backend.renew(
            key=lock, session_id=holder.session_id, token=grant.fencing_token, ttl_ms=None
        )
    )
    assert renew.code == Code.LOCK_LOST
    assert renew.details["storedToken"] == newer.fencing_token
    release = code_of(
        lambda: backend.release(key=lock, session_id=holder.session_id, token=grant.fencing_token)
    )
    assert release.code == Code.LOCK_LOST
    assert backend.inspect(key=lock).fencing_token == newer.fencing_token


def test_contended_acquire_names_the_holder_and_release_is_compare_and_delete(backend):
    lock = key()
    a = backend.open_session(owner_id="a", ttl_ms=10_000)
    b = backend.open_session(owner_id="b", ttl_ms=10_000)
    grant = backend.acquire(
        key=lock, session_id=a.session_id, owner_id=None, ttl_ms=10_000, wait_ms=0
    )
    error = code_of(
        lambda: backend.acquire(
            key=lock, session_id=b.session_id, owner_id=None, ttl_ms=10_000, wait_ms=0
        )
    )
    assert error.code == Code.LOCK_CONTENDED and error.status == 409
    assert error.details["holderOwnerId"] == "a" and error.details["expiresAt"].endswith("Z")
    assert error.retry_after_ms > 0
    wrong = code_of(
        lambda: backend.release(key=lock, session_id=a.session_id, token=grant.fencing_token + 1)
    )
    assert wrong.code == Code.LOCK_LOST and wrong.details["storedToken"] == grant.fencing_token
    # the predicate is (key, token) only: another session naming the right token releases it
    backend.release(key=lock, session_id=b.session_id, token=grant.fencing_token)
    info = backend.inspect(key=lock)
    assert not info.held and info.fencing_token is None
    again = code_of(
        lambda: backend.release(key=lock, session_id=a.session_id, token=grant.fencing_token)
    )
    assert again.code == Code.LOCK_LOST and again.details["storedToken"] is None
    assert backend.heartbeat(session_id=a.session_id, owner_id="a").held_lock_count == 0


def test_renew_extends_and_never_changes_the_token(backend):
    lock = key()
    s = backend.open_session(owner_id="r", ttl_ms=10_000)
    grant = backend.acquire(
        key=lock, session_id=s.session_id, owner_id=None, ttl_ms=2_000, wait_ms=0
    )
    renewed = backend.renew(
        key=lock, session_id=s.session_id, token=grant.fencing_token, ttl_ms=5_000
    )
    assert renewed.fencing_token == grant.fencing_token
    assert renewed.expires_at > grant.expires_at
    time.sleep(2.5)  # past the first TTL: the renewed lease keeps it
    assert backend.inspect(key=lock).held
    backend.release(key=lock, session_id=s.session_id, token=grant.fencing_token)


def test_tokens_strictly_increase_across_keys_in_grant_order(backend):
    s = backend.open_session(owner_id="seq", ttl_ms=10_000)
    tokens = []
    for _ in range(5):
        lock = key()
        grant = backend.acquire(
            key=lock, session_id=s.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
        )
        tokens.append(grant.fencing_token)
        backend.release(key=lock, session_id=s.session_id, token=grant.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 5


def test_racing_threads_get_exactly_one_grant(backend):
    lock = key()
    sessions = [backend.open_session(owner_id=f"racer-{i}", ttl_ms=10_000) for i in range(8)]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(sessions))

    def race(session):
        barrier.wait()
        try:
            backend.acquire(
                key=lock, session_id=session.session_id, owner_id=None, ttl_ms=10_000, wait_ms=0
            )
            outcomes.append("granted")
        except ApiError as exc:
            outcomes.append(exc.code.value)

    threads = [threading.Thread(target=race, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("granted") == 1
    assert outcomes.count("LOCK_CONTENDED") == len(sessions) - 1


def test_waiter_is_granted_after_release_within_its_wait(backend):
    lock = key()
    a = backend.open_session(owner_id="a", ttl_ms=10_000)
    b = backend.open_session(owner_id="b", ttl_ms=10_000)
    grant = backend.acquire(
        key=lock, session_id=a.session_id, owner_id=None, ttl_ms=10_000, wait_ms=0
    )
    result: dict = {}

    def wait():
        # a waiter still blocked at its deadline raises LOCK_CONTENDED: a grant means the
        # release woke it
        result["grant"] = backend.acquire(
            key=lock, session_id=b.session_id, owner_id=None, ttl_ms=10_000, wait_ms=8_000
        )

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 5
    while backend.inspect(key=lock).waiter_count == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backend.inspect(key=lock).waiter_count == 1
    backend.release(key=lock, session_id=a.session_id, token=grant.fencing_token)
    waiter.join(10)
    assert result["grant"].owner_id == "b"
    assert result["grant"].fencing_token > grant.fencing_token
    assert backend.inspect(key=lock).waiter_count == 0


def test_waiter_beyond_the_cap_gets_contention_exceeded(backend):
    backend.waiters.waiter_cap = 1
    lock = key()
    sessions = [backend.open_session(owner_id=f"w{i}", ttl_ms=10_000) for i in range(3)]
    grant = backend.acquire(
        key=lock, session_id=sessions[0].session_id, owner_id=None, ttl_ms=10_000, wait_ms=0
    )
    first = threading.Thread(
        target=lambda: code_of(
            lambda: backend.acquire(
                key=lock,
                session_id=sessions[1].session_id,
                owner_id=None,
                ttl_ms=10_000,
                wait_ms=1_500,
            )
        ),
    )
    first.start()
    deadline = time.monotonic() + 5
    while backend.inspect(key=lock).waiter_count == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    error = code_of(
        lambda: backend.acquire(
            key=lock, session_id=sessions[2].session_id, owner_id=None, ttl_ms=10_000, wait_ms=1_000
        )
    )
    assert error.code == Code.CONTENTION_EXCEEDED and error.status == 429
    assert error.retry_after_ms > 0
    first.join(5)
    backend.release(key=lock, session_id=sessions[0].session_id, token=grant.fencing_token)


def test_inspect_is_404_for_a_key_never_seen(backend):
    error = code_of(lambda: backend.inspect(key=key()))
    assert error.code == Code.NOT_FOUND and error.status == 404


def test_revoke_advances_the_floor_above_the_revoked_token_and_audits(backend):
    lock = key()
    s = backend.open_session(owner_id="victim", ttl_ms=10_000)
    grant = backend.acquire(
        key=lock, session_id=s.session_id, owner_id=None, ttl_ms=10_000, wait_ms=0
    )
    stale = code_of(
        lambda: backend.revoke(
            key=lock, operator="op", reason="stuck worker", expected_token=grant.fencing_token - 1
        )
    )
    assert stale.code == Code.FENCED_OUT
    outcome = backend.revoke(
        key=lock, operator="op", reason="stuck worker", expected_token=grant.fencing_token
    )
    assert outcome.revoked_token == grant.fencing_token
    assert outcome.new_token_floor > outcome.revoked_token
    assert outcome.revoked_owner_id == "victim"
    lost = code_of(
        lambda: backend.release(key=lock, session_id=s.session_id, token=grant.fencing_token)
    )
    assert lost.code == Code.LOCK_LOST
    later = backend.acquire(
        key=lock, session_id=s.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
    )
    assert later.fencing_token > outcome.new_token_floor
    [audit] = backend.revocations()
    assert audit["operator"] == "op" and audit["revokedToken"] == grant.fencing_token
    assert audit["newTokenFloor"] == outcome.new_token_floor
    assert audit["revocationId"] == str(outcome.revocation_id)
    backend.release(key=lock, session_id=s.session_id, token=later.fencing_token)
    free = code_of(
        lambda: backend.revoke(key=lock, operator="op", reason="nothing here", expected_token=None)
    )
    assert free.code == Code.NOT_FOUND


def test_closing_a_session_releases_its_grants(backend):
    locks = [key(), key()]
    s = backend.open_session(owner_id="closer", ttl_ms=10_000)
    for lock in locks:
        backend.acquire(key=lock, session_id=s.session_id, owner_id=None, ttl_ms=10_000, wait_ms=0)
    backend.close_session(session_id=s.session_id, owner_id="closer")
    assert not any(backend.inspect(key=lock).held for lock in locks)
    error = code_of(lambda: backend.close_session(session_id=s.session_id, owner_id="closer"))
    assert error.code == Code.SESSION_UNKNOWN
    other = backend.open_session(owner_id="other", ttl_ms=10_000)
    backend.acquire(
        key=locks[0], session_id=other.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
    )


def test_acquire_on_a_dead_session_is_a_session_code(backend):
    error = code_of(
        lambda: backend.acquire(
            key=key(), session_id=uuid.uuid4(), owner_id=None, ttl_ms=5_000, wait_ms=0
        )
    )
    assert error.code == Code.SESSION_UNKNOWN


def test_acquire_just_after_the_session_lapsed_is_410_even_before_etcd_sweeps(backend):
    lock = key()
    session = backend.open_session(owner_id="late", ttl_ms=1_000)
    time.sleep(1.1)  # past the deadline; etcd may or may not have swept the lease yet
    error = code_of(
        lambda: backend.acquire(
            key=lock, session_id=session.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
        )
    )
    assert error.code == Code.SESSION_EXPIRED
    try:
        assert not backend.inspect(key=lock).held  # a withdrawn grant leaves the key free
    except ApiError as exc:
        assert exc.code == Code.NOT_FOUND  # or it was never granted


def _remaining_s(etcd_server, lease: int) -> int:
    answer = requests.post(
        f"{etcd_server.url}/v3/lease/timetolive", json={"ID": str(lease)}, timeout=5
    )
    return int(answer.json()["TTL"])


def test_session_metadata_outlives_the_sessions_expiry_by_at_least_the_retention(
    etcd_server, settings
):
    """410 vs 404 as on pg: the record that lets an expired session answer 410 must last at
    least `retention` past the session's expiry (here the shortest retention, 60 s, and the
    longest session, 60 s), however old the shared retention lease it is attached to."""
    settings.LOCK_SESSION_RETENTION_MS = 60_000
    backend = EtcdLockBackend(
        url=etcd_server.url,
        prefix=f"t-{uuid.uuid4().hex[:12]}/",
        adopt_pg_sequence=False,
        housekeeping=False,
    )
    assert backend.sessions.retention_s == 60
    session = backend.open_session(owner_id="long", ttl_ms=60_000)
    meta = backend.sessions.read_meta(session.session_id)
    assert _remaining_s(etcd_server, meta.lease) >= 60 + backend.sessions.retention_s - 2
    backend.heartbeat(session_id=session.session_id, owner_id="long")
    meta = backend.sessions.read_meta(session.session_id)
    assert _remaining_s(etcd_server, meta.lease) >= 60 + backend.sessions.retention_s - 2
    backend.close()


def test_a_replayed_expiry_watch_reports_only_the_grant_that_expired_once(backend, caplog):
    # issue 16 item 6: the watcher reconnecting from an old revision sees a released grant's
    # deletion long after its recorded deadline passed; it must not call that an expiry
    start = backend.client.read().revision
    session = backend.open_session(owner_id="w", ttl_ms=10_000)
    released_key, lapsed_key, revoked_key = key(), key(), key()
    sid = session.session_id
    released = backend.acquire(
        key=released_key, session_id=sid, owner_id=None, ttl_ms=1_000, wait_ms=0
    )
    backend.release(key=released_key, session_id=sid, token=released.fencing_token)
    backend.acquire(key=revoked_key, session_id=sid, owner_id=None, ttl_ms=1_000, wait_ms=0)
    backend.revoke(key=revoked_key, operator="oncall", reason="stuck worker", expected_token=None)
    lapsed = backend.acquire(key=lapsed_key, session_id=sid, owner_id=None, ttl_ms=1_000, wait_ms=0)
    deadline = time.monotonic() + 10
    while backend.client.range(backend.keys.lock_key(lapsed_key)).first() is not None:
        assert time.monotonic() < deadline, "etcd never expired the grant's lease"
        time.sleep(0.1)
    time.sleep(0.2)
    caplog.set_level(logging.INFO, logger="dlock.events")
    backend.housekeeping.log_expiries(after_revision=start, idle_timeout_s=1.0)
    expired = [r for r in caplog.records if getattr(r, "event", None) == "lock_expired"]
    assert [(r.key, r.fencingToken) for r in expired] == [(lapsed_key, lapsed.fencing_token)]


def _backdate(backend, etcd_key: str) -> None:
    """What a leader change does: etcd keeps the key's lease alive past the deadline recorded in
    its value. Here: the value says the deadline passed 100 ms ago, the lease has seconds left."""
    kv = backend.client.range(etcd_key).first()
    value = {**kv.json(), "expiresAt": int(time.time() * 1000) - 100}
    backend.client.txn([], [put(etcd_key, json.dumps(value), kv.lease)])


def test_a_grant_past_its_recorded_deadline_goes_to_the_next_caller_whatever_the_lease(backend):
    lock = key()
    holder = backend.open_session(owner_id="holder", ttl_ms=30_000)
    other = backend.open_session(owner_id="other", ttl_ms=30_000)
    grant = backend.acquire(
        key=lock, session_id=holder.session_id, owner_id=None, ttl_ms=20_000, wait_ms=0
    )
    _backdate(backend, backend.keys.lock_key(lock))
    # wait_ms=0: the caller is never parked, so a grant proves the recorded deadline decided,
    # not the lease's expiry (seconds away); a held lock would answer LOCK_HELD at once.
    taken = backend.acquire(
        key=lock, session_id=other.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
    )
    assert taken.fencing_token > grant.fencing_token and taken.owner_id == "other"
    error = code_of(
        lambda: backend.renew(
            key=lock, session_id=holder.session_id, token=grant.fencing_token, ttl_ms=None
        )
    )
    assert error.code == Code.LOCK_LOST


def test_a_session_past_its_recorded_deadline_loses_its_grant_and_cannot_heartbeat(backend):
    lock = key()
    holder = backend.open_session(owner_id="holder", ttl_ms=30_000)
    other = backend.open_session(owner_id="other", ttl_ms=30_000)
    grant = backend.acquire(
        key=lock, session_id=holder.session_id, owner_id=None, ttl_ms=20_000, wait_ms=0
    )
    _backdate(backend, backend.keys.sess_key(holder.session_id))
    taken = backend.acquire(
        key=lock, session_id=other.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
    )
    assert taken.fencing_token > grant.fencing_token
    error = code_of(lambda: backend.heartbeat(session_id=holder.session_id, owner_id="holder"))
    assert error.code == Code.SESSION_EXPIRED


def test_a_contended_answer_never_points_into_the_past(backend):
    lock = key()
    holder = backend.open_session(owner_id="holder", ttl_ms=30_000)
    other = backend.open_session(owner_id="other", ttl_ms=30_000)
    backend.acquire(key=lock, session_id=holder.session_id, owner_id=None, ttl_ms=2_000, wait_ms=0)
    seen = []
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        try:
            backend.acquire(
                key=lock, session_id=other.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
            )
            break  # the grant lapsed and went to us
        except ApiError as exc:
            assert exc.code == Code.LOCK_CONTENDED
            now = dt.datetime.now(dt.UTC)
            expires = dt.datetime.fromisoformat(exc.details["expiresAt"].replace("Z", "+00:00"))
            seen.append(exc)
            assert expires > now - dt.timedelta(milliseconds=50), exc.details
            assert exc.retry_after_ms > 0
        time.sleep(0.15)  # under the retry budget (20 a key per 10 s) for the grant's 2 s
    else:
        raise AssertionError("the holder's grant never lapsed")
    assert seen
