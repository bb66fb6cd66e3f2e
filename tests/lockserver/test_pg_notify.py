"""The pg backend NOTIFYs only a waiter it handed a key to (issue 18, decision 23).

A payout's uncontended release sends no NOTIFY; a release or revoke with a parked waiter grants
it in the same transaction and NOTIFYs that waiter only (the grant channel); and a waiter that
marks a key while a release holds its row learns the key is free and hands it over itself (the
interlock of lockserver.backends.pg_sql.common.NOTIFY_IF_WAITED).
"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from lockserver.backends.pg_sql import release as release_sql
from lockserver.backends.pg_sql import waiters as waiters_sql
from lockserver.backends.pg_sql.common import GRANT_CHANNEL, NOTIFY_CHANNEL
from tests.lockserver.conftest import new_key

pytestmark = pytest.mark.parametrize("lock_server", ["pg"], indirect=True)


def notified_keys(listen: psycopg.Connection, db_url: str) -> list[str]:
    """Every payload NOTIFYed on the lock channels so far: a sentinel sent last marks the end
    (notifications are delivered in commit order)."""
    sentinel = f"sentinel-{uuid.uuid4().hex}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, sentinel))
    seen: list[str] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for notify in listen.notifies(timeout=1, stop_after=1):
            if notify.payload == sentinel:
                return seen
            seen.append(notify.payload)
    raise AssertionError("the sentinel NOTIFY never arrived")


@pytest.fixture
def listen(lock_server):
    with psycopg.connect(lock_server.db_url, autocommit=True) as conn:
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        conn.execute(f"LISTEN {GRANT_CHANNEL}")
        yield conn


def test_an_uncontended_release_sends_no_notify(lock_server, listen, key):
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]
    assert lock_server.release(key, session, token).status_code == 204
    assert key not in notified_keys(listen, lock_server.db_url)
    with psycopg.connect(lock_server.db_url, autocommit=True) as conn:
        (row,) = conn.execute(
            "SELECT fencing_token, waiter_until FROM lock_grant WHERE lock_key = %s", (key,)
        ).fetchall()
    assert row == (None, None)


@pytest.mark.parametrize("free", ["release", "revoke"])
def test_a_parked_waiter_is_notified_and_granted_at_release(lock_server, listen, key, free):
    holder = lock_server.session(ttl_ms=30_000)
    held = lock_server.acquire(key, holder, ttl_ms=30_000).json()
    waiter = lock_server.session(ttl_ms=30_000)
    results: list = []
    thread = threading.Thread(
        target=lambda: results.append(lock_server.acquire(key, waiter, wait_ms=20_000))
    )
    thread.start()
    deadline = time.monotonic() + 10
    while lock_server.get(f"/v1/locks/{key}").json()["waiterCount"] != 1:
        assert time.monotonic() < deadline, "the waiter never parked"
        time.sleep(0.05)
    if free == "release":
        assert lock_server.release(key, holder, held["fencingToken"]).status_code == 204
    else:
        assert lock_server.revoke(key).status_code == 200
    # Without the hand-off the waiter would sleep until the holder's lease (30 s) or its own
    # wait (20 s) ran out.
    thread.join(10)
    assert not thread.is_alive()
    assert results[0].status_code == 200, results[0].text
    granted = results[0].json()
    assert granted["fencingToken"] > held["fencingToken"]
    # one NOTIFY, to that waiter (its waiter id and its grant), none to the key: no herd
    (notified,) = notified_keys(listen, lock_server.db_url)
    waiter_id, token, _acquired_us, _expires_us = notified.split(" ")
    assert uuid.UUID(waiter_id) and int(token) == granted["fencingToken"]
    with psycopg.connect(lock_server.db_url, autocommit=True) as conn:
        (row,) = conn.execute(
            "SELECT fencing_token, session_id::text, waiter_until > clock_timestamp()"
            " FROM lock_grant WHERE lock_key = %s",
            (key,),
        ).fetchall()
    assert row == (granted["fencingToken"], waiter["sessionId"], True)


def test_a_waiter_marking_a_key_a_release_holds_finds_it_free(lock_server):
    """The race a skipped NOTIFY could lose: the release has locked the row (and read no mark)
    when the waiter parks. The waiter's mark waits for the release and reads the key free."""
    key = new_key()
    holder = lock_server.session(ttl_ms=30_000)
    token = lock_server.acquire(key, holder, ttl_ms=30_000).json()["fencingToken"]
    waiter = lock_server.session(ttl_ms=30_000)
    answers: list = []
    with psycopg.connect(lock_server.db_url) as releasing:  # one open transaction
        cursor = releasing.cursor()
        cursor.execute(release_sql.RELEASE_SQL, {"key": key, "token": token})
        ((owner, session_id, handed_to, notified, payload),) = cursor.fetchall()
        assert (owner, str(session_id), handed_to, notified, payload) == (
            holder["ownerId"],
            holder["sessionId"],
            None,
            None,
            None,
        )

        def park() -> None:
            with psycopg.connect(lock_server.db_url, autocommit=True) as conn:
                answers.append(
                    waiters_sql.add_waiter(
                        conn.cursor(),
                        waiter_id=uuid.uuid4(),
                        key=key,
                        session_id=uuid.UUID(waiter["sessionId"]),
                        owner_id=waiter["ownerId"],
                        wait_ms=10_000,
                        cap=64,
                    )
                )

        thread = threading.Thread(target=park)
        thread.start()
        with psycopg.connect(lock_server.db_url, autocommit=True) as conn:
            deadline = time.monotonic() + 10
            while not conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                ("%INSERT INTO lock_waiter%",),
            ).fetchall():
                assert time.monotonic() < deadline, "the waiter's mark never waited for the row"
                time.sleep(0.02)
        assert answers == []  # still waiting for the release's row lock
        releasing.commit()
    thread.join(10)
    assert answers == [(True, False, None)]  # admitted, the key no longer held: hand it over
    # A waiter that marked a held key is answered "held" and its mark makes the next release
    # NOTIFY: that is the other order, covered through HTTP above.


def test_only_a_queue_entry_commits_without_waiting_for_the_flush(lock_server):
    """A queue entry's commit skips the WAL flush (its statement sets synchronous_commit off for
    its own transaction); a statement that grants or frees stays synchronous, and the pooled
    connection is synchronous again after the entry's transaction."""
    key = new_key()
    holder = lock_server.session(ttl_ms=30_000)
    token = lock_server.acquire(key, holder, ttl_ms=30_000).json()["fencingToken"]
    waiter = lock_server.session(ttl_ms=30_000)
    with psycopg.connect(lock_server.db_url) as conn:  # explicit transactions: SHOW inside
        cursor = conn.cursor()
        cursor.execute("SET synchronous_commit = on")  # the test cluster runs with it off
        conn.commit()
        admitted = waiters_sql.add_waiter(
            cursor,
            waiter_id=uuid.uuid4(),
            key=key,
            session_id=uuid.UUID(waiter["sessionId"]),
            owner_id=waiter["ownerId"],
            wait_ms=10_000,
            cap=64,
        )
        assert admitted[:2] == (True, True)
        assert cursor.execute("SHOW synchronous_commit").fetchone() == ("off",)
        conn.commit()
        assert cursor.execute("SHOW synchronous_commit").fetchone() == ("on",)
        conn.commit()
        assert release_sql.release(cursor, key=key, token=token).handed is not None  # to the waiter
        assert cursor.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert release_sql.hand_off(cursor, key=key).waiter_id is None  # held now: nothing to do
        assert cursor.execute("SHOW synchronous_commit").fetchone() == ("on",)
        conn.commit()
