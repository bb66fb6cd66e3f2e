"""etcd-specific, over HTTP against real lock-server processes and private etcd servers:
lease expiry while the holder sleeps, an etcd outage (503 NOT_LEADER, then recovery with no
restart), token continuity when a deployment switches pg → etcd → pg, and the start-up refusal
of an unsafe token floor. (A fresh etcd cluster with an explicit LOCK_TOKEN_FLOOR is covered
at the backend level in test_etcd_tokens_and_outage.py.)"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest

from devstack.common import StackError, free_port
from devstack.roles import RoleProcess
from lockserver.backends.etcd.backend import EtcdLockBackend
from tests.lockserver.conftest import assert_error, new_key, start_lock_server

pytestmark = [pytest.mark.etcd, pytest.mark.live]


def wait_ready(server, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while server.get("/health/ready").status_code != 200:
        assert time.monotonic() < deadline, "lock-server did not become ready again"
        time.sleep(0.1)


def grants(server, count: int) -> list[int]:
    session = server.session()
    tokens = []
    for _ in range(count):
        key = new_key()
        response = server.acquire(key, session)
        assert response.status_code == 200, response.text
        token = response.json()["fencingToken"]
        assert server.release(key, session, token).status_code == 204
        tokens.append(token)
    return tokens


def test_etcd_stopped_is_503_not_leader_everywhere_then_recovers_without_restart(own_etcd):
    server = start_lock_server("etcd", {"ETCD_URL": own_etcd.url})
    try:
        session = server.session(ttl_ms=30_000)
        key = new_key()
        held = server.acquire(key, session).json()
        pid = server.proc.process.pid
        own_etcd.stop()
        headers = {"X-Owner-Id": session["ownerId"]}
        sid = session["sessionId"]
        answers = [
            server.post("/v1/sessions", {"ownerId": "w", "ttlMillis": 5_000}),
            server.post(f"/v1/sessions/{sid}/heartbeat", headers=headers),
            server.acquire(new_key(), session),
            server.acquire(new_key(), session, wait_ms=2_000),
            server.renew(key, session, held["fencingToken"]),
            server.release(key, session, held["fencingToken"]),
            server.get(f"/v1/locks/{key}"),
            server.revoke(key),
            server.delete(f"/v1/sessions/{sid}", headers=headers),
        ]
        for response in answers:
            body = assert_error(response, 503, "NOT_LEADER")
            assert body["retrySafe"] is True and body["retryAfterMillis"] > 0
        ready = assert_error(server.get("/health/ready"), 503, "NOT_LEADER")
        assert ready["details"]["checks"]["lockBackend"] == "DOWN"

        own_etcd.start()  # same data directory: the store's history is intact
        wait_ready(server)
        assert server.proc.process.pid == pid and server.proc.process.poll() is None
        after = grants(server, 2)
        assert min(after) > held["fencingToken"]
    finally:
        server.proc.stop()


@pytest.mark.parametrize("lock_server", ["etcd"], indirect=True)
def test_lease_expiry_while_the_holder_sleeps_hands_the_key_on_with_a_newer_token(lock_server):
    key = new_key()
    sleeper = lock_server.session(ttl_ms=1_000)
    old = lock_server.acquire(key, sleeper, ttl_ms=30_000).json()["fencingToken"]
    time.sleep(1.3)  # a GC pause: no heartbeat, so the session's lease lapses in etcd
    response = lock_server.acquire(key, lock_server.session())
    assert response.status_code == 200, response.text
    assert response.json()["fencingToken"] > old
    assert_error(lock_server.renew(key, sleeper, old), 410, "SESSION_EXPIRED")
    assert_error(lock_server.release(key, sleeper, old), 409, "LOCK_LOST")
    heartbeat = lock_server.post(
        f"/v1/sessions/{sleeper['sessionId']}/heartbeat",
        headers={"X-Owner-Id": sleeper["ownerId"]},
    )
    assert_error(heartbeat, 410, "SESSION_EXPIRED")


def test_switching_pg_to_etcd_and_back_keeps_tokens_increasing(own_etcd):
    # A pg deployment that has already issued tokens above a million.
    server = start_lock_server("pg", {"LOCK_TOKEN_FLOOR": "1000000"})
    try:
        on_pg = grants(server, 3)
        assert min(on_pg) > 1_000_000

        # The hazard: a fresh etcd on its own would restart near revision 1.
        naive = EtcdLockBackend(
            url=own_etcd.url, adopt_pg_sequence=False, ensure_floor=False, housekeeping=False
        )
        assert naive.client.read().revision < max(on_pg)
        naive.close()

        # Same deployment (same lockdb) switched to etcd: pg's last token is the floor.
        server.restart(LOCK_BACKEND="etcd", ETCD_URL=own_etcd.url)
        on_etcd = grants(server, 3)
        assert min(on_etcd) > max(on_pg) and on_etcd == sorted(on_etcd)

        # Back to pg, following docs/lockserver-etcd.md: the floor is etcd's token bound.
        bound = EtcdLockBackend(
            url=own_etcd.url, adopt_pg_sequence=False, housekeeping=False
        ).next_token_lower_bound()
        assert bound >= max(on_etcd)
        server.restart(LOCK_BACKEND="pg", LOCK_TOKEN_FLOOR=str(bound))
        back_on_pg = grants(server, 3)
        assert min(back_on_pg) > max(on_etcd)
    finally:
        server.proc.stop()


def test_a_floor_that_cannot_be_made_safe_refuses_to_start_with_one_line(own_etcd):
    env = {
        "DJANGO_SECRET_KEY": "x" * 48,
        "DJANGO_DEBUG": "false",
        "LOCK_BACKEND": "etcd",
        "ETCD_URL": own_etcd.url,
        "LOCK_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none",
        "LOCK_TOKEN_FLOOR": str(2**62),
    }
    logfile = Path(tempfile.mkdtemp(prefix="dlock-refuse-")) / "lockserver.log"
    proc = RoleProcess("lockserver", free_port(), env, logfile)
    try:
        with pytest.raises(StackError, match="exited"):
            proc.start(timeout=30)
    finally:
        proc.stop()
    refusals = [line for line in logfile.read_text().splitlines() if "refusing to start" in line]
    assert len(refusals) == 1 and "LOCK_TOKEN_FLOOR" in refusals[0]
    assert "Traceback" not in logfile.read_text()


@pytest.mark.parametrize("lock_server", ["etcd"], indirect=True)
def test_expiries_are_logged_once_seen_and_a_closed_session_is_not_an_expiry(lock_server):
    key = new_key()
    lapsing = lock_server.session(ttl_ms=1_000)
    holder = lock_server.session(ttl_ms=30_000)
    token = lock_server.acquire(key, holder, ttl_ms=1_000).json()["fencingToken"]
    closed = lock_server.session(ttl_ms=1_000)
    deleted = lock_server.delete(
        f"/v1/sessions/{closed['sessionId']}", headers={"X-Owner-Id": closed["ownerId"]}
    )
    assert deleted.status_code == 204

    def events(name: str) -> list[dict]:
        lines = [line for line in lock_server.log_text().splitlines() if line.startswith("{")]
        return [e for e in map(json.loads, lines) if e.get("event") == name]

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        expired = {e["sessionId"] for e in events("session_expired")}
        lapsed = {(e["key"], e["fencingToken"]) for e in events("lock_expired")}
        if lapsing["sessionId"] in expired and (key, token) in lapsed:
            break
        time.sleep(0.1)
    assert lapsing["sessionId"] in expired
    assert (key, token) in lapsed
    assert closed["sessionId"] not in expired
