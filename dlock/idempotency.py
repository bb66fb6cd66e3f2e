"""Idempotency for fenced commands (ARCHITECTURE §5), shared by payments and the rail proxy.

Identity is (operation, X-Idempotency-Key, fencing token). A service:
1. `lock_identity()` — serialise the requests of one identity for the transaction, so a twin in
   flight replays instead of racing the fence and reading as FENCED_OUT;
2. looks its record up (the table is the app's: its fenced SQL) and hands the stored hash to
   `check_same_request()` — a different canonical body is 422 IDEMPOTENCY_CONFLICT;
3. answers a replay with `REPLAYED_HEADER: true`; a recorded error is rebuilt by
   `recorded_error()` from its stored envelope, status and original traceId included.

The key itself is not free: on P2, P3 and rail submissions it must be the payout's own stable
key (C3 §3.1 "derived from payout_id, stable for the payout's whole life"),
`check_payout_key()` / `foreign_key_field()`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dlock.errors import ApiError, Code, validation_error

REPLAYED_HEADER = "Idempotent-Replayed"
KEY_HEADER = "X-Idempotency-Key"
FOREIGN_KEY_MESSAGE = "must be the payout's stable idempotencyKey"
CONFLICT_MESSAGE = "this X-Idempotency-Key and token were used with a different request"

# Transaction-scoped: released by the commit or rollback that ends the command.
IDENTITY_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(%(identity)s, 0))"


def request_hash(payload: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, compact separators) of `payload`."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def lock_identity(cursor: Any, *, operation: str, key: str, token: int) -> None:
    """Block until no other transaction holds this identity (paydb advisory lock)."""
    cursor.execute(IDENTITY_LOCK_SQL, {"identity": f"{operation}\x1f{key}\x1f{token}"})


def check_same_request(
    *, stored_hash: str, presented_hash: str, key: str, operation: str | None = None
) -> None:
    """422 IDEMPOTENCY_CONFLICT when the identity was recorded for a different request.

    `operation` goes into the details where the identity has several (payments: claim, post).
    """
    if stored_hash == presented_hash:
        return
    details = {"idempotencyKey": key}
    if operation is not None:
        details["operation"] = operation
    raise ApiError(Code.IDEMPOTENCY_CONFLICT, CONFLICT_MESSAGE, details=details)


def foreign_key_field(*, presented: str, stable: str) -> dict[str, str] | None:
    """The VALIDATION_FAILED field entry when `presented` is not the payout's stable key."""
    if presented == stable:
        return None
    return {"field": KEY_HEADER, "message": FOREIGN_KEY_MESSAGE}


def check_payout_key(*, presented: str, stable: str) -> None:
    """400 VALIDATION_FAILED naming X-Idempotency-Key unless it is the payout's own key."""
    field = foreign_key_field(presented=presented, stable=stable)
    if field is not None:
        raise validation_error("the request does not match the payout it names", [field])


def stored_body(value: Any) -> Any:
    """A recorded answer as a dict in its original key order (text or already decoded)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def recorded_error(status: int, body: dict[str, Any], *, replayed: bool = True) -> ApiError:
    """The ApiError of a recorded envelope; a replay carries the header and original traceId."""
    error = ApiError(
        Code(body["code"]),
        body.get("message"),
        details=body.get("details"),
        retry_after_ms=body.get("retryAfterMillis"),
        http_status=status,
        headers={REPLAYED_HEADER: "true"} if replayed else None,
    )
    if replayed:  # the original answer, for log correlation with the attempt that made it
        error.trace_id = body.get("traceId")
    return error
