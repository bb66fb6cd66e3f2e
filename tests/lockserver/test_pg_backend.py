"""PostgreSQL-backend specifics: rows after each call, the token floor, retention, events,
metrics, NOT_LEADER when lockdb is unreachable or read-only, waiters holding no DB slot."""

from __future__ import annotations

import json
import threading
import time
import uuid

import psycopg
import pytest
from psycopg import sql

from tests import pgplugin
from tests.lockserver.conftest import (
    assert_error,
    new_key,
    revoke_until_answered,
    start_lock_server,
)

pytestmark = pytest.mark.parametrize("lock_server", ["pg"], indirect=True)


def rows(lock_server, query: str, *params):
    with psycopg.connect(lock_server.db_url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def table_counts(lock_server) -> dict:
    (counts,) = rows(
        lock_server,
        "SELECT (SELECT count(*) FROM lock_session), (SELECT count(*) FROM lock_grant),"
        " (SELECT count(*) FROM lock_grant WHERE fencing_token IS NOT NULL),"
        " (SELECT count(*) FROM lock_waiter), (SELECT count(*) FROM lock_revocation),"
        " (SELECT last_value FROM fencing_token_seq)",
    )
    return dict(
        zip(["sessions", "keys", "grants", "waiters", "revocations", "seq"], counts, strict=True)
    )


def wait_for(predicate, timeout: float = 10, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_acquire_release_and_revoke_leave_the_expected_rows(lock_server, key):
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]
    assert rows(
        lock_server, "SELECT fencing_token, owner_id FROM lock_grant WHERE lock_key=%s", key
    ) == [(token, session["ownerId"])]
    lock_server.release(key, session, token)
    # The key row stays (L7 "seen"), its holder columns are cleared.
    assert rows(
        lock_server, "SELECT fencing_token, session_id FROM lock_grant WHERE lock_key=%s", key
    ) == [(None, None)]
    token = lock_server.acquire(key, session).json()["fencingToken"]
    outcome = lock_server.revoke(
        key, operator="oncall-bob", reason="runbook 7: stuck payout"
    ).json()
    (audit,) = rows(
        lock_server,
        "SELECT operator, reason, revoked_token, new_token_floor, revoked_owner_id,"
        " revoked_session_id::text FROM lock_revocation WHERE revocation_id = %s",
        uuid.UUID(outcome["revocationId"]),
    )
    assert audit == (
        "oncall-bob",
        "runbook 7: stuck payout",
        token,
        outcome["newTokenFloor"],
        session["ownerId"],
        session["sessionId"],
    )


def test_bad_requests_change_no_row_and_draw_no_token(lock_server, key):
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]
    before = table_counts(lock_server)
    bad = [
        lock_server.post("/v1/sessions", {"ownerId": "w", "ttlMillis": 999}),
        lock_server.post(f"/v1/locks/{'k' * 129}/acquire", {"sessionId": session["sessionId"]}),
        lock_server.post(f"/v1/locks/{new_key()}/acquire", {"sessionId": "nope"}),
        lock_server.post(
            f"/v1/locks/{new_key()}/acquire",
            {"sessionId": session["sessionId"], "waitMillis": 30_001},
        ),
        lock_server.post(
            f"/v1/locks/{new_key()}/acquire",
            {"sessionId": session["sessionId"]},
            headers={"X-Owner-Id": "intruder"},
        ),
        lock_server.post(
            f"/v1/locks/{new_key()}/acquire",
            {"sessionId": str(uuid.uuid4())},
            headers={"X-Owner-Id": "ghost"},
        ),
        lock_server.post(f"/v1/locks/{key}/revoke", {"operator": "a", "reason": "short"}),
        lock_server.post(
            f"/v1/locks/{key}/revoke",
            {"operator": "a", "reason": "long enough", "expectedToken": token + 1},
        ),
        lock_server.delete(
            f"/v1/locks/{key}",
            headers={"X-Fencing-Token": "abc"},
            params={"sessionId": session["sessionId"]},
        ),
        lock_server.delete(
            f"/v1/sessions/{session['sessionId']}", headers={"X-Owner-Id": "intruder"}
        ),
    ]
    assert [r.status_code for r in bad] == [400, 400, 400, 400, 400, 404, 400, 409, 400, 400]
    after = table_counts(lock_server)
    # Earlier tests' grants may lapse meanwhile (the reaper clears them), so live grants are
    # compared for this key only; every other count, and the sequence, must not move at all.
    assert {k: v for k, v in after.items() if k != "grants"} == {
        k: v for k, v in before.items() if k != "grants"
    }
    assert lock_server.get(f"/v1/locks/{key}").json()["fencingToken"] == token


def test_token_floor_setting_lifts_the_sequence_at_start_up(lock_server, key):
    session = lock_server.session()
    current = lock_server.acquire(key, session).json()["fencingToken"]
    floor = current + 10_000
    lock_server.restart(LOCK_TOKEN_FLOOR=str(floor))
    later = lock_server.acquire(new_key(), lock_server.session()).json()["fencingToken"]
    assert later > floor
    # A floor below the sequence never moves it backwards.
    lock_server.restart(LOCK_TOKEN_FLOOR="1")
    assert lock_server.acquire(new_key(), lock_server.session()).json()["fencingToken"] > later


def test_expired_sessions_answer_410_until_the_retention_ends_then_404(lock_server):
    session = lock_server.session(ttl_ms=1_000)
    sid = uuid.UUID(session["sessionId"])
    time.sleep(1.1)
    heartbeat = f"/v1/sessions/{sid}/heartbeat"
    headers = {"X-Owner-Id": session["ownerId"]}
    assert_error(lock_server.post(heartbeat, headers=headers), 410, "SESSION_EXPIRED")
    # Pretend the session expired a day and a minute ago: the reaper forgets it.
    rows(
        lock_server,
        "UPDATE lock_session SET expires_at = now() - interval '1 day 1 minute'"
        " WHERE session_id = %s RETURNING 1",
        sid,
    )
    wait_for(
        lambda: not rows(lock_server, "SELECT 1 FROM lock_session WHERE session_id = %s", sid),
        what="the reaper to purge the session",
    )
    assert_error(lock_server.post(heartbeat, headers=headers), 404, "SESSION_UNKNOWN")


def logged(lock_server, **match) -> list[dict]:
    found = []
    for line in lock_server.log_text().splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if all(event.get(name) == value for name, value in match.items()):
            found.append(event)
    return found


@pytest.fixture(scope="module")
def debug_server():
    """A private pg lock server at DLOCK_LOG_LEVEL=DEBUG, where every grant and release is a
    line (at the default INFO they are counted, not logged)."""
    server = start_lock_server("pg", {"DLOCK_LOG_LEVEL": "DEBUG"})
    yield server
    server.stop()


def test_lifecycle_events_are_logged(lock_server, debug_server):
    lock_server = debug_server  # lock_acquired and lock_released (cause release) are DEBUG
    key = new_key()
    session = lock_server.session(ttl_ms=1_000)
    token = lock_server.acquire(key, session, ttl_ms=30_000).json()["fencingToken"]
    wait_for(
        lambda: logged(lock_server, event="session_expired", sessionId=session["sessionId"]),
        what="session_expired",
    )
    wait_for(
        lambda: logged(lock_server, event="lock_expired", key=key, fencingToken=token),
        what="lock_expired",
    )
    other = lock_server.session()
    second = lock_server.acquire(key, other).json()["fencingToken"]
    lock_server.revoke(key, expectedToken=second)
    third = lock_server.acquire(key, other).json()["fencingToken"]
    lock_server.release(key, other, third)
    # The pod copies the role's output into its log through a pipe: a line may land just
    # after the answer that caused it.
    wait_for(
        lambda: logged(lock_server, event="lock_released", key=key, fencingToken=third),
        what="lock_released",
    )
    (acquired,) = logged(lock_server, event="lock_acquired", key=key, fencingToken=second)
    assert acquired["service"] == "lock-server" and acquired["traceId"]
    assert acquired["ownerId"] == other["ownerId"]
    (revoked,) = logged(lock_server, event="lock_revoked", key=key)
    assert revoked["revokedToken"] == second and revoked["operator"] == "oncall-alice"


def granted_count(lock_server) -> float:
    for line in lock_server.get("/metrics").text.splitlines():
        if line.startswith('lock_acquire_total{backend="pg",outcome="granted"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_pair_is_counted_not_logged_at_the_default_level(lock_server, key):
    """The hot path's two lines (lock_acquired, lock_released with cause release) are DEBUG:
    at INFO a pair writes no line, and lock_acquire_total counts the grant."""
    before = granted_count(lock_server)
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]
    assert lock_server.release(key, session, token).status_code == 204
    assert granted_count(lock_server) == before + 1
    # A line written after the pair's: the log holds everything the pair wrote.
    token = lock_server.acquire(key, session).json()["fencingToken"]
    lock_server.revoke(key, expectedToken=token)
    wait_for(lambda: logged(lock_server, event="lock_revoked", key=key), what="lock_revoked")
    assert logged(lock_server, event="lock_acquired", key=key) == []
    assert logged(lock_server, event="lock_released", key=key) == []


def test_acquire_outcomes_and_live_gauges_are_exported(lock_server, key):
    holder = lock_server.session()
    lock_server.acquire(key, holder)
    lock_server.acquire(key, lock_server.session())
    time.sleep(0.5)  # one reaper pass refreshes the gauges
    metrics = lock_server.get("/metrics").text
    assert 'lock_acquire_total{backend="pg",outcome="granted"}' in metrics
    assert 'lock_acquire_total{backend="pg",outcome="contended"}' in metrics
    # Only the configured backend's series (issue 14): an etcd zero would make avg()/min() lie.
    assert 'backend="etcd"' not in metrics
    live = [
        line for line in metrics.splitlines() if line.startswith('lock_live_grants{backend="pg"}')
    ]
    assert live and float(live[0].split()[-1]) >= 1


@pytest.fixture(scope="module")
def fragile_process():
    """A private pg lock server (tiny pool) on its own lockdb that tests may cut off."""
    server = start_lock_server(
        "pg", {"DB_POOL_MAX": "2", "DB_QUEUE_DEADLINE_MS": "1000", "LOCK_MAX_WAITERS_PER_KEY": "8"}
    )
    yield server, server.db_url.rsplit("/", 1)[1]
    server.stop()


@pytest.fixture
def fragile_server(fragile_process):
    server, dbname = fragile_process
    yield server, dbname
    _restore(dbname)
    wait_for(lambda: server.get("/health/ready").status_code == 200, what="lockdb back")


def _cut_off(dbname: str, *, read_only: bool = False) -> None:
    with psycopg.connect(pgplugin.server_url("postgres"), autocommit=True) as conn:
        ident = sql.Identifier(dbname)
        if read_only:
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(ident)
            )
        else:
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(ident))
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (dbname,)
        )


def _restore(dbname: str) -> None:
    with psycopg.connect(pgplugin.server_url("postgres"), autocommit=True) as conn:
        ident = sql.Identifier(dbname)
        conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(ident))
        conn.execute(sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(ident))
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (dbname,)
        )


def test_unreachable_lockdb_is_503_not_leader_then_recovers_without_restart(
    lock_server, fragile_server
):
    server, dbname = fragile_server
    session = server.session()
    key = new_key()
    _cut_off(dbname)
    for response in (
        server.acquire(key, session),
        server.post("/v1/sessions", {"ownerId": "w"}),
        server.get(f"/v1/locks/{key}"),
        server.post(
            f"/v1/sessions/{session['sessionId']}/heartbeat",
            headers={"X-Owner-Id": session["ownerId"]},
        ),
        server.get("/health/ready"),
    ):
        body = assert_error(response, 503, "NOT_LEADER")
        assert body["retrySafe"] is True and body["retryAfterMillis"] > 0
    _restore(dbname)
    wait_for(lambda: server.acquire(key, session).status_code == 200, what="recovery")


def test_read_only_lockdb_is_503_not_leader(lock_server, fragile_server):
    server, dbname = fragile_server
    session = server.session()
    _cut_off(dbname, read_only=True)
    body = assert_error(server.acquire(new_key(), session), 503, "NOT_LEADER")
    assert body["retryAfterMillis"] > 0
    assert_error(server.post("/v1/sessions", {"ownerId": "w"}), 503, "NOT_LEADER")


def test_waiters_hold_no_database_connection(lock_server, fragile_server):
    server, _ = fragile_server  # DB_POOL_MAX=2
    key = new_key()
    holder = server.session(ttl_ms=30_000)
    held = server.acquire(key, holder, ttl_ms=30_000).json()
    results: list = []
    waiters = [
        threading.Thread(
            target=lambda: results.append(server.acquire(key, server.session(), wait_ms=15_000))
        )
        for _ in range(4)
    ]
    for thread in waiters:
        thread.start()
    wait_for(lambda: server.get(f"/v1/locks/{key}").json()["waiterCount"] == 4, what="4 waiters")
    # Four blocked waiters, two pool slots: other work is still served at once.
    for _ in range(5):
        other = new_key()
        session = server.session()
        assert server.acquire(other, session).status_code == 200
    assert server.release(key, holder, held["fencingToken"]).status_code == 204
    revoke_until_answered(server, key, results, 4)
    for thread in waiters:
        thread.join(20)
    assert [r.status_code for r in results] == [200, 200, 200, 200]
