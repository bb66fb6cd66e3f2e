"""What every part of the etcd backend shares: the NOT_LEADER mapping and lease arithmetic."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from django.conf import settings

from dlock.budgets import BUDGETS
from dlock.errors import ApiError, Code
from lockserver.etcd_client import EtcdUnavailable, request_deadline

F = TypeVar("F", bound=Callable[..., Any])
# etcd's lessor revokes expired leases every 500 ms; this bounds how long a call waits for the
# store to act on an expiry that has already happened (only then; it never extends a lease)
EXPIRY_GRACE_S = 0.75
# L1 caps a session TTL at 60 s: the longest a session can outlive its last heartbeat.
MAX_SESSION_TTL_S = 60
FRESH_LEASE_S = 0.1
# A grant lease is granted this much longer than the grant's whole seconds, so an emptied one
# can carry the next grant of the same TTL without a keepalive while its known remaining TTL
# still covers that grant (`LeasePool.grant`). etcd may delete such a grant up to
# this much after its recorded expiresAt; the recorded deadline is what every decision reads
# (a contender takes over after EXPIRY_GRACE_S, a parked head wakes by then: `_await_turn`).
LEASE_SLACK_S = 1
# Reused without a keepalive only while the lease's lower bound on etcd's expiry is at least
# this far beyond the new grant's deadline (the two clocks' drift over one slack, and more).
LEASE_COVER_MARGIN_S = 0.1


def not_leader(message: str = "") -> ApiError:
    return ApiError(
        Code.NOT_LEADER,
        message or "the lock store is unreachable or has no leader; nothing was changed",
        retry_after_ms=settings.LOCK_NOT_LEADER_RETRY_MS,
    )


def request_budget_s(wait_ms: int = 0) -> float:
    """The etcd time one request may spend, all its calls together (plus the wait the caller
    asked for, L4 waitMillis): what is left of the client's acquire read timeout after the
    admission queue's deadline and 100 ms for the answer — never less than one call's hop
    budget (connect + request timeout). A take-over of a lapsed holder waits up to
    EXPIRY_GRACE_S inside it."""
    one_call = (settings.ETCD_CONNECT_TIMEOUT_MS + settings.ETCD_REQUEST_TIMEOUT_MS) / 1000
    left = BUDGETS["lock.acquire"].read_s - settings.SERVER_QUEUE_DEADLINE_MS / 1000 - 0.1
    return max(one_call, left) + wait_ms / 1000


def store_call(method: F) -> F:
    """Every etcd failure that is about availability becomes 503 NOT_LEADER, never a 500; all
    the etcd calls of one request share one deadline (`request_budget_s`)."""

    @wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with request_deadline(request_budget_s(int(kwargs.get("wait_ms") or 0))):
                return method(*args, **kwargs)
        except EtcdUnavailable as exc:
            raise not_leader() from exc

    return wrapper  # type: ignore[return-value]


def ttl_seconds(ttl_ms: int) -> int:
    """etcd leases count whole seconds: the granted TTL is ttlMillis rounded down (≥ 1 s)."""
    return max(1, ttl_ms // 1000)
