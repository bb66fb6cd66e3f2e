"""The deployment never issues a token at or below one it already issued, whatever the backend
(issue 16 item 5, issue 20 item 3): lockdb keeps the token high water for both backends, and
every start-up, on pg, on the same etcd cluster or on a fresh one, starts above it with no
operator step (no LOCK_TOKEN_FLOOR anywhere here). If lockdb cannot be read, the lock server
stays unready instead of guessing."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
import requests

from devstack.common import free_port
from devstack.roles import RoleProcess
from lockserver.backends.etcd.tokens import HIGH_WATER_BLOCK
from tests.conftest import fresh_etcd
from tests.lockserver.conftest import LockServer, assert_error, new_key, start_lock_server
from tests.lockserver.test_etcd_live import grants, wait_ready

pytestmark = [pytest.mark.etcd, pytest.mark.live]


def high_water(server) -> int:
    with psycopg.connect(server.db_url) as conn:
        return conn.execute("SELECT token FROM lock_token_high_water WHERE id = 1").fetchone()[0]


def restart_unready(server, **extra_env: str) -> None:
    """Restart without waiting for readiness (it must never come): wait for liveness only."""
    server.stop()
    server.proc.env = {**server.env, **extra_env}
    server.proc.start(wait=False)
    deadline = time.monotonic() + 60
    while True:
        try:
            if server.get("/health/live").status_code == 200:
                return
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, "lock-server never came up"
        time.sleep(0.2)


def log_events(server, event: str) -> list[dict]:
    return [
        json.loads(line)
        for line in server.log_text().splitlines()
        if f'"event": "{event}"' in line or f'"event":"{event}"' in line
    ]


def test_tokens_issued_on_etcd_are_below_the_first_pg_token_after_a_restart_on_pg(own_etcd):
    server = start_lock_server("etcd", {"ETCD_URL": own_etcd.url})
    try:
        on_etcd = grants(server, 5)
        assert high_water(server) >= max(on_etcd)
        server.restart(LOCK_BACKEND="pg")
        on_pg = grants(server, 3)
        assert min(on_pg) > max(on_etcd) and on_pg == sorted(on_pg)
    finally:
        server.stop()


def test_pg_tokens_issued_between_two_etcd_periods_are_below_the_next_etcd_token(own_etcd):
    server = start_lock_server("etcd", {"ETCD_URL": own_etcd.url})
    try:
        first_etcd = grants(server, 3)
        server.restart(LOCK_BACKEND="pg")
        on_pg = grants(server, 3)
        assert min(on_pg) > max(first_etcd)
        server.restart(LOCK_BACKEND="etcd", ETCD_URL=own_etcd.url)  # the same etcd cluster
        second_etcd = grants(server, 3)
        assert min(second_etcd) > max(on_pg)
        assert high_water(server) >= max(second_etcd)
    finally:
        server.stop()


def test_a_fresh_etcd_cluster_issues_tokens_above_every_earlier_one_with_no_floor_set(own_etcd):
    server = start_lock_server("etcd", {"ETCD_URL": own_etcd.url})
    fresh = fresh_etcd()  # a new data directory: revision 1
    try:
        before = grants(server, 5)
        server.restart(ETCD_URL=fresh.url)
        after = grants(server, 3)
        assert min(after) > max(before) and after == sorted(after)
    finally:
        server.stop()
        fresh.stop()


def test_without_a_readable_high_water_the_etcd_lock_server_stays_unready(own_etcd):
    server = start_lock_server("etcd", {"ETCD_URL": own_etcd.url})
    try:
        issued = grants(server, 2)
        with psycopg.connect(server.db_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE lock_token_high_water RENAME TO lock_token_high_water_x")
        restart_unready(server)
        session = server.session()
        for _ in range(3):
            body = assert_error(server.acquire(new_key(), session), 503, "NOT_LEADER")
            assert body["retryAfterMillis"] > 0
        ready = assert_error(server.get("/health/ready"), 503, "NOT_LEADER")
        assert ready["details"]["checks"]["lockBackend"] == "DOWN"
        lines = log_events(server, "token_floor_unavailable")
        assert len(lines) == 1 and "lockdb token high water" in lines[0]["reason"]
        with psycopg.connect(server.db_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE lock_token_high_water_x RENAME TO lock_token_high_water")
        deadline = time.monotonic() + 20
        while server.acquire(new_key(), session).status_code != 200:
            assert time.monotonic() < deadline, "never recovered once lockdb answered"
            time.sleep(0.2)
        wait_ready(server)
        assert min(grants(server, 2)) > max(issued)
    finally:
        server.stop()


def test_a_pg_lock_server_that_cannot_start_above_the_high_water_stays_unready():
    server = start_lock_server("pg")
    try:
        grants(server, 1)
        with psycopg.connect(server.db_url, autocommit=True) as conn:
            conn.execute("UPDATE lock_token_high_water SET token = 9223372036854775807")
        restart_unready(server)
        session = server.session()
        for _ in range(3):
            assert_error(server.acquire(new_key(), session), 503, "NOT_LEADER")
        assert_error(server.get("/health/ready"), 503, "NOT_LEADER")
        assert len(log_events(server, "token_floor_refused")) == 1
        with psycopg.connect(server.db_url) as conn:
            assert (
                conn.execute(
                    "SELECT count(*) FROM lock_grant WHERE fencing_token IS NOT NULL"
                ).fetchone()[0]
                == 0
            )
    finally:
        server.stop()


def test_a_replica_started_later_raises_the_offset_and_the_first_one_follows_it(own_etcd):
    """Two lock-server replicas on one etcd cluster and one lockdb (the HA stack). The second
    one's start raises the etcd token offset above lockdb's reserved ceiling; the first, which
    cached the old offset, must not go on issuing tokens below the second's: a key's tokens
    must grow whichever replica grants them (else the resources' fences refuse every holder
    the first replica grants, and a stale holder from the second outranks them)."""
    first = start_lock_server("etcd", {"ETCD_URL": own_etcd.url})
    logdir = Path(tempfile.mkdtemp(prefix="dlock-lockserver-replica2-"))
    proc = RoleProcess("lockserver", free_port(), first.env, logdir / "lockserver.log")
    second = LockServer(backend="etcd", env=first.env, proc=proc)
    try:
        before = grants(first, 2)
        second.proc.start()
        on_second = grants(second, 2)
        assert min(on_second) > max(before)
        on_first = grants(first, 2)
        again_second = grants(second, 1)
        issued = before + on_second + on_first + again_second
        assert issued == sorted(issued), issued  # in the order granted, whichever replica
        # the first replica adopted the second's offset, it did not raise it once more (a
        # replica that raised the offset on every mismatch would make the two leapfrog)
        assert max(issued) - min(on_second) < HIGH_WATER_BLOCK, issued
        assert high_water(first) >= max(issued)
    finally:
        second.stop()
        first.stop()
