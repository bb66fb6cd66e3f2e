"""Sessions kept alive by a heartbeat, and the client that opens them (L1–L3, L7, L8)."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

from dlock.auth import authorization_header
from dlock.budgets import BACKOFF_INITIAL_S, BUDGETS, CLIENT_SAFETY_MARGIN, heartbeat_window_s
from dlock.client.errors import (
    DlockError,
    NotLeader,
    Overloaded,
    ServiceUnreachable,
    SessionExpired,
    SessionUnknown,
)
from dlock.client.grant import Grant, OnLost, SessionLink, key_path, parse_time
from dlock.client.retry import RetryPolicy, retry_delay_s
from dlock.client.transport import Endpoints
from dlock.http import Reply
from dlock.logs import log_event


class LockSession:
    """A lock-server session kept alive by a background heartbeat; grants hang off it."""

    def __init__(self, client: LockClient, body: dict[str, Any], *, ttl_ms: int) -> None:
        self._client = client
        self.session_id: str = body["sessionId"]
        self.owner_id: str = body.get("ownerId", client.owner_id)
        self.ttl_ms: int = int(body.get("ttlMillis", ttl_ms))
        self.expires_at: datetime | None = parse_time(body.get("expiresAt"))
        self.clock = client.clock
        self.sleep = client.sleep
        self.margin = client.safety_margin
        self.lost: DlockError | None = None
        self.heartbeats = 0
        self._grants: set[Grant] = set()
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._link = SessionLink(
            session_id=self.session_id,
            owner_id=self.owner_id,
            margin=self.margin,
            clock=self.clock,
            sleep=self.sleep,
            lost=lambda: self.lost,
            request=self._request,
            forget=self._forget,
        )

    def __repr__(self) -> str:
        return f"<LockSession {self.session_id} owner={self.owner_id!r} ttl={self.ttl_ms}ms>"

    def __enter__(self) -> LockSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- locks ---------------------------------------------------------------------------

    def acquire(
        self,
        key: str,
        ttl_ms: int | None = None,
        wait_ms: int = 0,
        *,
        on_lost: OnLost | None = None,
        retry: RetryPolicy | None = None,
    ) -> Grant:
        """Acquire `key` (L4) or raise; retries only the retry-safe codes, per the policy."""
        self.ensure_alive()
        ttl = ttl_ms or self._client.default_ttl_ms
        hop = BUDGETS["lock.acquire"]
        policy = retry or self._client.retry

        def attempt() -> Grant:
            sent_at = self.clock()
            try:
                reply = self._post(
                    f"/v1/locks/{key_path(key)}/acquire",
                    {"sessionId": self.session_id, "ttlMillis": ttl, "waitMillis": wait_ms},
                    hop=hop,
                    read_timeout_s=hop.read_s + wait_ms / 1000.0,
                )
            except (SessionUnknown, SessionExpired) as exc:
                self._mark_lost(exc)
                raise
            grant = Grant(self._link, reply.body, ttl_ms=ttl, sent_at=sent_at, on_lost=on_lost)
            with self._mutex:
                self._grants.add(grant)
            return grant

        return policy(attempt)

    @contextlib.contextmanager
    def lock(
        self,
        key: str,
        ttl_ms: int | None = None,
        wait_ms: int = 0,
        *,
        on_lost: OnLost | None = None,
        retry: RetryPolicy | None = None,
    ) -> Iterator[Grant]:
        """Hold `key` for the block; raises (never enters the block) when not granted."""
        grant = self.acquire(key, ttl_ms, wait_ms, on_lost=on_lost, retry=retry)
        try:
            yield grant
        finally:
            grant.release()

    # -- liveness ------------------------------------------------------------------------

    def ensure_alive(self) -> None:
        """Raise the error that ended this session, if one did."""
        if self._closed and self.lost is None:
            raise SessionUnknown("session closed", details={"sessionId": self.session_id})
        if self.lost is not None:
            raise self.lost

    def heartbeat(self) -> None:
        """One heartbeat within the C3 §3.8 budget: 2 retries inside a third of the TTL."""
        hop = BUDGETS["lock.heartbeat"]
        window_ends = self.clock() + heartbeat_window_s(self.ttl_ms)
        last: DlockError | None = None
        for attempt in range(1 + hop.retries):
            left = window_ends - self.clock()
            if left <= 0:
                break
            try:
                reply = self._post(
                    f"/v1/sessions/{self.session_id}/heartbeat",
                    None,
                    hop=hop,
                    read_timeout_s=min(hop.read_s, left),
                )
            except (SessionUnknown, SessionExpired) as exc:
                self._mark_lost(exc)
                raise
            except DlockError as exc:
                last = exc
                if not exc.retry_safe and not isinstance(exc, ServiceUnreachable):
                    break  # a slow heartbeat is a lost lease; an unknown reply is too
                # jittered, growing, and always inside the heartbeat window
                pause = BACKOFF_INITIAL_S * 2**attempt * (0.5 + random.random())
                self._stop.wait(min(pause, max(0.0, window_ends - self.clock())))
                continue
            self.heartbeats += 1
            self.expires_at = parse_time(reply.body.get("expiresAt")) or self.expires_at
            return
        lost = last or ServiceUnreachable("heartbeat window elapsed", sent=True)
        self._mark_lost(lost)
        raise lost

    def start_heartbeat(self) -> None:
        """Heartbeat every third of the session TTL on a daemon thread until close()."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._heartbeat_loop, name=f"dlock-heartbeat-{self.session_id[:8]}", daemon=True
        )
        self._thread.start()

    def _heartbeat_loop(self) -> None:
        interval = heartbeat_window_s(self.ttl_ms)
        while not self._stop.wait(interval):
            try:
                self.heartbeat()
            except DlockError:
                return  # _mark_lost already told every grant

    def _mark_lost(self, cause: DlockError) -> None:
        with self._mutex:
            if self.lost is not None:
                return
            self.lost = cause
            grants = list(self._grants)
        log_event(
            "lock_session_lost",
            level=logging.WARNING,
            sessionId=self.session_id,
            ownerId=self.owner_id,
            code=cause.code,
            error=str(cause),
        )
        for grant in grants:
            grant.mark_lost("heartbeat", cause)

    def _forget(self, grant: Grant) -> None:
        with self._mutex:
            self._grants.discard(grant)

    def close(self) -> None:
        """Stop the heartbeat and delete the session (L3), which releases its locks."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=BUDGETS["lock.heartbeat"].read_s * 3)
        with self._mutex:
            grants = list(self._grants)
        for grant in grants:
            grant.mark_lost("session closed")
        if self.lost is not None:
            return
        try:
            self._request("DELETE", f"/v1/sessions/{self.session_id}", hop=BUDGETS["lock.release"])
        except DlockError as exc:
            log_event(
                "lock_session_close_failed",
                level=logging.INFO,
                sessionId=self.session_id,
                ownerId=self.owner_id,
                error=str(exc),
            )

    # -- transport -----------------------------------------------------------------------

    def _post(self, path: str, body: dict[str, Any] | None, **kwargs: Any) -> Reply:
        return self._request("POST", path, json_body=body if body is not None else {}, **kwargs)

    def _request(self, method: str, path: str, **kwargs: Any) -> Reply:
        return self._client._request(method, path, **kwargs)


class LockClient:
    """Entry point: one per process and owner. Thread-safe; sessions are cheap."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        owner_id: str,
        *,
        default_ttl_ms: int = 10_000,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        safety_margin: float = CLIENT_SAFETY_MARGIN,
        pool_size: int | None = None,
    ) -> None:
        if not owner_id or len(owner_id) > 64:
            raise ValueError("owner_id must be 1..64 characters")
        if not 0.0 <= safety_margin < 1.0:
            raise ValueError("safety_margin must be in [0, 1)")
        # Idle keep-alive connections kept per replica: at least the caller's threads in flight.
        self.endpoints = Endpoints(base_url, pool_size=pool_size, name="lockserver")
        self.owner_id = owner_id
        self.default_ttl_ms = default_ttl_ms
        self.retry = retry or RetryPolicy(sleep=sleep)
        self.clock = clock
        self.sleep = sleep
        self.safety_margin = safety_margin

    def __repr__(self) -> str:
        return f"<LockClient {','.join(self.endpoints.urls)} owner={self.owner_id!r}>"

    @property
    def base_url(self) -> str:
        """The replica calls currently go to (the first of the list until one fails)."""
        return self.endpoints.current

    def open_session(
        self, ttl_ms: int = 10_000, *, heartbeat: bool = True, retry: RetryPolicy | None = None
    ) -> LockSession:
        """Create a session (L1); the caller must close() it. Prefer `session()`.

        Retried at most the budget's retries (C3 §3.8), fewer when `retry` allows fewer
        (`RetryPolicy(max_retries=0)`: one attempt, the caller decides what comes next)."""
        hop = BUDGETS["lock.session"]
        retries = hop.retries if retry is None else min(hop.retries, retry.max_retries)
        attempts = 0
        while True:
            try:
                reply = self._request(
                    "POST",
                    "/v1/sessions",
                    hop=hop,
                    json_body={"ownerId": self.owner_id, "ttlMillis": ttl_ms},
                )
                break
            except (NotLeader, Overloaded, ServiceUnreachable) as exc:
                # A duplicate session is harmless (it simply expires), so even a lost reply
                # may be retried once, after the server's retryAfterMillis when it gave one.
                if attempts >= retries:
                    raise
                attempts += 1
                # jittered: a fleet meeting a restarting lock-server does not come back at once
                self.sleep(retry_delay_s(exc, BACKOFF_INITIAL_S) * (0.5 + random.random()))
        session = LockSession(self, reply.body, ttl_ms=ttl_ms)
        if heartbeat:
            session.start_heartbeat()
        return session

    @contextlib.contextmanager
    def session(self, ttl_ms: int = 10_000, *, heartbeat: bool = True) -> Iterator[LockSession]:
        """A session for the block, heartbeating in the background, closed on exit."""
        session = self.open_session(ttl_ms, heartbeat=heartbeat)
        try:
            yield session
        finally:
            session.close()

    def info(self, key: str) -> dict[str, Any]:
        """L7, advisory only: never decide "safe to write" from it (C3 §3.1)."""
        return self._request("GET", f"/v1/locks/{key_path(key)}", hop=BUDGETS["advisory.read"]).body

    def revoke(
        self, key: str, *, operator: str, reason: str, expected_token: int | None = None
    ) -> dict[str, Any]:
        """L8 operator revoke: returns revokedToken, newTokenFloor, revocationId."""
        body: dict[str, Any] = {"operator": operator, "reason": reason}
        if expected_token is not None:
            body["expectedToken"] = expected_token
        return self._request(
            "POST",
            f"/v1/locks/{key_path(key)}/revoke",
            hop=BUDGETS["lock.revoke"],
            json_body=body,
            headers=authorization_header("operator"),  # L8 needs the operator scope
        ).body

    def _request(self, method: str, path: str, **kwargs: Any) -> Reply:
        return self.endpoints.call(method, path, owner_id=self.owner_id, **kwargs)
