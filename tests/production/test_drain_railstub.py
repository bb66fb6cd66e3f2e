"""Drain on a real role: a rail-stub submit in flight when SIGTERM arrives books its transfer and
answers 200, while the listener already refuses new connections."""

from __future__ import annotations

import os
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
import requests

from devstack.common import free_port, wait_until
from devstack.roles import RoleProcess
from tests.conftest import migrated_db
from tests.production.test_drain import connection_refused

pytestmark = [pytest.mark.live, pytest.mark.slow]


def test_a_submit_in_flight_at_sigterm_books_and_answers_while_new_connections_are_refused(
    tmp_path,
):
    db_url = migrated_db(f"prod_rail_{uuid.uuid4().hex[:10]}", "railstub", "RAIL_DATABASE_URL")
    env = {
        "RAIL_DATABASE_URL": db_url,
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DJANGO_DEBUG": "false",
        "DB_STATEMENT_TIMEOUT_MS": "20000",
        "GUNICORN_GRACEFUL_TIMEOUT": "30",
    }
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE railstub_config SET latency_ms = 1000")
    proc = RoleProcess("railstub", free_port(), env, tmp_path / "railstub.log").start()
    client_ref = f"drain-{uuid.uuid4()}"
    # Park the request inside the view: its config read waits for our table lock.
    gate = psycopg.connect(db_url)
    gate.execute("LOCK TABLE railstub_config IN ACCESS EXCLUSIVE MODE")
    try:
        with ThreadPoolExecutor(1) as pool:
            submit = pool.submit(
                requests.post,
                f"{proc.url}/submit",
                json={"clientRef": client_ref, "amountMinor": 100, "currency": "EUR"},
                timeout=60,
            )

            def parked() -> bool:
                with psycopg.connect(db_url, autocommit=True) as conn:
                    (n,) = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'"
                    ).fetchone()
                return n == 1

            wait_until(parked, timeout=20, what="submit in flight")
            proc.process.send_signal(signal.SIGTERM)
            wait_until(lambda: connection_refused(proc.port), timeout=10, what="listener closed")
            gate.rollback()  # let the in-flight request go on
            response = submit.result()
    finally:
        gate.close()
        proc.stop()
    assert response.status_code == 200, response.text
    reference = response.json()["railReference"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        booked = conn.execute(
            "SELECT rail_reference FROM rail_transfer WHERE client_ref = %s", (client_ref,)
        ).fetchall()
    assert booked == [(reference,)]
    assert proc.process.returncode == 0
