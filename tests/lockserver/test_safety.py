"""Safety properties of the lock server, over real HTTP, on every backend (issue 3 a–f)."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests

from tests.lockserver.conftest import assert_error, new_key
from tests.lockserver.test_sessions import ts


def _own_session(url: str, prefix: str) -> tuple[requests.Session, str, dict]:
    """A thread's own HTTP connection (requests sessions are not thread-safe), owner and session."""
    http = requests.Session()
    owner = f"{prefix}-{uuid.uuid4().hex[:6]}"
    session = http.post(
        f"{url}/v1/sessions", json={"ownerId": owner, "ttlMillis": 10_000}, timeout=10
    ).json()
    return http, owner, session


def _acquire_in_own_session(url: str, key: str, barrier: threading.Barrier, **extra) -> int:
    http, owner, session = _own_session(url, "racer")
    barrier.wait()
    response = http.post(
        f"{url}/v1/locks/{key}/acquire",
        json={"sessionId": session["sessionId"], "ttlMillis": 10_000, **extra},
        headers={"X-Owner-Id": owner},
        timeout=20,
    )
    return response.status_code


def test_a_racing_acquirers_of_one_key_get_exactly_one_grant(lock_server, key):
    racers = 16
    barrier = threading.Barrier(racers)
    with ThreadPoolExecutor(racers) as pool:
        statuses = list(
            pool.map(
                lambda _: _acquire_in_own_session(lock_server.url, key, barrier), range(racers)
            )
        )
    assert statuses.count(200) == 1, statuses
    assert statuses.count(409) == racers - 1, statuses


def test_b_tokens_increase_in_grant_order_across_keys_and_a_server_restart(lock_server):
    session = lock_server.session(ttl_ms=30_000)
    tokens = []
    for _ in range(5):
        for key in (new_key(), new_key()):
            grant = lock_server.acquire(key, session).json()
            tokens.append(grant["fencingToken"])
            lock_server.release(key, session, grant["fencingToken"])
    lock_server.restart()
    after = lock_server.session()
    tokens.append(lock_server.acquire(new_key(), after).json()["fencingToken"])
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens


def test_b_tokens_of_one_key_increase_under_contention(lock_server, key):
    """Many short grants of one key taken over by expiry and release: never a smaller token."""
    grants: list[dict] = []
    guard = threading.Lock()
    stop = time.monotonic() + 3

    def worker():
        http, owner, session = _own_session(lock_server.url, "w")
        while time.monotonic() < stop:
            response = http.post(
                f"{lock_server.url}/v1/locks/{key}/acquire",
                json={"sessionId": session["sessionId"], "ttlMillis": 1_000, "waitMillis": 1_500},
                headers={"X-Owner-Id": owner},
                timeout=10,
            )
            if response.status_code == 200:
                with guard:
                    grants.append(response.json())
                # Half the holders release, half let the grant lapse.
                if response.json()["fencingToken"] % 2:
                    http.delete(
                        f"{lock_server.url}/v1/locks/{key}",
                        params={"sessionId": session["sessionId"]},
                        headers={
                            "X-Fencing-Token": str(response.json()["fencingToken"]),
                            "X-Fencing-Proof": response.json()["fencingProof"],
                            "X-Owner-Id": owner,
                        },
                    )
                else:
                    time.sleep(1.0)  # let it lapse (a re-acquire would rotate the token)
            elif response.status_code == 429:
                time.sleep(response.json()["retryAfterMillis"] / 1000)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len({g["fencingToken"] for g in grants}) == len(grants)  # every grant is new
    ordered = sorted(grants, key=lambda g: ts(g["acquiredAt"]))
    tokens = [g["fencingToken"] for g in ordered]
    assert len(tokens) >= 3
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_c_never_two_unexpired_grants_for_one_key(lock_server, key):
    """Holders that never release: each grant starts no earlier than its predecessor lapsed
    (both instants by the store's clock), and clients never see two holders at once."""
    grants: list[dict] = []
    inside = []
    overlaps = []
    guard = threading.Lock()
    stop = time.monotonic() + 3.5

    def worker():
        http, owner, session = _own_session(lock_server.url, "w")
        while time.monotonic() < stop:
            response = http.post(
                f"{lock_server.url}/v1/locks/{key}/acquire",
                json={"sessionId": session["sessionId"], "ttlMillis": 1_000, "waitMillis": 2_000},
                headers={"X-Owner-Id": owner},
                timeout=10,
            )
            if response.status_code == 200:
                grant = response.json()
                with guard:
                    grants.append(grant)
                    inside.append(owner)
                    if len(inside) > 1:
                        overlaps.append(list(inside))
                time.sleep(0.3)  # well inside the 1 s lease
                with guard:
                    inside.remove(owner)
                time.sleep(1.0)  # let it lapse; never release
            elif response.status_code == 429:
                time.sleep(response.json()["retryAfterMillis"] / 1000)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not overlaps
    ordered = sorted(grants, key=lambda g: g["fencingToken"])
    assert len(ordered) >= 2
    for before, after in zip(ordered, ordered[1:], strict=False):
        assert ts(after["acquiredAt"]) >= ts(before["expiresAt"]), (before, after)


def test_d_a_revoked_holders_token_is_below_every_later_token(lock_server, key):
    holder = lock_server.session()
    revoked = lock_server.acquire(key, holder).json()["fencingToken"]
    outcome = lock_server.revoke(key, expectedToken=revoked).json()
    later_session = lock_server.session()
    later = [lock_server.acquire(key, later_session).json()["fencingToken"]]
    later += [
        lock_server.acquire(new_key(), later_session).json()["fencingToken"] for _ in range(3)
    ]
    assert revoked < outcome["newTokenFloor"] < min(later)
    # The evicted holder cannot re-enter with its old grant.
    assert_error(lock_server.renew(key, holder, revoked), 409, "LOCK_LOST")


def test_e_session_expiry_releases_its_grants_and_the_next_acquire_gets_a_new_token(
    lock_server, key
):
    sleeper = lock_server.session(ttl_ms=1_000)
    old = lock_server.acquire(key, sleeper, ttl_ms=30_000).json()["fencingToken"]
    assert_error(lock_server.acquire(key, lock_server.session()), 409, "LOCK_CONTENDED")
    time.sleep(1.3)  # no heartbeat: the session lapses, the 30 s grant with it
    taker = lock_server.session()
    response = lock_server.acquire(key, taker)
    assert response.status_code == 200, response.text
    assert response.json()["fencingToken"] > old
    assert_error(lock_server.renew(key, sleeper, old), 410, "SESSION_EXPIRED")


def test_f_a_waiter_is_granted_by_the_release_not_by_a_timeout(lock_server, key):
    holder, waiter = lock_server.session(ttl_ms=30_000), lock_server.session(ttl_ms=30_000)
    held = lock_server.acquire(key, holder, ttl_ms=30_000).json()
    result: dict = {}

    def wait():
        result["response"] = lock_server.acquire(key, waiter, ttl_ms=5_000, wait_ms=20_000)

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 10
    while lock_server.get(f"/v1/locks/{key}").json()["waiterCount"] < 1:
        assert time.monotonic() < deadline, "the waiter never registered"
        time.sleep(0.02)
    assert lock_server.release(key, holder, held["fencingToken"]).status_code == 204
    thread.join(25)
    response = result["response"]
    assert response.status_code == 200, response.text
    granted = response.json()
    assert granted["sessionId"] == waiter["sessionId"]
    assert granted["fencingToken"] > held["fencingToken"]
    # Granted long before the holder's 30 s lease or the waiter's 20 s wait could have run out:
    # only the release can have let it in.
    assert ts(granted["acquiredAt"]) < ts(held["expiresAt"])
    assert lock_server.get(f"/v1/locks/{key}").json()["waiterCount"] == 0


def test_f_a_waiter_is_granted_when_the_holders_lease_lapses(lock_server, key):
    holder, waiter = lock_server.session(), lock_server.session()
    held = lock_server.acquire(key, holder, ttl_ms=1_000).json()
    response = lock_server.acquire(key, waiter, wait_ms=10_000)
    assert response.status_code == 200, response.text
    assert ts(response.json()["acquiredAt"]) >= ts(held["expiresAt"])


def test_f_a_waiter_whose_wait_runs_out_gets_409_with_holder_details(lock_server, key):
    holder, waiter = lock_server.session(), lock_server.session()
    lock_server.acquire(key, holder, ttl_ms=20_000)
    body = assert_error(lock_server.acquire(key, waiter, wait_ms=300), 409, "LOCK_CONTENDED")
    assert body["details"]["holderOwnerId"] == holder["ownerId"]
    assert lock_server.get(f"/v1/locks/{key}").json()["waiterCount"] == 0
