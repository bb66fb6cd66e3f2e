"""dlock's lock client: sessions, grants with fencing tokens, and a lock that knows it was lost.

    client = LockClient("http://127.0.0.1:8081", owner_id="worker-7")
    with client.session(ttl_ms=10_000) as session:
        with session.lock("payout:acc-42", ttl_ms=10_000, wait_ms=2_000) as grant:
            grant.ensure_valid()                     # before every protected write
            write(..., fencing_token=grant.token)

`session.lock()` raises instead of entering the block without the lock. A grant carries its
fencing token and a monotonic local deadline (TTL × (1 − 0.30)); `ensure_valid()` raises
`LockLost` past it, after a failed heartbeat, or once the server said the grant is gone. The
deadline is advisory protection for the caller: the fenced write at the resource is the
authority. Retry policy, clock and sleep are injected, as in kazoo, so tests control time.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

from dlock.budgets import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    BUDGETS,
    CLIENT_SAFETY_MARGIN,
    Budget,
    heartbeat_window_s,
)
from dlock.errors import CATALOGUE, Code
from dlock.http import Reply, TransportError, exchange
from dlock.logs import log_event

__all__ = [
    "ContentionExceeded",
    "DeadlineExceeded",
    "DlockError",
    "DuplicateSubmission",
    "FencedOut",
    "Grant",
    "IdempotencyConflict",
    "InsufficientFunds",
    "InternalError",
    "InvalidToken",
    "LockClient",
    "LockContended",
    "LockLost",
    "LockSession",
    "NotFound",
    "NotLeader",
    "Overloaded",
    "PayoutNotClaimable",
    "RailAmbiguous",
    "RailUnavailable",
    "RetryPolicy",
    "ServiceUnreachable",
    "SessionExpired",
    "SessionUnknown",
    "ValidationFailed",
    "call",
]

T = TypeVar("T")
OnLost = Callable[["Grant", "LockLost"], None]


# --------------------------------------------------------------------------- exceptions


def _catalogue_retry_safe(code: str | None) -> bool:
    """The C3 §3.2 verdict from the one catalogue (dlock.errors); unknown codes fail closed."""
    return code in Code.__members__ and CATALOGUE[Code(code)].retry_safe


class DlockError(Exception):
    """A C3 error envelope (or a local verdict) as an exception: code, retrySafe, details."""

    code: str | None = None

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        retry_safe: bool | None = None,
        details: dict[str, Any] | None = None,
        retry_after_ms: int | None = None,
        status: int | None = None,
        trace_id: str | None = None,
    ) -> None:
        if code is not None:
            self.code = code
        self.message = message or (self.code or self.__class__.__name__)
        self.retry_safe = _catalogue_retry_safe(self.code) if retry_safe is None else retry_safe
        self.details: dict[str, Any] = details or {}
        self.retry_after_ms = retry_after_ms
        self.status = status
        self.trace_id = trace_id
        super().__init__(f"{self.code}: {self.message}" if self.code else self.message)


class LockContended(DlockError):
    """LOCK_CONTENDED: another owner holds the lock; nothing happened (retry-safe)."""

    code = "LOCK_CONTENDED"


class ContentionExceeded(DlockError):
    """CONTENTION_EXCEEDED: retry budget or waiter cap hit; retry only after retryAfterMillis."""

    code = "CONTENTION_EXCEEDED"


class NotLeader(DlockError):
    """NOT_LEADER: this replica cannot serve writes; no state was touched (retry-safe)."""

    code = "NOT_LEADER"


class LockLost(DlockError):
    """LOCK_LOST: the grant expired, was revoked, or can no longer be trusted locally."""

    code = "LOCK_LOST"


class SessionUnknown(DlockError):
    """SESSION_UNKNOWN: no such session; its locks are gone, open a new one."""

    code = "SESSION_UNKNOWN"


class SessionExpired(DlockError):
    """SESSION_EXPIRED: the session's heartbeat lapsed and its locks were released."""

    code = "SESSION_EXPIRED"


class InvalidToken(DlockError):
    """INVALID_TOKEN: the fencing token header was absent or malformed (client defect)."""

    code = "INVALID_TOKEN"


class FencedOut(DlockError):
    """FENCED_OUT: a newer holder exists; abort the whole critical section (incident)."""

    code = "FENCED_OUT"


class PayoutNotClaimable(DlockError):
    """PAYOUT_NOT_CLAIMABLE: the payout's state does not allow this transition."""

    code = "PAYOUT_NOT_CLAIMABLE"


class DuplicateSubmission(DlockError):
    """DUPLICATE_SUBMISSION: the proxy already holds a submission for this payout."""

    code = "DUPLICATE_SUBMISSION"


class InsufficientFunds(DlockError):
    """INSUFFICIENT_FUNDS: the balance would go negative; the payout is FAILED."""

    code = "INSUFFICIENT_FUNDS"


class IdempotencyConflict(DlockError):
    """IDEMPOTENCY_CONFLICT: the same idempotency key came with a different body."""

    code = "IDEMPOTENCY_CONFLICT"


class RailUnavailable(DlockError):
    """RAIL_UNAVAILABLE: the proxy proved nothing was presented to the rail."""

    code = "RAIL_UNAVAILABLE"


class RailAmbiguous(DlockError):
    """RAIL_AMBIGUOUS: an attempt was forwarded and its outcome is unknown; never resubmit."""

    code = "RAIL_AMBIGUOUS"


class ValidationFailed(DlockError):
    """VALIDATION_FAILED: the request broke the schema; details.fields says where."""

    code = "VALIDATION_FAILED"


class NotFound(DlockError):
    """NOT_FOUND: no such payout, account, lock key or route."""

    code = "NOT_FOUND"


class Overloaded(DlockError):
    """OVERLOADED: no worker thread or database slot within its queue deadline (retry-safe)."""

    code = "OVERLOADED"


class DeadlineExceeded(DlockError):
    """DEADLINE_EXCEEDED: the server's deadline hit and it rolled back (retry-safe)."""

    code = "DEADLINE_EXCEEDED"


class InternalError(DlockError):
    """INTERNAL: the server failed unexpectedly; the outcome of a write is unknown."""

    code = "INTERNAL"


class ServiceUnreachable(DlockError):
    """No HTTP response at all; `sent` is False only when nothing reached the server."""

    def __init__(self, message: str, *, sent: bool, **kwargs: Any) -> None:
        self.sent = sent
        super().__init__(message, retry_safe=not sent, **kwargs)


ERRORS: dict[str, type[DlockError]] = {
    cls.code: cls
    for cls in (
        LockContended,
        ContentionExceeded,
        NotLeader,
        LockLost,
        SessionUnknown,
        SessionExpired,
        InvalidToken,
        FencedOut,
        PayoutNotClaimable,
        DuplicateSubmission,
        InsufficientFunds,
        IdempotencyConflict,
        RailUnavailable,
        RailAmbiguous,
        ValidationFailed,
        NotFound,
        Overloaded,
        DeadlineExceeded,
        InternalError,
    )
    if cls.code
}


def error_from_reply(reply: Reply) -> DlockError:
    """Map a non-2xx reply to its typed exception; a body without a code is INTERNAL."""
    body = reply.body if isinstance(reply.body, dict) else {}
    code = body.get("code")
    cls = ERRORS.get(code, DlockError) if isinstance(code, str) else InternalError
    return cls(
        str(body.get("message") or f"HTTP {reply.status}"),
        code=code if isinstance(code, str) else "INTERNAL",
        retry_safe=bool(body.get("retrySafe", False)),
        details=body.get("details") if isinstance(body.get("details"), dict) else None,
        retry_after_ms=body.get("retryAfterMillis"),
        status=reply.status,
        trace_id=body.get("traceId"),
    )


def call(
    method: str,
    url: str,
    *,
    hop: Budget,
    owner_id: str | None = None,
    json_body: Any = None,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    read_timeout_s: float | None = None,
    trace_id: str | None = None,
) -> Reply:
    """One exchange; a non-2xx becomes its typed DlockError, no response ServiceUnreachable."""
    try:
        reply = exchange(
            method,
            url,
            hop=hop,
            owner_id=owner_id,
            json_body=json_body,
            params=params,
            headers=headers,
            read_timeout_s=read_timeout_s,
            trace_id=trace_id,
        )
    except TransportError as exc:
        raise ServiceUnreachable(str(exc), sent=exc.sent) from exc
    if not reply.ok:
        raise error_from_reply(reply)
    return reply


# --------------------------------------------------------------------------- retry


RETRY_SAFE_LOCK_ERRORS: tuple[type[DlockError], ...] = (
    LockContended,
    ContentionExceeded,
    NotLeader,
)


class RetryPolicy:
    """Bounded, jittered exponential retry of the retry-safe lock-server codes only (FR-28).

    Delays grow 50 ms → 1 s; CONTENTION_EXCEEDED and NOT_LEADER wait at least the server's
    retryAfterMillis. Anything else, and anything the server marked retrySafe=false, fails closed
    on the first attempt. `sleep` and `random` are injectable so tests control time.
    """

    def __init__(
        self,
        max_retries: int = BUDGETS["lock.acquire"].retries,
        *,
        initial_delay: float = BACKOFF_INITIAL_S,
        max_delay: float = BACKOFF_MAX_S,
        backoff: float = 2.0,
        jitter: float = 0.5,
        retry_on: tuple[type[DlockError], ...] = RETRY_SAFE_LOCK_ERRORS,
        sleep: Callable[[float], None] = time.sleep,
        random_fn: Callable[[], float] = random.random,
    ) -> None:
        self.max_retries = max_retries
        self.initial_delay = initial_delay
        self.max_delay = max_delay
        self.backoff = backoff
        self.jitter = jitter
        self.retry_on = retry_on
        self.sleep = sleep
        self.random_fn = random_fn

    def delay(self, attempt: int, exc: DlockError) -> float:
        """Seconds to wait before retry number `attempt + 1`."""
        base = min(self.max_delay, self.initial_delay * self.backoff**attempt)
        wait = base * (1.0 - self.jitter * self.random_fn())
        if isinstance(exc, (ContentionExceeded, NotLeader)) and exc.retry_after_ms:
            wait = max(wait, exc.retry_after_ms / 1000.0)
        return wait

    def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        attempt = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except self.retry_on as exc:
                if attempt >= self.max_retries or not exc.retry_safe:
                    raise
                self.sleep(self.delay(attempt, exc))
                attempt += 1


# --------------------------------------------------------------------------- grants


def _parse_time(raw: Any) -> datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def _key_path(key: str) -> str:
    return quote(key, safe=":._-")


class Grant:
    """One held lock: its fencing token and how long this process may still trust it.

    Obtain it from `LockSession.lock()` / `acquire()`; never construct it yourself.
    """

    def __init__(
        self,
        session: LockSession,
        body: dict[str, Any],
        *,
        ttl_ms: int,
        sent_at: float,
        on_lost: OnLost | None,
    ) -> None:
        self._session = session
        self.key: str = body["key"]
        self.token: int = int(body["fencingToken"])
        # The lock server's MAC over (key, token): sent beside the token on every fenced call.
        self.proof: str = body.get("fencingProof", "")
        self.owner_id: str = body.get("ownerId", session.owner_id)
        self.session_id: str = body.get("sessionId", session.session_id)
        self.acquired_at: datetime | None = _parse_time(body.get("acquiredAt"))
        self._on_lost = on_lost
        self._lost: LockLost | None = None
        self._released = False
        self._mutex = threading.Lock()
        self._apply(body, ttl_ms=ttl_ms, sent_at=sent_at)

    def fence_headers(self) -> dict[str, str]:
        """X-Fencing-Token and X-Fencing-Proof for a call made under this grant."""
        return {"X-Fencing-Token": str(self.token), "X-Fencing-Proof": self.proof}

    def _apply(self, body: dict[str, Any], *, ttl_ms: int, sent_at: float) -> None:
        expires = _parse_time(body.get("expiresAt"))
        acquired = _parse_time(body.get("acquiredAt"))
        granted_ms = ttl_ms
        if expires and acquired and expires > acquired:
            # The server may clamp the TTL down; its own two timestamps say by how much.
            granted_ms = min(ttl_ms, int((expires - acquired).total_seconds() * 1000))
        self.ttl_ms = granted_ms
        self.expires_at: datetime | None = expires
        # Counted from when the request was sent, not answered: the lease may have started then.
        self.deadline: float = sent_at + granted_ms / 1000.0 * (1.0 - self._session.margin)

    def __repr__(self) -> str:
        return f"<Grant key={self.key!r} token={self.token} remaining={self.remaining():.3f}s>"

    @property
    def lost(self) -> LockLost | None:
        """Why the grant is no longer trusted, or None while it still is."""
        return self._lost

    def remaining(self) -> float:
        """Seconds until the local deadline (0 once it passed or the grant was lost)."""
        if self._lost is not None:
            return 0.0
        return max(0.0, self.deadline - self._session.clock())

    def ensure_valid(self) -> None:
        """Raise LockLost unless this process may still act as the holder. Call before writes."""
        if self._lost is None:
            if self._session.lost is not None:
                self._mark_lost("session", self._session.lost)
            elif self._session.clock() >= self.deadline:
                self._mark_lost("deadline")
        if self._lost is not None:
            raise self._lost

    def renew(self, ttl_ms: int | None = None) -> None:
        """Extend the lease (L5, same token); LockLost if the server says it is gone."""
        self.ensure_valid()
        ttl = ttl_ms or self.ttl_ms
        hop = BUDGETS["lock.renew"]
        attempts = 0
        while True:
            sent_at = self._session.clock()
            try:
                reply = self._session._post(
                    f"/v1/locks/{_key_path(self.key)}/renew",
                    {"sessionId": self.session_id, "ttlMillis": ttl},
                    hop=hop,
                    headers=self.fence_headers(),
                )
                break
            except (LockLost, SessionUnknown, SessionExpired) as exc:
                self._mark_lost("renew", exc)
                raise self._lost from exc  # type: ignore[misc]
            except (NotLeader, ServiceUnreachable) as exc:
                if attempts >= hop.retries or not exc.retry_safe:
                    raise
                attempts += 1
                self._session.sleep(BACKOFF_INITIAL_S)
        with self._mutex:
            self._apply(reply.body, ttl_ms=ttl, sent_at=sent_at)
            # After a key rotation the renewed proof is signed with the new key.
            self.proof = reply.body.get("fencingProof", self.proof)

    def release(self) -> bool:
        """Best-effort compare-and-delete (L6), never retried: expiry is the fallback."""
        if self._released:
            return False
        self._released = True
        self._session._forget(self)
        already_lost = self._lost is not None
        if self._lost is None:
            self._lost = LockLost("released", details={"key": self.key, "reason": "released"})
        if self._session.lost is not None:
            return False
        try:
            self._session._request(
                "DELETE",
                f"/v1/locks/{_key_path(self.key)}",
                hop=BUDGETS["lock.release"],
                params={"sessionId": self.session_id},
                headers=self.fence_headers(),
            )
        except DlockError as exc:
            # LOCK_LOST here is benign (expired or taken over): log only.
            log_event(
                "lock_release_failed",
                level=logging.INFO if already_lost else logging.WARNING,
                key=self.key,
                token=self.token,
                ownerId=self.owner_id,
                code=exc.code,
                error=str(exc),
            )
            return False
        return True

    def _mark_lost(self, reason: str, cause: BaseException | None = None) -> None:
        with self._mutex:
            if self._lost is not None:
                return
            lost = LockLost(
                f"lock {self.key} token {self.token} lost: {reason}",
                details={"key": self.key, "token": self.token, "reason": reason},
            )
            lost.__cause__ = cause
            self._lost = lost
        log_event(
            "lock_lost",
            level=logging.WARNING,
            key=self.key,
            token=self.token,
            ownerId=self.owner_id,
            reason=reason,
            cause=str(cause) if cause else None,
        )
        if self._on_lost is not None:
            try:
                self._on_lost(self, lost)
            except Exception:  # a callback must not kill the heartbeat thread
                logging.getLogger(__name__).exception("on_lost callback failed")


# --------------------------------------------------------------------------- sessions


class LockSession:
    """A lock-server session kept alive by a background heartbeat; grants hang off it."""

    def __init__(self, client: LockClient, body: dict[str, Any], *, ttl_ms: int) -> None:
        self._client = client
        self.session_id: str = body["sessionId"]
        self.owner_id: str = body.get("ownerId", client.owner_id)
        self.ttl_ms: int = int(body.get("ttlMillis", ttl_ms))
        self.expires_at: datetime | None = _parse_time(body.get("expiresAt"))
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
                    f"/v1/locks/{_key_path(key)}/acquire",
                    {"sessionId": self.session_id, "ttlMillis": ttl, "waitMillis": wait_ms},
                    hop=hop,
                    read_timeout_s=hop.read_s + wait_ms / 1000.0,
                )
            except (SessionUnknown, SessionExpired) as exc:
                self._mark_lost(exc)
                raise
            grant = Grant(self, reply.body, ttl_ms=ttl, sent_at=sent_at, on_lost=on_lost)
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
        for _ in range(1 + hop.retries):
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
                self._stop.wait(min(BACKOFF_INITIAL_S, max(0.0, window_ends - self.clock())))
                continue
            self.heartbeats += 1
            self.expires_at = _parse_time(reply.body.get("expiresAt")) or self.expires_at
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
            grant._mark_lost("heartbeat", cause)

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
            grant._mark_lost("session closed")
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
        base_url: str,
        owner_id: str,
        *,
        default_ttl_ms: int = 10_000,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        safety_margin: float = CLIENT_SAFETY_MARGIN,
    ) -> None:
        if not owner_id or len(owner_id) > 64:
            raise ValueError("owner_id must be 1..64 characters")
        if not 0.0 <= safety_margin < 1.0:
            raise ValueError("safety_margin must be in [0, 1)")
        self.base_url = base_url.rstrip("/")
        self.owner_id = owner_id
        self.default_ttl_ms = default_ttl_ms
        self.retry = retry or RetryPolicy(sleep=sleep)
        self.clock = clock
        self.sleep = sleep
        self.safety_margin = safety_margin

    def __repr__(self) -> str:
        return f"<LockClient {self.base_url} owner={self.owner_id!r}>"

    def open_session(self, ttl_ms: int = 10_000, *, heartbeat: bool = True) -> LockSession:
        """Create a session (L1); the caller must close() it. Prefer `session()`."""
        hop = BUDGETS["lock.session"]
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
            except (NotLeader, ServiceUnreachable):
                # A duplicate session is harmless (it simply expires), so even a lost reply
                # may be retried once.
                if attempts >= hop.retries:
                    raise
                attempts += 1
                self.sleep(BACKOFF_INITIAL_S)
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
        return self._request(
            "GET", f"/v1/locks/{_key_path(key)}", hop=BUDGETS["advisory.read"]
        ).body

    def revoke(
        self, key: str, *, operator: str, reason: str, expected_token: int | None = None
    ) -> dict[str, Any]:
        """L8 operator revoke: returns revokedToken, newTokenFloor, revocationId."""
        body: dict[str, Any] = {"operator": operator, "reason": reason}
        if expected_token is not None:
            body["expectedToken"] = expected_token
        return self._request(
            "POST", f"/v1/locks/{_key_path(key)}/revoke", hop=BUDGETS["lock.revoke"], json_body=body
        ).body

    def _request(self, method: str, path: str, **kwargs: Any) -> Reply:
        return call(method, self.base_url + path, owner_id=self.owner_id, **kwargs)
