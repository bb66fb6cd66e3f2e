"""The one error vocabulary: C3 §3.2 codes plus the four ARCHITECTURE §6 additions.

`CATALOGUE` is the single exhaustive table code → (HTTP status, retrySafe, retryAfterMillis?).
Adding a code without a row fails at import time.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any


class Code(enum.StrEnum):
    LOCK_CONTENDED = "LOCK_CONTENDED"
    CONTENTION_EXCEEDED = "CONTENTION_EXCEEDED"
    NOT_LEADER = "NOT_LEADER"
    LOCK_LOST = "LOCK_LOST"
    SESSION_UNKNOWN = "SESSION_UNKNOWN"
    SESSION_EXPIRED = "SESSION_EXPIRED"
    INVALID_TOKEN = "INVALID_TOKEN"  # noqa: S105 - an error code, not a secret
    FENCED_OUT = "FENCED_OUT"
    PAYOUT_NOT_CLAIMABLE = "PAYOUT_NOT_CLAIMABLE"
    DUPLICATE_SUBMISSION = "DUPLICATE_SUBMISSION"
    INSUFFICIENT_FUNDS = "INSUFFICIENT_FUNDS"
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    RAIL_UNAVAILABLE = "RAIL_UNAVAILABLE"
    RAIL_AMBIGUOUS = "RAIL_AMBIGUOUS"
    VALIDATION_FAILED = "VALIDATION_FAILED"
    # ARCHITECTURE §6 additions (docs/contracts/CHANGELOG.md)
    NOT_FOUND = "NOT_FOUND"
    OVERLOADED = "OVERLOADED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    INTERNAL = "INTERNAL"
    # Caller credentials, ARCHITECTURE decision 14 (CHANGELOG)
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    # Answered by the proxy in front of a role, ARCHITECTURE decision 18 (CHANGELOG): the request
    # was forwarded to the role and no complete answer came back, so its outcome is unknown.
    UPSTREAM_TIMEOUT = "UPSTREAM_TIMEOUT"
    UPSTREAM_FAILED = "UPSTREAM_FAILED"


@dataclass(frozen=True)
class CodeSpec:
    status: int
    retry_safe: bool
    retry_after: bool  # the envelope carries retryAfterMillis
    default_retry_after_ms: int | None = None


CATALOGUE: dict[Code, CodeSpec] = {
    Code.LOCK_CONTENDED: CodeSpec(409, True, True, 100),
    Code.CONTENTION_EXCEEDED: CodeSpec(429, True, True, 1_000),
    Code.NOT_LEADER: CodeSpec(503, True, True, 1_000),
    Code.LOCK_LOST: CodeSpec(409, False, False),
    Code.SESSION_UNKNOWN: CodeSpec(404, False, False),
    Code.SESSION_EXPIRED: CodeSpec(410, False, False),
    Code.INVALID_TOKEN: CodeSpec(400, False, False),
    Code.FENCED_OUT: CodeSpec(409, False, False),
    Code.PAYOUT_NOT_CLAIMABLE: CodeSpec(409, False, False),
    Code.DUPLICATE_SUBMISSION: CodeSpec(409, False, False),
    Code.INSUFFICIENT_FUNDS: CodeSpec(422, False, False),
    Code.IDEMPOTENCY_CONFLICT: CodeSpec(422, False, False),
    Code.RAIL_UNAVAILABLE: CodeSpec(503, True, True, 1_000),
    Code.RAIL_AMBIGUOUS: CodeSpec(409, False, False),
    Code.VALIDATION_FAILED: CodeSpec(400, False, False),
    Code.NOT_FOUND: CodeSpec(404, False, False),
    Code.OVERLOADED: CodeSpec(503, True, True, 500),
    Code.DEADLINE_EXCEEDED: CodeSpec(504, True, False),
    Code.INTERNAL: CodeSpec(500, False, False),
    Code.UNAUTHENTICATED: CodeSpec(401, False, False),
    Code.FORBIDDEN: CodeSpec(403, False, False),
    Code.UPSTREAM_TIMEOUT: CodeSpec(504, False, False),
    Code.UPSTREAM_FAILED: CodeSpec(502, False, False),
}

if set(CATALOGUE) != set(Code):  # pragma: no cover - a new code without a row must not ship
    raise RuntimeError(f"error catalogue incomplete: {set(Code) - set(CATALOGUE)}")

# Protocol-level rejections keep their HTTP status and say VALIDATION_FAILED (CHANGELOG row 6;
# 408 and 501: the hardening row; 414 and 431: answered by the proxy, the serving row).
PROTOCOL_STATUSES = frozenset({405, 406, 408, 411, 413, 414, 415, 431, 501})

# Every other status a code may answer besides its catalogue row; each entry is a CHANGELOG row.
STATUS_OVERRIDES: dict[Code, frozenset[int]] = {
    # A rail decline: C3 §3.5 "422 REJECTED→VALIDATION_FAILED" (CHANGELOG row 8).
    Code.VALIDATION_FAILED: PROTOCOL_STATUSES | {422},
    # The admin role's proxy limits log-in attempts per client address (CHANGELOG row 86).
    Code.OVERLOADED: frozenset({429}),
}


def allowed_statuses(code: Code) -> frozenset[int]:
    """The HTTP statuses `code` may be answered with: its catalogue row plus its overrides."""
    return frozenset({CATALOGUE[code].status}) | STATUS_OVERRIDES.get(code, frozenset())


class ApiError(Exception):
    """A typed failure: one C3 code, a human message, optional per-code details."""

    def __init__(
        self,
        code: Code,
        message: str | None = None,
        *,
        details: dict[str, Any] | None = None,
        retry_after_ms: int | None = None,
        http_status: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.code = Code(code)
        self.message = message or self.code.value.replace("_", " ").lower()
        if self.code is Code.VALIDATION_FAILED and not (details and "fields" in details):
            # C3 3.2: VALIDATION_FAILED always has details.fields[]; a rejection that is about
            # the request as a whole (malformed JSON, a protocol status) names "request".
            details = {**(details or {}), "fields": [{"field": "request", "message": self.message}]}
        self.details = details
        spec = CATALOGUE[self.code]
        self.retry_after_ms: int | None = None
        if spec.retry_after:
            chosen = retry_after_ms if retry_after_ms is not None else spec.default_retry_after_ms
            self.retry_after_ms = int(chosen or 0)
        if http_status is not None and http_status not in allowed_statuses(self.code):
            raise ValueError(f"{self.code} is never answered with HTTP {http_status}")
        self.status = http_status or spec.status
        self.headers = headers or {}
        # Set only when replaying a recorded answer: render it with its original traceId.
        self.trace_id: str | None = None
        super().__init__(f"{self.code}: {self.message}")

    @property
    def retry_safe(self) -> bool:
        return CATALOGUE[self.code].retry_safe

    def envelope_bytes(self, trace_id: str) -> bytes:
        """The envelope as sent on the wire: compact JSON."""
        return json.dumps(self.envelope(trace_id), separators=(",", ":")).encode()

    def envelope(self, trace_id: str) -> dict[str, Any]:
        """The C3 envelope: code, message, retrySafe, retryAfterMillis?, details?, traceId."""
        body: dict[str, Any] = {
            "code": self.code.value,
            "message": self.message,
            "retrySafe": self.retry_safe,
        }
        if self.retry_after_ms is not None:
            body["retryAfterMillis"] = self.retry_after_ms
        if self.details:
            body["details"] = self.details
        body["traceId"] = trace_id
        return body


def validation_error(message: str, fields: list[dict[str, str]] | None = None) -> ApiError:
    """VALIDATION_FAILED with details.fields[] of {field, message}."""
    return ApiError(Code.VALIDATION_FAILED, message, details={"fields": fields} if fields else None)


def not_found(what: str, ident: str | None = None) -> ApiError:
    details = {"resource": what, "id": ident} if ident is not None else {"resource": what}
    return ApiError(Code.NOT_FOUND, f"{what} not found", details=details)


def payout_not_claimable(
    *,
    payout_id: str,
    state: str | None,
    expected_states: tuple[str, ...] | list[str],
    claim_token: int | None,
    presented_token: int | None,
    message: str | None = None,
) -> ApiError:
    """409 PAYOUT_NOT_CLAIMABLE with its one details shape, wherever a payout refuses a move:
    payoutId, state (now), expectedStates, claimToken (now), presentedToken (None: no token)."""
    expected = list(expected_states)
    return ApiError(
        Code.PAYOUT_NOT_CLAIMABLE,
        message or f"payout is {state}; this transition needs {' or '.join(expected)}",
        details={
            "payoutId": payout_id,
            "state": state,
            "expectedStates": expected,
            "claimToken": claim_token,
            "presentedToken": presented_token,
        },
    )
