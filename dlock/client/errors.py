"""The client's exception for every code of the one catalogue (dlock.errors), and the map.

`ERRORS` maps each C3 code to its exception class. `check_error_map()` runs at import: a code
added to `dlock.errors.Code` without a client exception here fails the import, so a new server
code can never reach a caller as an untyped error.

`PROXY_ERRORS` are the codes the reverse proxy in front of every role answers on its own
(ARCHITECTURE decision 18): `UPSTREAM_TIMEOUT` (504: the proxy forwarded the request and its
upstream read timed out) is "sent, outcome unknown", exactly as a read timeout of our own — a
`ServiceUnreachable` with `sent=True`, never failed over, never re-sent; so is a 502 with
`retrySafe:false` (the upstream failed after the request went in). A 503 OVERLOADED from the
proxy (it could not connect upstream: nothing was forwarded) is the catalogue's Overloaded.
"""

from __future__ import annotations

from typing import Any

from dlock.errors import CATALOGUE, Code
from dlock.http import Reply


def _catalogue_retry_safe(code: str | None) -> bool:
    """The C3 §3.2 verdict from the one catalogue (dlock.errors); unknown codes fail closed."""
    return code is not None and code in Code.__members__ and CATALOGUE[Code(code)].retry_safe


class DlockError(Exception):
    """A C3 error envelope (or a local verdict) as an exception: code, retrySafe, details."""

    code: str | None = None
    # The service whose endpoint list raised it (`Endpoints.name`), when one did.
    peer: str | None = None

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


class Unauthenticated(DlockError):
    """UNAUTHENTICATED: no credential, or one the server does not know (DLOCK_*_CREDENTIAL)."""

    code = "UNAUTHENTICATED"


class Forbidden(DlockError):
    """FORBIDDEN: the credential is known but lacks the scope, or the session is another's."""

    code = "FORBIDDEN"


class ServiceUnreachable(DlockError):
    """No HTTP response at all; `sent` is False only when nothing reached the server."""

    def __init__(self, message: str, *, sent: bool, **kwargs: Any) -> None:
        self.sent = sent
        super().__init__(message, retry_safe=not sent, **kwargs)


class ProxyAnswered(ServiceUnreachable):
    """The reverse proxy in front of the role forwarded the request and no usable answer came
    back: sent, outcome unknown (a rail submission: ambiguous), whatever retrySafe it carries."""

    def __init__(self, message: str = "", **kwargs: Any) -> None:
        kwargs.pop("retry_safe", None)
        super().__init__(message, sent=True, **kwargs)


class UpstreamTimeout(ProxyAnswered):
    """UPSTREAM_TIMEOUT: the proxy gave up waiting for the role; the server may have acted."""

    code = "UPSTREAM_TIMEOUT"


class UpstreamFailed(ProxyAnswered):
    """UPSTREAM_FAILED: the role's answer was cut or malformed; the server may have acted."""

    code = "UPSTREAM_FAILED"


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
        Unauthenticated,
        Forbidden,
        UpstreamTimeout,
        UpstreamFailed,
    )
    if cls.code
}

# The part of ERRORS the reverse proxy answers itself (decision 18), not a role's views.
PROXY_ERRORS: dict[str, type[DlockError]] = {
    code: cls for code, cls in ERRORS.items() if issubclass(cls, ProxyAnswered)
}


def check_error_map(errors: dict[str, type[DlockError]] = ERRORS) -> None:
    """Raise RuntimeError unless `errors` has one exception class for every catalogue code."""
    missing = sorted(code.value for code in Code if code.value not in errors)
    unknown = sorted(code for code in errors if code not in Code.__members__)
    wrong = sorted(code for code, cls in errors.items() if cls.code != code)
    if missing or unknown or wrong:
        raise RuntimeError(
            f"dlock.client error map out of step with dlock.errors: missing={missing} "
            f"unknown={unknown} mismatched={wrong}"
        )


check_error_map()


def error_from_reply(reply: Reply) -> DlockError:
    """Map a non-2xx reply to its typed exception; a body without a code is INTERNAL."""
    body = reply.body if isinstance(reply.body, dict) else {}
    code = body.get("code")
    cls = ERRORS.get(code, DlockError) if isinstance(code, str) else InternalError
    retry_safe = bool(body.get("retrySafe", False))
    if reply.status == 502 and not retry_safe and not issubclass(cls, ServiceUnreachable):
        # The proxy's upstream failed after the request went in (reset, bad answer): unknown.
        return ServiceUnreachable(
            str(body.get("message") or "HTTP 502"),
            sent=True,
            code=code if isinstance(code, str) else "INTERNAL",
            details=body.get("details") if isinstance(body.get("details"), dict) else None,
            status=reply.status,
            trace_id=body.get("traceId"),
        )
    return cls(
        str(body.get("message") or f"HTTP {reply.status}"),
        code=code if isinstance(code, str) else "INTERNAL",
        retry_safe=retry_safe,
        details=body.get("details") if isinstance(body.get("details"), dict) else None,
        retry_after_ms=body.get("retryAfterMillis"),
        status=reply.status,
        trace_id=body.get("traceId"),
    )
