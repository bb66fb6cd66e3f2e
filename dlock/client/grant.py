"""A held lock: its fencing token and the local deadline past which it is not trusted."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from dlock.budgets import BACKOFF_INITIAL_S, BUDGETS
from dlock.client.errors import (
    DlockError,
    LockLost,
    NotLeader,
    ServiceUnreachable,
    SessionExpired,
    SessionUnknown,
)
from dlock.client.retry import retry_delay_s
from dlock.http import Reply
from dlock.logs import log_event

OnLost = Callable[["Grant", LockLost], None]


@dataclass(frozen=True)
class SessionLink:
    """What a grant uses of the session it hangs off (`LockSession` makes one): its ids, its
    clock and safety margin, why it was lost (if it was), a request on its client, and a way to
    let go of the grant."""

    session_id: str
    owner_id: str
    margin: float
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    lost: Callable[[], DlockError | None]
    request: Callable[..., Reply]
    forget: Callable[[Grant], None]


def parse_time(raw: Any) -> datetime | None:
    """An RFC 3339 timestamp of the lock server's answers, or None."""
    if not isinstance(raw, str):
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def key_path(key: str) -> str:
    """A lock key as a path segment of /v1/locks/."""
    return quote(key, safe=":._-")


class Grant:
    """One held lock: its fencing token and how long this process may still trust it.

    Obtain it from `LockSession.lock()` / `acquire()`; never construct it yourself.
    """

    def __init__(
        self,
        session: SessionLink,
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
        self.acquired_at: datetime | None = parse_time(body.get("acquiredAt"))
        self._on_lost = on_lost
        self._lost: LockLost | None = None
        self._released = False
        self._mutex = threading.Lock()
        self._apply(body, ttl_ms=ttl_ms, sent_at=sent_at)

    def fence_headers(self) -> dict[str, str]:
        """X-Fencing-Token and X-Fencing-Proof for a call made under this grant."""
        return {"X-Fencing-Token": str(self.token), "X-Fencing-Proof": self.proof}

    def _apply(self, body: dict[str, Any], *, ttl_ms: int, sent_at: float) -> None:
        expires = parse_time(body.get("expiresAt"))
        acquired = parse_time(body.get("acquiredAt"))
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
            if self._session.lost() is not None:
                self.mark_lost("session", self._session.lost())
            elif self._session.clock() >= self.deadline:
                self.mark_lost("deadline")
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
                reply = self._session.request(
                    "POST",
                    f"/v1/locks/{key_path(self.key)}/renew",
                    json_body={"sessionId": self.session_id, "ttlMillis": ttl},
                    hop=hop,
                    headers=self.fence_headers(),
                )
                break
            except (LockLost, SessionUnknown, SessionExpired) as exc:
                self.mark_lost("renew", exc)
                raise self._lost from exc  # type: ignore[misc]
            except (NotLeader, ServiceUnreachable) as exc:
                if attempts >= hop.retries or not exc.retry_safe:
                    raise
                attempts += 1
                self._session.sleep(retry_delay_s(exc, BACKOFF_INITIAL_S))
        with self._mutex:
            self._apply(reply.body, ttl_ms=ttl, sent_at=sent_at)
            # After a key rotation the renewed proof is signed with the new key.
            self.proof = reply.body.get("fencingProof", self.proof)

    def release(self) -> bool:
        """Best-effort compare-and-delete (L6), never retried: expiry is the fallback."""
        if self._released:
            return False
        self._released = True
        self._session.forget(self)
        already_lost = self._lost is not None
        if self._lost is None:
            self._lost = LockLost("released", details={"key": self.key, "reason": "released"})
        if self._session.lost() is not None:
            return False
        try:
            self._session.request(
                "DELETE",
                f"/v1/locks/{key_path(self.key)}",
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

    def mark_lost(self, reason: str, cause: BaseException | None = None) -> None:
        """Stop trusting the grant (its session does this when the session is lost or closed);
        `on_lost` runs once."""
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
