"""Grant order (ARCHITECTURE decision 23), on both backends, through HTTP only.

Waiters parked on a key (L4 with waitMillis) are granted in arrival order; a release, revoke,
lapse or closed session hands the lock to the head of the queue and wakes that waiter alone
(`lock_waiter_wakeups_total`); a waiter whose session closed or whose wait ran out is skipped.
Arrival order is made causal: each waiter parks only once L7's waiterCount shows the one before.
"""

from __future__ import annotations

import re
import threading
import time

from tests.lockserver.conftest import LockServer

WAKEUP = re.compile(r'^lock_waiter_wakeups_total\{backend="(\w+)",cause="(\w+)"\} (\S+)$', re.M)


def wakeups(server: LockServer) -> dict[str, float]:
    """The server's wake-up counters of parked acquires, by cause."""
    text = server.get("/metrics").text
    return {
        cause: float(value)
        for backend, cause, value in WAKEUP.findall(text)
        if backend == server.backend
    }


def waiter_count(server: LockServer, key: str) -> int:
    return server.get(f"/v1/locks/{key}").json()["waiterCount"]


def wait_for(condition, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


class Waiter:
    """One parked acquire in a thread; `answer` is its HTTP response once it returns."""

    def __init__(self, server: LockServer, key: str, *, wait_ms: int = 20_000, ttl_ms=30_000):
        self.server = server
        self.session = server.session(ttl_ms=30_000)
        self.answer = None
        self.granted_at: float | None = None
        self.thread = threading.Thread(target=self._run, args=(key, wait_ms, ttl_ms), daemon=True)

    def _run(self, key: str, wait_ms: int, ttl_ms: int) -> None:
        self.answer = self.server.acquire(key, self.session, ttl_ms=ttl_ms, wait_ms=wait_ms)
        self.granted_at = time.monotonic()

    def park(self, key: str, before: int) -> Waiter:
        """Start, and return once L7 counts it behind the `before` waiters already parked."""
        self.thread.start()
        wait_for(lambda: waiter_count(self.server, key) == before + 1, "the waiter never parked")
        return self

    def result(self, timeout: float = 15) -> dict:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the parked acquire never answered"
        assert self.answer is not None
        return {"status": self.answer.status_code, **self.answer.json()}


def park_queue(server: LockServer, key: str, count: int, **kwargs) -> list[Waiter]:
    queue: list[Waiter] = []
    for position in range(count):
        queue.append(Waiter(server, key, **kwargs).park(key, position))
    return queue


def hold(server: LockServer, key: str, ttl_ms: int = 30_000) -> tuple[dict, int]:
    session = server.session(ttl_ms=30_000)
    answer = server.acquire(key, session, ttl_ms=ttl_ms)
    assert answer.status_code == 200, answer.text
    return session, answer.json()["fencingToken"]


def test_waiters_are_granted_in_arrival_order_one_wake_up_each(lock_server, key):
    holder, token = hold(lock_server, key)
    queue = park_queue(lock_server, key, 3)  # the test cap (LOCK_MAX_WAITERS_PER_KEY=3)
    before = wakeups(lock_server)
    assert lock_server.release(key, holder, token).status_code == 204
    tokens = [token]
    for position, waiter in enumerate(queue):
        granted = waiter.result()
        assert granted["status"] == 200, granted
        assert granted["fencingToken"] > tokens[-1]  # strictly increasing, in arrival order
        tokens.append(granted["fencingToken"])
        # while it holds, the ones behind it are still parked: one hand-off, one wake-up
        assert waiter_count(lock_server, key) == len(queue) - position - 1
        after = wakeups(lock_server)
        # one wake-up meant for it: the NOTIFY (`direct`) or, on pg, the releasing thread of the
        # same process right after its commit (`local`), whichever comes first; never both
        woken = sum(after.get(c, 0) - before.get(c, 0) for c in ("direct", "local"))
        assert woken == position + 1, after
        assert after.get("broadcast", 0) == before.get("broadcast", 0), after
        info = lock_server.get(f"/v1/locks/{key}").json()
        assert (info["held"], info["fencingToken"], info["ownerId"]) == (
            True,
            granted["fencingToken"],
            waiter.session["ownerId"],
        )
        released = lock_server.release(key, waiter.session, granted["fencingToken"])
        assert released.status_code == 204
    assert lock_server.get(f"/v1/locks/{key}").json()["held"] is False


def test_a_newcomer_queues_behind_parked_waiters(lock_server, key):
    holder, token = hold(lock_server, key)
    (first,) = park_queue(lock_server, key, 1)
    assert lock_server.release(key, holder, token).status_code == 204
    granted = first.result()
    assert granted["status"] == 200
    # the key is held by the head of the queue now, never free for a newcomer to barge in
    late = lock_server.session()
    answer = lock_server.acquire(key, late)
    assert answer.status_code == 409, answer.text
    assert answer.json()["code"] == "LOCK_CONTENDED"


def test_a_waiter_whose_session_closed_is_skipped(lock_server, key):
    holder, token = hold(lock_server, key)
    gone, second = park_queue(lock_server, key, 2)
    closed = lock_server.delete(
        f"/v1/sessions/{gone.session['sessionId']}",
        headers={"X-Owner-Id": gone.session["ownerId"]},
    )
    assert closed.status_code == 204, closed.text
    answer = gone.result()
    assert answer["status"] in (404, 410), answer
    assert lock_server.release(key, holder, token).status_code == 204
    granted = second.result()
    assert granted["status"] == 200, granted
    info = lock_server.get(f"/v1/locks/{key}").json()
    assert info["ownerId"] == second.session["ownerId"]
    assert info["fencingToken"] == granted["fencingToken"]


def test_a_waiter_whose_wait_ran_out_is_skipped(lock_server, key):
    holder, token = hold(lock_server, key)
    short = Waiter(lock_server, key, wait_ms=3_000).park(key, 0)
    second = Waiter(lock_server, key).park(key, 1)
    answer = short.result()
    assert (answer["status"], answer["code"]) == (409, "LOCK_CONTENDED")
    assert lock_server.release(key, holder, token).status_code == 204
    granted = second.result()
    assert granted["status"] == 200, granted
    assert lock_server.get(f"/v1/locks/{key}").json()["ownerId"] == second.session["ownerId"]


def test_a_revoke_hands_the_lock_to_the_head(lock_server, key):
    hold(lock_server, key)
    first, second = park_queue(lock_server, key, 2)
    revoked = lock_server.revoke(key)
    assert revoked.status_code == 200, revoked.text
    granted = first.result()
    assert granted["status"] == 200, granted
    assert granted["fencingToken"] > revoked.json()["newTokenFloor"]
    assert waiter_count(lock_server, key) == 1  # the second still parked
    assert lock_server.release(key, first.session, granted["fencingToken"]).status_code == 204
    assert second.result()["status"] == 200


def test_a_lapse_hands_the_lock_to_the_head(lock_server, key):
    _, token = hold(lock_server, key, ttl_ms=1_000)
    first, second = park_queue(lock_server, key, 2)
    granted = first.result()
    assert granted["status"] == 200, granted
    assert granted["fencingToken"] > token
    assert waiter_count(lock_server, key) == 1
    assert lock_server.release(key, first.session, granted["fencingToken"]).status_code == 204
    assert second.result()["status"] == 200
