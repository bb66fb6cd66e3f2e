"""L1–L3 over real HTTP, on every backend: open, heartbeat, delete; 404 vs 410; bad inputs."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest

from tests.lockserver.conftest import assert_error


def ts(value: str) -> dt.datetime:
    assert value.endswith("Z") and len(value) == len("2026-11-30T09:00:00.123Z"), value
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_open_session_returns_the_granted_ttl_and_expiry(lock_server):
    response = lock_server.post("/v1/sessions", {"ownerId": "worker-a", "ttlMillis": 5_000})
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == {"sessionId", "ownerId", "ttlMillis", "expiresAt"}
    assert uuid.UUID(body["sessionId"])
    assert body["ownerId"] == "worker-a"
    assert body["ttlMillis"] == 5_000
    ts(body["expiresAt"])


def test_owner_may_come_from_the_header_and_ttl_defaults_to_the_setting(lock_server):
    response = lock_server.post("/v1/sessions", {}, headers={"X-Owner-Id": "worker-h"})
    assert response.status_code == 201, response.text
    assert response.json()["ownerId"] == "worker-h"
    assert response.json()["ttlMillis"] == 10_000  # LOCK_SESSION_TTL_MS default


def test_ttl_above_the_server_maximum_is_clamped_down(lock_server):
    response = lock_server.post("/v1/sessions", {"ownerId": "worker-c", "ttlMillis": 45_000})
    assert response.status_code == 201, response.text
    assert response.json()["ttlMillis"] == 30_000  # LOCK_MAX_TTL_MS of the test server


@pytest.mark.parametrize(
    "body, headers",
    [
        ({"ownerId": "w", "ttlMillis": 999}, {}),
        ({"ownerId": "w", "ttlMillis": 60_001}, {}),
        ({"ownerId": "w", "ttlMillis": "5000"}, {}),
        ({"ownerId": "w", "ttlMillis": 5000.0}, {}),
        ({"ownerId": "w", "ttlMillis": True}, {}),
        ({"ttlMillis": 5000}, {}),
        ({"ownerId": "x" * 65}, {}),
        ({"ownerId": 42}, {}),
        ({"ownerId": "bad\nowner"}, {}),
        ({"ownerId": "a"}, {"X-Owner-Id": "b"}),
        ({"ownerId": "w", "color": "red"}, {}),
    ],
)
def test_bad_session_requests_are_validation_failed(lock_server, body, headers):
    body = assert_error(lock_server.post("/v1/sessions", body, headers), 400, "VALIDATION_FAILED")
    assert body["retrySafe"] is False


def test_non_json_body_is_validation_failed(lock_server):
    response = lock_server.http.post(
        lock_server.url + "/v1/sessions",
        data="{not json",
        headers={"Content-Type": "application/json", "X-Owner-Id": "w"},
        timeout=5,
    )
    assert_error(response, 400, "VALIDATION_FAILED")


def test_heartbeat_extends_the_session_and_counts_held_locks(lock_server, key):
    session = lock_server.session(ttl_ms=5_000)
    assert lock_server.acquire(key, session).status_code == 200
    time.sleep(0.05)
    response = lock_server.post(
        f"/v1/sessions/{session['sessionId']}/heartbeat",
        headers={"X-Owner-Id": session["ownerId"]},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"sessionId", "expiresAt", "serverTime", "heldLockCount"}
    assert body["sessionId"] == session["sessionId"]
    assert body["heldLockCount"] == 1
    assert ts(body["expiresAt"]) > ts(session["expiresAt"])
    assert ts(body["expiresAt"]) > ts(body["serverTime"])


def test_heartbeat_does_not_count_a_grant_whose_own_ttl_lapsed(lock_server, key):
    session = lock_server.session(ttl_ms=60_000)
    assert lock_server.acquire(key, session, ttl_ms=1_000).status_code == 200
    time.sleep(1.1)  # the grant's deadline passed; etcd may not have swept its keys yet
    response = lock_server.post(
        f"/v1/sessions/{session['sessionId']}/heartbeat",
        headers={"X-Owner-Id": session["ownerId"]},
    )
    assert response.status_code == 200, response.text
    assert response.json()["heldLockCount"] == 0


def test_heartbeat_keeps_a_short_session_alive_past_its_first_ttl(lock_server, key):
    session = lock_server.session(ttl_ms=1_000)
    assert lock_server.acquire(key, session, ttl_ms=10_000).status_code == 200
    for _ in range(4):
        time.sleep(0.4)
        beat = lock_server.post(
            f"/v1/sessions/{session['sessionId']}/heartbeat",
            headers={"X-Owner-Id": session["ownerId"]},
        )
        assert beat.status_code == 200, beat.text
    assert lock_server.get(f"/v1/locks/{key}").json()["held"] is True


def test_heartbeat_of_an_unknown_session_is_404_session_unknown(lock_server):
    response = lock_server.post(
        f"/v1/sessions/{uuid.uuid4()}/heartbeat", headers={"X-Owner-Id": "w"}
    )
    assert assert_error(response, 404, "SESSION_UNKNOWN")["retrySafe"] is False


def test_heartbeat_after_expiry_is_410_session_expired(lock_server):
    session = lock_server.session(ttl_ms=1_000)
    time.sleep(1.2)
    response = lock_server.post(
        f"/v1/sessions/{session['sessionId']}/heartbeat",
        headers={"X-Owner-Id": session["ownerId"]},
    )
    assert assert_error(response, 410, "SESSION_EXPIRED")["retrySafe"] is False


@pytest.mark.parametrize(
    "path_id, headers",
    [("not-a-uuid", {"X-Owner-Id": "w"}), ("{sid}", {}), ("{sid}", {"X-Owner-Id": "intruder"})],
)
def test_bad_heartbeat_is_validation_failed_and_changes_nothing(lock_server, path_id, headers):
    session = lock_server.session(ttl_ms=5_000)
    path_id = path_id.format(sid=session["sessionId"])
    response = lock_server.post(f"/v1/sessions/{path_id}/heartbeat", headers=headers)
    assert_error(response, 400, "VALIDATION_FAILED")
    still = lock_server.post(
        f"/v1/sessions/{session['sessionId']}/heartbeat",
        headers={"X-Owner-Id": session["ownerId"]},
    )
    assert still.status_code == 200


def test_delete_session_releases_every_attached_lock(lock_server, key):
    session = lock_server.session()
    other_key = key + ".b"
    token = lock_server.acquire(key, session).json()["fencingToken"]
    assert lock_server.acquire(other_key, session).status_code == 200
    response = lock_server.delete(
        f"/v1/sessions/{session['sessionId']}", headers={"X-Owner-Id": session["ownerId"]}
    )
    assert response.status_code == 204
    assert response.content == b""
    assert lock_server.get(f"/v1/locks/{key}").json()["held"] is False
    assert lock_server.get(f"/v1/locks/{other_key}").json()["held"] is False
    taker = lock_server.session()
    assert lock_server.acquire(key, taker).json()["fencingToken"] > token
    gone = lock_server.post(
        f"/v1/sessions/{session['sessionId']}/heartbeat",
        headers={"X-Owner-Id": session["ownerId"]},
    )
    assert_error(gone, 404, "SESSION_UNKNOWN")


def test_delete_of_an_unknown_session_is_404(lock_server):
    response = lock_server.delete(f"/v1/sessions/{uuid.uuid4()}", headers={"X-Owner-Id": "w"})
    assert_error(response, 404, "SESSION_UNKNOWN")


def test_delete_by_another_owner_is_refused_and_keeps_the_locks(lock_server, key):
    session = lock_server.session()
    assert lock_server.acquire(key, session).status_code == 200
    response = lock_server.delete(
        f"/v1/sessions/{session['sessionId']}", headers={"X-Owner-Id": "intruder"}
    )
    assert_error(response, 400, "VALIDATION_FAILED")
    assert lock_server.get(f"/v1/locks/{key}").json()["held"] is True
