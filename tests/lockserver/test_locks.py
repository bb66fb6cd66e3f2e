"""L4–L8 over real HTTP, on every backend: each listed code with its details; bad inputs."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.lockserver.conftest import assert_error, revoke_until_answered
from tests.lockserver.test_sessions import ts
from tests.lockserver.test_token_continuity import log_events

GRANT_FIELDS = {
    "key",
    "ownerId",
    "sessionId",
    "fencingToken",
    "fencingProof",
    "acquiredAt",
    "expiresAt",
}


# ----------------------------------------------------------------------------- L4 acquire


def test_acquire_of_a_free_key_grants_a_token(lock_server, key):
    session = lock_server.session()
    response = lock_server.acquire(key, session, ttl_ms=5_000)
    assert response.status_code == 200, response.text
    grant = response.json()
    assert set(grant) == GRANT_FIELDS
    assert grant["key"] == key
    assert grant["ownerId"] == session["ownerId"]
    assert grant["sessionId"] == session["sessionId"]
    assert isinstance(grant["fencingToken"], int) and grant["fencingToken"] > 0
    assert ts(grant["expiresAt"]) > ts(grant["acquiredAt"])


def test_acquire_of_a_held_key_is_409_lock_contended_with_holder_details(lock_server, key):
    holder, other = lock_server.session(), lock_server.session()
    grant = lock_server.acquire(key, holder, ttl_ms=5_000).json()
    body = assert_error(lock_server.acquire(key, other), 409, "LOCK_CONTENDED")
    assert body["retrySafe"] is True
    assert body["retryAfterMillis"] > 0
    assert body["details"]["holderOwnerId"] == holder["ownerId"]
    assert body["details"]["expiresAt"] == grant["expiresAt"]


def test_second_acquire_by_the_holding_session_gets_a_new_higher_token(lock_server, key):
    # issue 16: a release that timed out ("lost"), then the same session acquires again
    session = lock_server.session()
    first = lock_server.acquire(key, session).json()
    again = lock_server.acquire(key, session)
    assert again.status_code == 200, again.text
    second = again.json()
    assert second["fencingToken"] > first["fencingToken"]
    assert second["sessionId"] == first["sessionId"] and second["ownerId"] == first["ownerId"]
    info = lock_server.get(f"/v1/locks/{key}").json()
    assert info["held"] and info["fencingToken"] == second["fencingToken"]
    # the old token opens nothing any more: renew and release with it are LOCK_LOST ...
    lost = assert_error(lock_server.renew(key, session, first["fencingToken"]), 409, "LOCK_LOST")
    assert lost["details"]["storedToken"] == second["fencingToken"]
    assert_error(lock_server.release(key, session, first["fencingToken"]), 409, "LOCK_LOST")
    # ... and the new grant is intact and releasable
    assert lock_server.release(key, session, second["fencingToken"]).status_code == 204
    assert lock_server.get(f"/v1/locks/{key}").json()["held"] is False
    superseded = [
        event
        for event in log_events(lock_server, "lock_released")
        if event.get("cause") == "reacquired" and event.get("fencingToken") == first["fencingToken"]
    ]
    assert len(superseded) == 1


def test_acquire_with_an_unknown_session_is_404_and_leaves_the_key_unseen(lock_server, key):
    ghost = {"sessionId": str(uuid.uuid4()), "ownerId": "ghost"}
    assert_error(lock_server.acquire(key, ghost), 404, "SESSION_UNKNOWN")
    assert_error(lock_server.get(f"/v1/locks/{key}"), 404, "NOT_FOUND")


def test_acquire_with_an_expired_session_is_410(lock_server, key):
    session = lock_server.session(ttl_ms=1_000)
    time.sleep(1.2)
    assert_error(lock_server.acquire(key, session), 410, "SESSION_EXPIRED")


def test_a_just_expired_session_asking_for_a_held_key_is_410_not_contended(lock_server, key):
    """Just past its deadline (before etcd's lease sweep): "your locks are gone", never
    "busy, retry" — the caller may hold other keys on that session."""
    holder = lock_server.session(ttl_ms=60_000)
    assert lock_server.acquire(key, holder, ttl_ms=60_000).status_code == 200
    late = lock_server.session(ttl_ms=1_000)
    time.sleep(1.05)
    assert_error(lock_server.acquire(key, late), 410, "SESSION_EXPIRED")


def test_an_acquire_refused_for_a_just_expired_session_leaves_a_new_key_unseen(lock_server, key):
    session = lock_server.session(ttl_ms=1_000)
    time.sleep(1.05)
    assert_error(lock_server.acquire(key, session), 410, "SESSION_EXPIRED")
    assert_error(lock_server.get(f"/v1/locks/{key}"), 404, "NOT_FOUND")


def test_retry_after_on_contention_is_bounded_by_the_holders_session_deadline(lock_server, key):
    holder = lock_server.session(ttl_ms=2_000)
    assert lock_server.acquire(key, holder, ttl_ms=30_000).status_code == 200
    time.sleep(1.5)  # the holder's session lapses in ~0.5 s, long before its 30 s grant
    body = assert_error(lock_server.acquire(key, lock_server.session()), 409, "LOCK_CONTENDED")
    assert 0 < body["retryAfterMillis"] <= 600


def test_acquire_by_another_owner_than_the_sessions_is_refused(lock_server, key):
    session = lock_server.session()
    response = lock_server.post(
        f"/v1/locks/{key}/acquire",
        {"sessionId": session["sessionId"]},
        headers={"X-Owner-Id": "intruder"},
    )
    assert_error(response, 400, "VALIDATION_FAILED")
    assert_error(lock_server.get(f"/v1/locks/{key}"), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    "path_key, body_patch",
    [
        ("bad key", {}),
        ("bad*key", {}),
        ("k" * 129, {}),
        ("{key}", {"sessionId": "not-a-uuid"}),
        ("{key}", {"sessionId": None}),
        ("{key}", {"ttlMillis": 999}),
        ("{key}", {"ttlMillis": 60_001}),
        ("{key}", {"waitMillis": 30_001}),
        ("{key}", {"waitMillis": -1}),
        ("{key}", {"waitMillis": "10"}),
        ("{key}", {"unexpected": 1}),
    ],
)
def test_bad_acquire_is_validation_failed_and_grants_nothing(
    lock_server, key, path_key, body_patch
):
    session = lock_server.session()
    body = {"sessionId": session["sessionId"], **body_patch}
    body = {k: v for k, v in body.items() if v is not None}
    path_key = path_key.format(key=key)
    response = lock_server.post(
        f"/v1/locks/{path_key}/acquire", body, headers={"X-Owner-Id": session["ownerId"]}
    )
    assert_error(response, 400, "VALIDATION_FAILED")
    assert_error(lock_server.get(f"/v1/locks/{key}"), 404, "NOT_FOUND")


def test_a_128_character_key_is_accepted(lock_server):
    key = ("k:" + uuid.uuid4().hex + "." * 128)[:128]
    assert lock_server.acquire(key, lock_server.session()).status_code == 200


@pytest.mark.parametrize("path", ["/v1/locks/{key}/acquire", "/v1/locks/{key}/renew"])
def test_lock_writes_without_x_owner_id_are_validation_failed(lock_server, key, path):
    session = lock_server.session()
    token = lock_server.acquire(key + ".held", session).json()["fencingToken"]
    response = lock_server.post(
        path.format(key=key),
        {"sessionId": session["sessionId"]},
        headers={"X-Fencing-Token": str(token)},
    )
    assert_error(response, 400, "VALIDATION_FAILED")
    release = lock_server.delete(
        f"/v1/locks/{key}.held",
        headers={"X-Fencing-Token": str(token)},
        params={"sessionId": session["sessionId"]},
    )
    assert_error(release, 400, "VALIDATION_FAILED")
    assert lock_server.get(f"/v1/locks/{key}.held").json()["held"] is True


def test_non_json_acquire_body_is_validation_failed(lock_server, key):
    response = lock_server.http.post(
        f"{lock_server.url}/v1/locks/{key}/acquire",
        data="sessionId=1",
        headers={"Content-Type": "application/json"},
        timeout=5,
    )
    assert_error(response, 400, "VALIDATION_FAILED")


def test_retry_budget_exhausted_is_429_contention_exceeded(lock_server, key):
    holder, caller = lock_server.session(), lock_server.session()
    assert lock_server.acquire(key, holder, ttl_ms=20_000).status_code == 200
    for _ in range(5):  # LOCK_RETRY_BUDGET of the test server
        assert_error(lock_server.acquire(key, caller), 409, "LOCK_CONTENDED")
    body = assert_error(lock_server.acquire(key, caller), 429, "CONTENTION_EXCEEDED")
    assert body["retrySafe"] is True
    assert 0 < body["retryAfterMillis"] <= 3_000
    # The budget is per caller: another session is still answered 409.
    assert_error(lock_server.acquire(key, lock_server.session()), 409, "LOCK_CONTENDED")


def test_waiters_beyond_the_per_key_cap_are_429(lock_server, key):
    holder = lock_server.session()
    grant = lock_server.acquire(key, holder, ttl_ms=20_000).json()
    results: list = []

    def wait():
        results.append(lock_server.acquire(key, lock_server.session(), wait_ms=15_000))

    threads = [threading.Thread(target=wait) for _ in range(3)]  # LOCK_MAX_WAITERS_PER_KEY
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while lock_server.get(f"/v1/locks/{key}").json()["waiterCount"] < 3:
        assert time.monotonic() < deadline, "waiters never registered"
        time.sleep(0.05)
    body = assert_error(
        lock_server.acquire(key, lock_server.session(), wait_ms=5_000), 429, "CONTENTION_EXCEEDED"
    )
    assert body["retryAfterMillis"] > 0
    assert lock_server.release(key, holder, grant["fencingToken"]).status_code == 204
    # One waiter is granted by the release; the others time out only after their 15 s, so
    # revoke/release the chain quickly to let the test end.
    revoke_until_answered(lock_server, key, results, 3)
    for thread in threads:
        thread.join(20)
    assert sorted(r.status_code for r in results) == [200, 200, 200]


# ----------------------------------------------------------------------------- L5 renew


def test_renew_extends_the_grant_and_keeps_the_token(lock_server, key):
    session = lock_server.session()
    grant = lock_server.acquire(key, session, ttl_ms=2_000).json()
    time.sleep(0.05)
    response = lock_server.renew(key, session, grant["fencingToken"], ttl_ms=5_000)
    assert response.status_code == 200, response.text
    renewed = response.json()
    assert set(renewed) == GRANT_FIELDS
    assert renewed["fencingToken"] == grant["fencingToken"]
    assert renewed["acquiredAt"] == grant["acquiredAt"]
    assert ts(renewed["expiresAt"]) > ts(grant["expiresAt"])


def test_renew_with_another_token_is_409_lock_lost_with_the_stored_token(lock_server, key):
    session = lock_server.session()
    grant = lock_server.acquire(key, session).json()
    response = lock_server.renew(key, session, grant["fencingToken"] + 1_000)
    body = assert_error(response, 409, "LOCK_LOST")
    assert body["retrySafe"] is False
    assert body["details"]["storedToken"] == grant["fencingToken"]


def test_renew_after_the_grant_lapsed_is_lock_lost(lock_server, key):
    session = lock_server.session()
    grant = lock_server.acquire(key, session, ttl_ms=1_000).json()
    time.sleep(1.2)
    body = assert_error(lock_server.renew(key, session, grant["fencingToken"]), 409, "LOCK_LOST")
    assert body["details"]["storedToken"] is None


def test_renew_with_an_expired_session_is_410(lock_server, key):
    session = lock_server.session(ttl_ms=1_000)
    grant = lock_server.acquire(key, session, ttl_ms=10_000).json()
    time.sleep(1.2)
    assert_error(lock_server.renew(key, session, grant["fencingToken"]), 410, "SESSION_EXPIRED")


@pytest.mark.parametrize("raw", [None, "", "0", "-1", "abc", "1.5", "9223372036854775808"])
def test_renew_with_a_malformed_token_is_400_invalid_token(lock_server, key, raw):
    session = lock_server.session()
    lock_server.acquire(key, session)
    headers = {"X-Owner-Id": session["ownerId"]}
    if raw is not None:
        headers["X-Fencing-Token"] = raw
    response = lock_server.post(
        f"/v1/locks/{key}/renew", {"sessionId": session["sessionId"]}, headers=headers
    )
    assert_error(response, 400, "INVALID_TOKEN")


# ----------------------------------------------------------------------------- L6 release


def test_release_frees_the_key_and_a_second_release_is_lock_lost(lock_server, key):
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]
    response = lock_server.release(key, session, token)
    assert response.status_code == 204 and response.content == b""
    assert lock_server.get(f"/v1/locks/{key}").json()["held"] is False
    body = assert_error(lock_server.release(key, session, token), 409, "LOCK_LOST")
    assert body["retrySafe"] is False


def test_release_with_a_stale_token_leaves_the_new_holder_in_place(lock_server, key):
    first, second = lock_server.session(), lock_server.session()
    old = lock_server.acquire(key, first, ttl_ms=1_000).json()["fencingToken"]
    time.sleep(1.2)
    new = lock_server.acquire(key, second).json()["fencingToken"]
    body = assert_error(lock_server.release(key, first, old), 409, "LOCK_LOST")
    assert body["details"]["storedToken"] == new
    info = lock_server.get(f"/v1/locks/{key}").json()
    assert info["held"] is True and info["fencingToken"] == new


def test_release_accepts_the_session_id_in_a_json_body(lock_server, key):
    session = lock_server.session()
    grant = lock_server.acquire(key, session).json()
    response = lock_server.delete(
        f"/v1/locks/{key}",
        headers={
            "X-Fencing-Token": str(grant["fencingToken"]),
            "X-Fencing-Proof": grant["fencingProof"],
            "X-Owner-Id": session["ownerId"],
        },
        body={"sessionId": session["sessionId"]},
    )
    assert response.status_code == 204, response.text


@pytest.mark.parametrize(
    "headers, params",
    [
        ({}, {"sessionId": "{sid}"}),
        ({"X-Fencing-Token": "0"}, {"sessionId": "{sid}"}),
        ({"X-Fencing-Token": "{token}"}, {}),
        ({"X-Fencing-Token": "{token}"}, {"sessionId": "nope"}),
    ],
)
def test_bad_release_is_refused_and_the_grant_stays(lock_server, key, headers, params):
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]
    headers = {
        "X-Owner-Id": session["ownerId"],
        **{k: v.format(token=token) for k, v in headers.items()},
    }
    params = {k: v.format(sid=session["sessionId"]) for k, v in params.items()}
    response = lock_server.delete(f"/v1/locks/{key}", headers=headers, params=params)
    assert response.status_code == 400
    assert response.json()["code"] in ("INVALID_TOKEN", "VALIDATION_FAILED")
    assert lock_server.get(f"/v1/locks/{key}").json()["fencingToken"] == token


# ----------------------------------------------------------------------------- L7 info


def test_info_of_a_never_seen_key_is_404(lock_server, key):
    body = assert_error(lock_server.get(f"/v1/locks/{key}"), 404, "NOT_FOUND")
    assert body["retrySafe"] is False


def test_info_reports_the_holder_while_held_and_only_held_false_after(lock_server, key):
    session = lock_server.session()
    grant = lock_server.acquire(key, session).json()
    info = lock_server.get(f"/v1/locks/{key}").json()
    assert info == {
        "key": key,
        "held": True,
        "ownerId": session["ownerId"],
        "fencingToken": grant["fencingToken"],
        "acquiredAt": grant["acquiredAt"],
        "expiresAt": grant["expiresAt"],
        "waiterCount": 0,
    }
    lock_server.release(key, session, grant["fencingToken"])
    assert lock_server.get(f"/v1/locks/{key}").json() == {
        "key": key,
        "held": False,
        "waiterCount": 0,
    }


# ----------------------------------------------------------------------------- L8 revoke


def test_revoke_evicts_the_holder_and_advances_the_token_floor(lock_server, key):
    holder = lock_server.session()
    token = lock_server.acquire(key, holder).json()["fencingToken"]
    response = lock_server.revoke(key, expectedToken=token)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"revokedToken", "newTokenFloor", "revocationId"}
    assert body["revokedToken"] == token
    assert body["newTokenFloor"] > token
    assert uuid.UUID(body["revocationId"])
    assert lock_server.get(f"/v1/locks/{key}").json()["held"] is False
    assert_error(lock_server.renew(key, holder, token), 409, "LOCK_LOST")
    assert_error(lock_server.release(key, holder, token), 409, "LOCK_LOST")
    later = lock_server.acquire(key, lock_server.session()).json()["fencingToken"]
    assert later > body["newTokenFloor"]


def test_revoke_with_a_stale_expected_token_is_409_fenced_out_and_keeps_the_grant(lock_server, key):
    holder = lock_server.session()
    token = lock_server.acquire(key, holder).json()["fencingToken"]
    body = assert_error(lock_server.revoke(key, expectedToken=token - 1), 409, "FENCED_OUT")
    assert body["retrySafe"] is False
    assert body["details"]["highestToken"] == token
    assert lock_server.get(f"/v1/locks/{key}").json()["fencingToken"] == token


def test_revoke_of_a_key_that_is_not_held_is_404(lock_server, key):
    assert_error(lock_server.revoke(key), 404, "NOT_FOUND")
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]
    lock_server.release(key, session, token)
    assert_error(lock_server.revoke(key), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    "body",
    [
        {"reason": "stuck worker holding the account"},
        {"operator": "", "reason": "stuck worker holding the account"},
        {"operator": "alice", "reason": "short"},
        {"operator": "alice"},
        {"operator": "alice", "reason": "stuck worker", "expectedToken": "5"},
        {"operator": "alice", "reason": "stuck worker", "expectedToken": 0},
        {"operator": "alice", "reason": "stuck worker", "force": True},
    ],
)
def test_bad_revoke_is_validation_failed_and_keeps_the_grant(lock_server, key, body):
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]
    response = lock_server.post(f"/v1/locks/{key}/revoke", body)
    assert_error(response, 400, "VALIDATION_FAILED")
    assert lock_server.get(f"/v1/locks/{key}").json()["fencingToken"] == token
