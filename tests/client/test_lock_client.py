"""dlock.client against a real lock-server process (PostgreSQL backend) over loopback HTTP.

Time is injected where the test is about time (a FakeClock the test advances); the server's own
lease clock is never faked.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import threading
import uuid
from collections.abc import Iterator

import pytest
import requests

from devstack.common import free_port, wait_until
from devstack.roles import RoleProcess
from dlock.budgets import BUDGETS
from dlock.client import (
    ContentionExceeded,
    FencedOut,
    LockClient,
    LockContended,
    LockLost,
    NotLeader,
    RetryPolicy,
    ServiceUnreachable,
    SessionExpired,
    SessionUnknown,
    call,
)
from dlock.tracing import reset_trace_id, set_trace_id

pytestmark = pytest.mark.live


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def _key() -> str:
    return f"test:client:{uuid.uuid4().hex[:12]}"


def _client(live_stack, owner: str | None = None, **kwargs) -> LockClient:
    return LockClient(
        live_stack.url("lockserver"), owner or f"client-{uuid.uuid4().hex[:8]}", **kwargs
    )


# --------------------------------------------------------------------------- the block


def test_lock_block_is_never_entered_when_the_key_is_held_by_another_owner(live_stack):
    key = _key()
    holder = _client(live_stack)
    sleep = RecordingSleep()
    waiter = _client(live_stack, retry=RetryPolicy(max_retries=2, sleep=sleep))
    entered = False
    with holder.session(5_000) as held, held.lock(key, 5_000) as grant:
        with waiter.session(5_000) as session:
            with pytest.raises(LockContended) as caught:
                with session.lock(key, 5_000):
                    entered = True
    assert not entered
    assert caught.value.retry_safe is True
    assert caught.value.details.get("holderOwnerId") == holder.owner_id
    assert len(sleep.calls) == 2  # retried exactly the policy's budget, then failed closed
    assert grant.token > 0


def test_grant_exposes_token_key_expiry_and_a_local_deadline_shorter_than_the_ttl(live_stack):
    clock = FakeClock()
    client = _client(live_stack, clock=clock)
    key = _key()
    with client.session(5_000) as session, session.lock(key, 4_000) as grant:
        assert grant.key == key
        assert isinstance(grant.token, int) and grant.token > 0
        assert grant.expires_at is not None and grant.expires_at.tzinfo is not None
        assert grant.remaining() == pytest.approx(4.0 * 0.7)
        assert grant.deadline == pytest.approx(clock.now + 2.8)
        grant.ensure_valid()
        info = client.info(key)
        assert info["held"] is True and info["fencingToken"] == grant.token
    assert client.info(key)["held"] is False  # released on leaving the block


def test_wait_ms_lets_the_server_hand_over_the_lock_without_client_retries(live_stack):
    key = _key()
    holder = _client(live_stack)
    sleep = RecordingSleep()
    waiter = _client(live_stack, retry=RetryPolicy(sleep=sleep))
    with holder.session(5_000) as held, waiter.session(5_000) as session:
        grant = held.acquire(key, 5_000)
        releaser = threading.Timer(0.3, grant.release)
        releaser.start()
        try:
            with session.lock(key, 5_000, wait_ms=3_000) as mine:
                assert mine.token > grant.token
        finally:
            releaser.join()
    assert sleep.calls == []  # the server-side wait did it, not client retries


def test_tokens_increase_from_one_holder_to_the_next(live_stack):
    client = _client(live_stack)
    key = _key()
    with client.session(5_000) as session:
        with session.lock(key, 2_000) as first:
            pass
        with session.lock(key, 2_000) as second:
            pass
    assert second.token > first.token


def test_ensure_valid_raises_lock_lost_once_the_local_deadline_passes(live_stack):
    clock = FakeClock()
    lost_calls = []
    client = _client(live_stack, clock=clock)
    with client.session(5_000) as session:
        with session.lock(_key(), 10_000, on_lost=lambda g, e: lost_calls.append(e)) as grant:
            clock.advance(6.999)
            grant.ensure_valid()  # 7.0 s is the deadline, not yet reached
            clock.advance(0.002)
            with pytest.raises(LockLost) as caught:
                grant.ensure_valid()
            with pytest.raises(LockLost):
                grant.ensure_valid()  # stays lost
            assert grant.remaining() == 0.0
    assert caught.value.details["reason"] == "deadline"
    assert caught.value.retry_safe is False
    assert len(lost_calls) == 1


def test_renew_keeps_the_token_and_moves_the_deadline(live_stack):
    clock = FakeClock()
    client = _client(live_stack, clock=clock)
    with client.session(5_000) as session, session.lock(_key(), 3_000) as grant:
        token, first_deadline = grant.token, grant.deadline
        clock.advance(2.0)
        grant.renew()
        assert grant.token == token
        assert grant.deadline == pytest.approx(first_deadline + 2.0)
        clock.advance(1.5)
        grant.ensure_valid()


def test_renew_after_the_lease_was_taken_over_raises_lock_lost(live_stack):
    key = _key()
    slow = _client(live_stack)
    fast = _client(live_stack)
    with slow.session(10_000) as session:
        grant = session.acquire(key, 1_000)
        wait_until(lambda: not slow.info(key)["held"], timeout=10, what="lease expiry")
        with fast.session(5_000) as other, other.lock(key, 5_000) as newer:
            with pytest.raises(LockLost):
                grant.renew()
            assert grant.lost is not None
            assert newer.token > grant.token
            assert grant.release() is False  # release stays quiet and never retried


def test_release_after_expiry_is_best_effort_and_never_raises(live_stack):
    key = _key()
    client = _client(live_stack)
    with client.session(10_000) as session:
        grant = session.acquire(key, 1_000)
        wait_until(lambda: not client.info(key)["held"], timeout=10, what="lease expiry")
        assert grant.release() is False
        with pytest.raises(LockLost):
            grant.ensure_valid()


# --------------------------------------------------------------------------- heartbeat


def test_heartbeat_keeps_a_short_session_alive_past_its_ttl(live_stack):
    client = _client(live_stack)
    with client.session(1_000) as session, session.lock(_key(), 5_000) as grant:
        wait_until(lambda: session.heartbeats >= 4, timeout=10, what="four heartbeats")
        assert session.lost is None
        grant.ensure_valid()


def test_session_deleted_behind_its_back_surfaces_as_lock_lost_with_the_callback(live_stack):
    lost = threading.Event()
    client = _client(live_stack)
    with client.session(1_000) as session:
        grant = session.acquire(_key(), 5_000, on_lost=lambda g, e: lost.set())
        # Another handle on the same owner ends the session (as a server-side reap would).
        requests.delete(
            f"{client.base_url}/v1/sessions/{session.session_id}",
            headers={"X-Owner-Id": client.owner_id},
            timeout=5,
        ).raise_for_status()
        assert lost.wait(5), "the heartbeat did not notice the session was gone"
        assert isinstance(session.lost, (SessionUnknown, SessionExpired))
        with pytest.raises(LockLost) as caught:
            grant.ensure_valid()
        with pytest.raises((SessionUnknown, SessionExpired)):
            session.acquire(_key(), 1_000)
    assert caught.value.details["reason"] == "heartbeat"


def test_unreachable_lock_server_fails_the_heartbeat_and_the_grant(live_stack, tmp_path):
    port = free_port()
    server = RoleProcess("lockserver", port, live_stack.env, tmp_path / "lockserver.log")
    server.start()
    try:
        client = _client_at(server.url)
        session = client.open_session(1_000)
        grant = session.acquire(_key(), 10_000)
        os.killpg(server.process.pid, signal.SIGSTOP)  # a hung server: connects, never answers
        try:
            wait_until(lambda: session.lost is not None, timeout=5, what="heartbeat failure")
        finally:
            os.killpg(server.process.pid, signal.SIGCONT)
        assert isinstance(session.lost, ServiceUnreachable)
        with pytest.raises(LockLost):
            grant.ensure_valid()
        session.close()
    finally:
        server.stop()


def _client_at(url: str) -> LockClient:
    return LockClient(url, f"client-{uuid.uuid4().hex[:8]}")


# --------------------------------------------------------------------------- retry policy


def test_retry_policy_retries_only_retry_safe_codes_with_bounded_jittered_backoff():
    sleep = RecordingSleep()
    policy = RetryPolicy(sleep=sleep, random_fn=lambda: 0.0)
    attempts = []

    def contended():
        attempts.append(1)
        raise LockContended("held", retry_after_ms=100)

    with pytest.raises(LockContended):
        policy(contended)
    assert len(attempts) == 1 + BUDGETS["lock.acquire"].retries == 6
    assert sleep.calls == [0.05, 0.1, 0.2, 0.4, 0.8]
    capped = RetryPolicy(max_retries=8, sleep=RecordingSleep(), random_fn=lambda: 1.0)
    assert all(0.0 < capped.delay(n, LockContended()) <= 1.0 for n in range(8))


@pytest.mark.parametrize(
    "error",
    [
        FencedOut("newer holder"),
        LockLost("gone"),
        SessionExpired("lapsed"),
        ServiceUnreachable("no answer", sent=True),
        LockContended("held", retry_safe=False),  # the server's own verdict wins
    ],
)
def test_retry_policy_fails_closed_on_everything_else(error):
    sleep = RecordingSleep()
    attempts = []

    def failing():
        attempts.append(1)
        raise error

    with pytest.raises(type(error)):
        RetryPolicy(sleep=sleep)(failing)
    assert attempts == [1] and sleep.calls == []


def test_contention_exceeded_and_not_leader_wait_at_least_retry_after():
    policy = RetryPolicy(random_fn=lambda: 0.0)
    assert policy.delay(0, ContentionExceeded("cap", retry_after_ms=750)) == 0.75
    assert policy.delay(0, NotLeader("primary lost", retry_after_ms=300)) == 0.3
    assert policy.delay(0, LockContended("held", retry_after_ms=900)) == 0.05


def test_acquire_on_a_closed_session_is_not_retried(live_stack):
    sleep = RecordingSleep()
    client = _client(live_stack, retry=RetryPolicy(sleep=sleep))
    session = client.open_session(5_000, heartbeat=False)
    requests.delete(
        f"{client.base_url}/v1/sessions/{session.session_id}",
        headers={"X-Owner-Id": client.owner_id},
        timeout=5,
    )
    with pytest.raises((SessionUnknown, SessionExpired)):
        session.acquire(_key(), 1_000)
    assert sleep.calls == []
    assert session.lost is not None


def test_bad_arguments_are_rejected_before_any_request():
    with pytest.raises(ValueError):
        LockClient("http://127.0.0.1:1", "")
    with pytest.raises(ValueError):
        LockClient("http://127.0.0.1:1", "x" * 65)
    with pytest.raises(ValueError):
        LockClient("http://127.0.0.1:1", "ok", safety_margin=1.0)


def test_a_refused_connection_is_reported_as_nothing_sent():
    with pytest.raises(ServiceUnreachable) as caught:
        call("GET", f"http://127.0.0.1:{free_port()}/v1/locks/x", hop=BUDGETS["advisory.read"])
    assert caught.value.sent is False and caught.value.retry_safe is True


# --------------------------------------------------------------------------- headers


class _CannedError(http.server.BaseHTTPRequestHandler):
    """Answers every POST with one C3 error envelope; keeps each request's headers."""

    status = 500
    body = b""
    seen: list[dict[str, str]]

    def do_POST(self):
        type(self).seen.append(dict(self.headers))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def _serving(handler: type[_CannedError]) -> Iterator[str]:
    """The handler on a reserved port for the block; its base URL."""
    handler.seen = []
    server = http.server.HTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _HeaderCapture(_CannedError):
    status = 409
    body = b'{"code":"LOCK_CONTENDED","message":"held","retrySafe":true,"traceId":"t"}'


def test_every_request_carries_traceparent_and_the_owner_id():
    token = set_trace_id("ab" * 16)
    try:
        with _serving(_HeaderCapture) as base, pytest.raises(LockContended) as caught:
            call(
                "POST",
                f"{base}/v1/sessions",
                hop=BUDGETS["lock.session"],
                owner_id="worker-9",
                json_body={},
            )
    finally:
        reset_trace_id(token)
    headers = _HeaderCapture.seen[-1]
    assert headers["X-Owner-Id"] == "worker-9"
    assert headers["traceparent"].startswith("00-" + "ab" * 16 + "-")
    assert caught.value.status == 409 and caught.value.code == "LOCK_CONTENDED"


class _NotLeader(_CannedError):
    """Every session open answered 503 NOT_LEADER (a lock store without quorum)."""

    status = 503
    body = (
        b'{"code":"NOT_LEADER","message":"no leader","retrySafe":true,'
        b'"retryAfterMillis":10,"traceId":"t"}'
    )


@pytest.mark.parametrize(("retry", "sent"), [(None, 2), (RetryPolicy(max_retries=0), 1)])
def test_open_session_retries_within_its_budget_or_not_at_all_when_told(retry, sent):
    """The budget's one retry after retryAfterMillis by default; `retry=RetryPolicy(
    max_retries=0)` makes it one attempt (the HA probers: no wait hidden inside a call)."""
    with _serving(_NotLeader) as base:
        client = LockClient(base, "owner-1")
        with pytest.raises(NotLeader):
            client.open_session(5_000, heartbeat=False, retry=retry)
    assert len(_NotLeader.seen) == sent
