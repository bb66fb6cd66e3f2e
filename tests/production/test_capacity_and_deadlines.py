"""Bounded database work under gunicorn: a slot within the queue deadline or 503 OVERLOADED, the
exchange within the request deadline or 504 DEADLINE_EXCEEDED with the transaction rolled back.

A probe URLconf (tests/production/probe_urls.py) does real writes through the shared kernel, so
these tests pin the kernel's behaviour whatever the apps do; the test holds a real row lock.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
import requests

from devstack.common import wait_until

pytestmark = [pytest.mark.live, pytest.mark.slow]

ENVELOPE_KEYS = {"code", "message", "retrySafe", "retryAfterMillis", "details", "traceId"}


def bump(probe, row: int, tag: str) -> requests.Response:
    return requests.post(f"{probe.url}/probe/bump/{row}", json={"tag": tag}, timeout=30)


def waiting_on_a_lock(probe) -> int:
    rows = probe.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'"
    )
    return rows[0][0]


class RowLock:
    """The test's own transaction holding `probe_row` id=1 FOR UPDATE."""

    def __init__(self, probe, row: int = 1):
        self.conn = psycopg.connect(probe.db_url)
        self.conn.execute("SELECT n FROM probe_row WHERE id = %s FOR UPDATE", (row,))

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def assert_envelope(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    body = response.json()
    assert set(body) <= ENVELOPE_KEYS and body["code"] == code
    return body


def test_a_locked_row_is_a_504_deadline_and_a_concurrent_request_is_a_503_overload(probe_factory):
    probe = probe_factory(
        DB_POOL_MAX="1", DB_QUEUE_DEADLINE_MS="300", DB_STATEMENT_TIMEOUT_MS="2000"
    )
    tag = f"deadline-{uuid.uuid4()}"
    lock = RowLock(probe)
    try:
        with ThreadPoolExecutor(2) as pool:
            blocked = pool.submit(bump, probe, 1, tag)
            wait_until(lambda: waiting_on_a_lock(probe) == 1, timeout=20, what="request blocked")
            # The one database slot is held by the blocked request: this one can't get a slot.
            overloaded = bump(probe, 2, f"overload-{uuid.uuid4()}")
            deadline = blocked.result()
    finally:
        lock.release()

    body = assert_envelope(overloaded, 503, "OVERLOADED")
    assert body["retrySafe"] is True and body["retryAfterMillis"] > 0
    assert int(overloaded.headers["Retry-After"]) >= 1
    body = assert_envelope(deadline, 504, "DEADLINE_EXCEEDED")
    assert body["retrySafe"] is True and "retryAfterMillis" not in body
    # Rolled back: the log row written before the blocked UPDATE never committed.
    assert probe.sql("SELECT count(*) FROM probe_log WHERE tag = %s", (tag,)) == [(0,)]
    assert probe.sql("SELECT n FROM probe_row WHERE id IN (1, 2) ORDER BY id") == [(0,), (0,)]
    # No detached work: nothing of ours still runs or waits in the database.
    assert waiting_on_a_lock(probe) == 0
    # And the slot came back healthy: the next request commits.
    ok = bump(probe, 1, f"after-{uuid.uuid4()}")
    assert ok.status_code == 200 and ok.json() == {"row": 1, "n": 1}


def test_a_statement_over_the_deadline_is_cancelled_by_the_server_and_answers_504(probe_factory):
    probe = probe_factory(DB_POOL_MAX="2", DB_STATEMENT_TIMEOUT_MS="300")
    response = requests.get(f"{probe.url}/probe/sleep", params={"ms": 5000}, timeout=30)
    assert_envelope(response, 504, "DEADLINE_EXCEEDED")
    still_running = probe.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE 'SELECT pg_sleep%%' AND state = 'active'"
    )
    assert still_running == [(0,)]


def test_waiters_beyond_the_queue_bound_are_refused_at_once_and_the_others_are_served(
    probe_factory,
):
    probe = probe_factory(
        DB_POOL_MAX="1",
        DB_POOL_MAX_WAITING="1",
        DB_QUEUE_DEADLINE_MS="20000",
        DB_STATEMENT_TIMEOUT_MS="1500",
    )
    lock = RowLock(probe)
    try:
        with ThreadPoolExecutor(3) as pool:
            blocked = pool.submit(bump, probe, 1, "holder")
            wait_until(lambda: waiting_on_a_lock(probe) == 1, timeout=20, what="request blocked")
            # Two more arrive while the only slot is taken: one may queue, the other may not.
            start = threading.Barrier(2)

            def contender(row: int) -> requests.Response:
                start.wait()
                return bump(probe, row, f"contender-{row}")

            second, third = pool.submit(contender, 2), pool.submit(contender, 3)
            results = [second.result(), third.result()]
            first = blocked.result()
    finally:
        lock.release()
    assert_envelope(first, 504, "DEADLINE_EXCEEDED")
    statuses = sorted(r.status_code for r in results)
    assert statuses == [200, 503], [r.text for r in results]
    refused = next(r for r in results if r.status_code == 503)
    body = assert_envelope(refused, 503, "OVERLOADED")
    assert body["retryAfterMillis"] > 0
    served = next(r for r in results if r.status_code == 200).json()
    assert probe.sql("SELECT n FROM probe_row WHERE id = %s", (served["row"],)) == [(1,)]
