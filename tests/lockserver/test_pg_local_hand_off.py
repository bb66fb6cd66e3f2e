"""A hand-off whose statement runs in the waiter's own process wakes it at once (pg, issue 39).

The releasing thread wakes the parked acquire right after its commit (`KeyListener.hand_over`,
wake-up cause `local`) instead of waiting for the NOTIFY to come back through PostgreSQL and
the listener thread. These tests run the backend in this process with its listener thread not
started, so nothing but the local path can wake a waiter: the NOTIFY that still goes out (for
other processes) is received on a connection of the test's own and replayed as the late one.
A wait that runs out while the hand-off commits is made deterministic by running the release
inside the waiter's withdraw, before and after its statement.
"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest
from django.db import connections

from dlock.metrics import lock_waiter_wakeups
from lockserver.backends import reset_backend
from lockserver.backends.base import GrantRecord
from lockserver.backends.pg import PgLockBackend
from lockserver.backends.pg_sql import release as release_sql
from lockserver.backends.pg_sql import waiters as waiters_sql
from lockserver.backends.pg_sql.common import GRANT_CHANNEL, grant_payload
from lockserver.backends.pg_sql.release import HAND_OFF_KEYS_SQL, HAND_OFF_SQL
from lockserver.backends.pg_store import PreparingCursor
from lockserver.pg_listener import KeyListener

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "lockdb"])


def wakeups(cause: str) -> float:
    return lock_waiter_wakeups.labels(backend="pg", cause=cause)._value.get()


@pytest.fixture
def backend():
    # Only the local hand-off can wake a waiter; nor may the process-wide backend's listener
    # thread (another test's) reap this test's keys.
    reset_backend()
    backend = PgLockBackend(start_listener=False)
    yield backend
    backend.close()


@pytest.fixture
def granted_notifies():
    """A connection LISTENing on the grant channel: the NOTIFYs every hand-off still sends."""
    params = dict(connections["lockdb"].get_connection_params())
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(f"LISTEN {GRANT_CHANNEL}")
        yield conn


def next_notify(conn: psycopg.Connection) -> str:
    for notify in conn.notifies(timeout=10, stop_after=1):
        return notify.payload
    raise AssertionError("the hand-off sent no NOTIFY")


class Waiter:
    """backend.acquire with waitMillis in a thread; `answer`: its grant or its error."""

    def __init__(self, backend: PgLockBackend, key: str, wait_ms: int) -> None:
        self.session = backend.open_session(owner_id=f"w-{uuid.uuid4().hex[:6]}", ttl_ms=30_000)
        self.answer: GrantRecord | Exception | None = None
        self.thread = threading.Thread(target=self._run, args=(backend, key, wait_ms), daemon=True)

    def _run(self, backend: PgLockBackend, key: str, wait_ms: int) -> None:
        try:
            self.answer = backend.acquire(
                key=key,
                session_id=self.session.session_id,
                owner_id=self.session.owner_id,
                ttl_ms=30_000,
                wait_ms=wait_ms,
            )
        except Exception as exc:  # the test asserts on it
            self.answer = exc
        finally:
            connections.close_all()

    def park(self, backend: PgLockBackend, key: str) -> Waiter:
        """Start, and return once its queue entry exists and it is parked in this process."""
        self.thread.start()
        deadline = time.monotonic() + 10
        while not (backend.listener.parked_count and backend.inspect(key=key).waiter_count == 1):
            assert time.monotonic() < deadline, "the waiter never parked"
            time.sleep(0.01)
        return self

    def result(self) -> GrantRecord:
        self.thread.join(10)
        assert not self.thread.is_alive(), "the parked acquire never answered"
        assert isinstance(self.answer, GrantRecord), self.answer
        return self.answer


def hold(backend: PgLockBackend, key: str) -> tuple[uuid.UUID, int]:
    session = backend.open_session(owner_id="holder", ttl_ms=30_000)
    grant = backend.acquire(
        key=key, session_id=session.session_id, owner_id=None, ttl_ms=30_000, wait_ms=0
    )
    return session.session_id, grant.fencing_token


def holder_of(backend: PgLockBackend, key: str) -> tuple[str | None, int | None, int]:
    info = backend.inspect(key=key)
    return info.owner_id, info.fencing_token, info.waiter_count


def test_a_release_in_the_waiters_process_wakes_it_with_the_grant(backend, granted_notifies):
    key = f"k-{uuid.uuid4().hex[:8]}"
    holder, token = hold(backend, key)
    waiter = Waiter(backend, key, wait_ms=20_000).park(backend, key)
    local, direct = wakeups("local"), wakeups("direct")
    backend.release(key=key, session_id=holder, token=token)
    # No listener thread runs: without the local hand-off it would sleep out its 20 s wait.
    grant = waiter.result()
    assert grant.fencing_token > token
    assert grant.session_id == waiter.session.session_id
    assert holder_of(backend, key) == (waiter.session.owner_id, grant.fencing_token, 0)
    assert (wakeups("local") - local, wakeups("direct") - direct) == (1, 0)
    # The NOTIFY still went out (for other processes): the same grant. Arriving late here it
    # wakes nobody and changes nothing.
    payload = next_notify(granted_notifies)
    assert grant_payload(payload)[1][0] == grant.fencing_token
    backend.listener.hand_over(payload, cause="direct")
    assert holder_of(backend, key) == (waiter.session.owner_id, grant.fencing_token, 0)
    assert wakeups("direct") == direct
    backend.release(key=key, session_id=waiter.session.session_id, token=grant.fencing_token)
    assert holder_of(backend, key) == (None, None, 0)


def test_a_hand_off_that_lands_before_the_waiter_waits_is_counted_once_as_local(
    backend, monkeypatch
):
    """The release commits after the waiter's queue entry is in (and it is parked here) but
    before it first waits: it finds its grant without waiting, and the wake-up is still counted
    once, `local`. It was not counted at all (a CI run: (0, 0)), when the release landed while
    the waiter gave back its pooled connection."""
    key = f"k-{uuid.uuid4().hex[:8]}"
    holder, token = hold(backend, key)
    waiter = Waiter(backend, key, wait_ms=20_000)
    give_back = backend.store.release_connection

    def release_first() -> None:
        give_back()
        if threading.current_thread() is waiter.thread and not released:
            releaser = threading.Thread(
                target=backend.release, kwargs={"key": key, "session_id": holder, "token": token}
            )
            releaser.start()
            releaser.join(10)
            released.append(True)

    released: list[bool] = []
    monkeypatch.setattr(backend.store, "release_connection", release_first)
    local, direct = wakeups("local"), wakeups("direct")
    waiter.thread.start()
    grant = waiter.result()
    assert released == [True]
    assert grant.session_id == waiter.session.session_id and grant.fencing_token > token
    assert (wakeups("local") - local, wakeups("direct") - direct) == (1, 0)


def test_the_first_wake_up_wins_and_a_late_one_is_a_no_op():
    listener = KeyListener({}, channel="unused")  # never started: no connection
    parked = listener.park("k", "w1")
    listener.hand_over("w1 7 1 2")  # the releasing thread, after its commit
    listener.hand_over("w1 7 1 2", cause="direct")  # the NOTIFY of the same hand-off
    listener.hand_over("w2 8 1 2", cause="direct")  # a waiter of another process
    assert (parked.payload, parked.cause, parked.event.is_set()) == ("w1 7 1 2", "local", True)
    listener.unpark(parked)
    listener.hand_over("w1 7 1 2", cause="direct")  # after it answered
    assert listener.parked_count == 0


@pytest.mark.parametrize("order", ["hand-off first", "withdraw first"])
def test_a_wait_running_out_as_the_key_is_handed_to_it(backend, monkeypatch, order):
    """The waiter's wait has run out and it withdraws; the holder releases at that moment (in
    this process: the local wake-up lands on a waiter that stopped waiting). Either order of
    the two statements ends with the key granted once, to the waiter, and nothing queued."""
    key = f"k-{uuid.uuid4().hex[:8]}"
    holder, token = hold(backend, key)
    withdraw = release_sql.withdraw
    seen: list[object] = []

    def release_meanwhile() -> None:
        thread = threading.Thread(
            target=lambda: (
                backend.release(key=key, session_id=holder, token=token),
                connections.close_all(),
            )
        )
        thread.start()
        thread.join(10)
        assert not thread.is_alive()

    def racing_withdraw(cursor, **kwargs):
        if order == "hand-off first":
            # By the database's clock the wait is a moment longer (its entry's deadline is
            # waitMillis + 1 ms after it queued): the entry is still eligible at the release.
            cursor.execute(
                "UPDATE lock_waiter SET expires_at = expires_at + interval '10 s'"
                " WHERE waiter_id = %(w)s",
                {"w": kwargs["waiter_id"]},
            )
            release_meanwhile()  # commits the hand-off to us, then wakes us locally
            seen.append(withdraw(cursor, **kwargs))
        else:
            seen.append(withdraw(cursor, **kwargs))  # we leave the queue; autocommit
            release_meanwhile()  # finds nobody queued: the key is freed
        return seen[-1]

    monkeypatch.setattr(release_sql, "withdraw", racing_withdraw)
    waiter = Waiter(backend, key, wait_ms=500).park(backend, key)
    grant = waiter.result()
    if order == "hand-off first":
        # the entry was gone: withdraw found the grant handed to us, and we answer with it
        assert isinstance(seen[0], GrantRecord)
        assert seen[0].fencing_token == grant.fencing_token
    else:
        assert seen == [None]  # still queued when we left: the last attempt took the free key
    assert grant.fencing_token > token
    assert holder_of(backend, key) == (waiter.session.owner_id, grant.fencing_token, 0)
    assert backend.listener.parked_count == 0
    backend.release(key=key, session_id=waiter.session.session_id, token=grant.fencing_token)
    assert holder_of(backend, key) == (None, None, 0)


def test_a_closed_session_hands_every_key_it_held_over_in_one_statement(backend, monkeypatch):
    """Closing a session that holds two keys, each with a waiter parked in this process: both
    waiters are granted by one hand-off statement and woken at once (local), no NOTIFY needed."""
    keys = [f"k-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    holder = backend.open_session(owner_id="holder", ttl_ms=30_000)
    tokens = [
        backend.acquire(
            key=key, session_id=holder.session_id, owner_id=None, ttl_ms=30_000, wait_ms=0
        ).fencing_token
        for key in keys
    ]
    waiters = [Waiter(backend, key, wait_ms=20_000).park(backend, key) for key in keys]
    statements: list[str] = []
    execute = PreparingCursor.execute

    def counted(self, query, params=None):
        statements.append(query)
        return execute(self, query, params)

    monkeypatch.setattr(PreparingCursor, "execute", counted)
    local = wakeups("local")
    backend.close_session(session_id=holder.session_id, owner_id="holder")
    for key, waiter, token in zip(keys, waiters, tokens, strict=True):
        grant = waiter.result()
        assert grant.fencing_token > token and grant.key == key
        assert holder_of(backend, key) == (waiter.session.owner_id, grant.fencing_token, 0)
    assert wakeups("local") - local == 2
    hand_offs = [q for q in statements if q in (HAND_OFF_SQL, HAND_OFF_KEYS_SQL)]
    assert hand_offs == [HAND_OFF_KEYS_SQL]


def test_the_reaper_hands_every_lapsed_key_over_in_one_statement(backend, monkeypatch):
    """Two keys whose holder lapsed, each with a queue entry (no acquire parked here, so nobody
    hands them over but the reaper): one pass grants both heads in one statement and wakes
    them through `wake` after its commit; a key with nobody eligible queued is freed only."""
    keys = [f"k-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    holder = backend.open_session(owner_id="holder", ttl_ms=30_000)
    for key in keys:
        backend.acquire(
            key=key, session_id=holder.session_id, owner_id=None, ttl_ms=30_000, wait_ms=0
        )
    params = dict(connections["lockdb"].get_connection_params())
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    queued = {}
    with psycopg.connect(**params, autocommit=True) as conn:
        for key in keys[:2]:
            session = backend.open_session(owner_id=f"w-{key}", ttl_ms=30_000)
            waiter_id = uuid.uuid4()
            admitted = waiters_sql.add_waiter(
                conn.cursor(),
                waiter_id=waiter_id,
                key=key,
                session_id=session.session_id,
                owner_id=None,
                wait_ms=20_000,
                cap=64,
            )
            assert admitted[:2] == (True, True)
            queued[key] = (str(waiter_id), session.owner_id)
        conn.execute(  # the holder's lease lapses (by the database's clock)
            "UPDATE lock_grant SET expires_at = clock_timestamp() - interval '1 second'"
            " WHERE lock_key = ANY(%s)",
            (keys,),
        )
        calls: list[list[str]] = []
        hand_off_keys = release_sql.hand_off_keys

        def counted(cursor, *, keys):
            calls.append(sorted(keys))
            return hand_off_keys(cursor, keys=keys)

        monkeypatch.setattr(release_sql, "hand_off_keys", counted)
        monkeypatch.setattr(release_sql, "hand_off", lambda *a, **k: pytest.fail("per key"))
        woken: list[str] = []
        backend.housekeeper.run(conn, woken.append)
    # One statement for the pass (other tests' lapsed keys in this database may be in it too).
    (handed_keys,) = calls
    assert set(keys[:2]) <= set(handed_keys) and keys[2] not in handed_keys
    assert {waiter_id for waiter_id, _ in queued.values()} <= {
        payload.split(" ")[0] for payload in woken
    }
    for key, (_, owner) in queued.items():
        assert holder_of(backend, key)[0::2] == (owner, 0)
    assert holder_of(backend, keys[2]) == (None, None, 0)


def test_a_lapse_is_handed_over_by_one_statement_not_one_per_parked_waiter(backend, monkeypatch):
    """Three acquires of this process parked on a key whose holder's lease lapses (nobody
    NOTIFYs a lapse): at the lapse one of them hands the key over, in one statement, to the
    head of the queue; the other two wait for the new holder instead of each running one."""
    key = f"k-{uuid.uuid4().hex[:8]}"
    holder = backend.open_session(owner_id="holder", ttl_ms=30_000)
    lapsing = backend.acquire(
        key=key, session_id=holder.session_id, owner_id=None, ttl_ms=3_000, wait_ms=0
    )
    statements: list[str] = []
    execute = PreparingCursor.execute

    def counted(self, query, params=None):
        statements.append(query)
        return execute(self, query, params)

    monkeypatch.setattr(PreparingCursor, "execute", counted)
    waiters = []
    for count in (1, 2, 3):
        waiter = Waiter(backend, key, wait_ms=20_000)
        waiter.thread.start()
        deadline = time.monotonic() + 10
        while backend.inspect(key=key).waiter_count < count:
            assert time.monotonic() < deadline, "the waiter never parked"
            time.sleep(0.01)
        waiters.append(waiter)
    assert backend.inspect(key=key).fencing_token == lapsing.fencing_token  # all parked: held
    head = waiters[0].result()  # granted at the lapse, first in the queue
    assert head.fencing_token > lapsing.fencing_token
    assert holder_of(backend, key) == (waiters[0].session.owner_id, head.fencing_token, 2)
    assert statements.count(HAND_OFF_SQL) == 1
    # The others are still queued, in order: each release hands the key to the next.
    token = head.fencing_token
    for previous, waiter in zip(waiters, waiters[1:], strict=False):
        backend.release(key=key, session_id=previous.session.session_id, token=token)
        token = waiter.result().fencing_token
    backend.release(key=key, session_id=waiters[-1].session.session_id, token=token)
    assert holder_of(backend, key) == (None, None, 0)
    assert statements.count(HAND_OFF_SQL) == 1
