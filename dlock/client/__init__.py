"""dlock's lock client: sessions, grants with fencing tokens, and a lock that knows it was lost.

    client = LockClient("http://127.0.0.1:8081,http://127.0.0.1:8181", owner_id="worker-7")
    with client.session(ttl_ms=10_000) as session:
        with session.lock("payout:acc-42", ttl_ms=10_000, wait_ms=2_000) as grant:
            grant.ensure_valid()                     # before every protected write
            write(..., fencing_token=grant.token)

`session.lock()` raises instead of entering the block without the lock. A grant carries its
fencing token and a monotonic local deadline (TTL × (1 − 0.30)); `ensure_valid()` raises
`LockLost` past it, after a failed heartbeat, or once the server said the grant is gone. The
deadline is advisory protection for the caller: the fenced write at the resource is the
authority. Retry policy, clock and sleep are injected, as in kazoo, so tests control time.

The base URL may be a comma-separated list of lock-server replicas: a call moves to the next one
only when the outcome proves it changed nothing (`dlock.client.transport`).

Modules: `errors` (one exception per catalogue code, checked at import), `transport` (one
exchange, endpoint failover), `retry` (bounded jittered retry), `grant` (a held lock), `lock`
(sessions and the client).
"""

from __future__ import annotations

from dlock.client.errors import (
    ERRORS,
    PROXY_ERRORS,
    ContentionExceeded,
    DeadlineExceeded,
    DlockError,
    DuplicateSubmission,
    FencedOut,
    Forbidden,
    IdempotencyConflict,
    InsufficientFunds,
    InternalError,
    InvalidToken,
    LockContended,
    LockLost,
    NotFound,
    NotLeader,
    Overloaded,
    PayoutNotClaimable,
    RailAmbiguous,
    RailUnavailable,
    ServiceUnreachable,
    SessionExpired,
    SessionUnknown,
    Unauthenticated,
    UpstreamFailed,
    UpstreamTimeout,
    ValidationFailed,
    check_error_map,
    error_from_reply,
)
from dlock.client.grant import Grant
from dlock.client.lock import LockClient, LockSession
from dlock.client.retry import RETRY_SAFE_LOCK_ERRORS, RetryPolicy, retry_delay_s
from dlock.client.transport import Endpoints, call, changed_nothing, parse_endpoints

__all__ = [
    "ERRORS",
    "PROXY_ERRORS",
    "RETRY_SAFE_LOCK_ERRORS",
    "ContentionExceeded",
    "DeadlineExceeded",
    "DlockError",
    "DuplicateSubmission",
    "Endpoints",
    "FencedOut",
    "Forbidden",
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
    "Unauthenticated",
    "UpstreamFailed",
    "UpstreamTimeout",
    "ValidationFailed",
    "call",
    "changed_nothing",
    "check_error_map",
    "error_from_reply",
    "parse_endpoints",
    "retry_delay_s",
]
