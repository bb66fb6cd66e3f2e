"""The lock server's C3 errors, worded once for both backends so their bodies match (FR-09).

Each builder returns a `dlock.errors.ApiError`; the backend raises it.
"""

from __future__ import annotations

import uuid

from dlock.errors import ApiError, Code, validation_error

# retryAfterMillis on 409 LOCK_CONTENDED / 429: the holder's remaining lease, within these bounds.
RETRY_AFTER_MIN_MS = 50
RETRY_AFTER_MAX_MS = 1_000


def retry_after(ms_until_free: int | None) -> int:
    if ms_until_free is None:
        return RETRY_AFTER_MIN_MS
    return max(RETRY_AFTER_MIN_MS, min(RETRY_AFTER_MAX_MS, ms_until_free))


def owner_mismatch(field: str = "X-Owner-Id") -> ApiError:
    return validation_error(
        f"{field} does not own this session",
        [{"field": field, "message": "does not match the session's ownerId"}],
    )


def session_unknown(session_id: uuid.UUID) -> ApiError:
    return ApiError(Code.SESSION_UNKNOWN, "no such session", details={"sessionId": str(session_id)})


def session_expired(session_id: uuid.UUID) -> ApiError:
    return ApiError(
        Code.SESSION_EXPIRED,
        "session expired; its locks were released",
        details={"sessionId": str(session_id)},
    )


def lock_lost(key: str, stored_token: int | None) -> ApiError:
    return ApiError(
        Code.LOCK_LOST,
        "the grant named by this token has expired, was released or was revoked",
        details={"key": key, "storedToken": stored_token},
    )


def lock_contended(
    key: str, *, holder_owner_id: str, expires_at: str, ms_until_free: int | None
) -> ApiError:
    """409: `expires_at` is the holder's deadline, already formatted by `rfc3339_ms`."""
    return ApiError(
        Code.LOCK_CONTENDED,
        "lock is held by another owner",
        details={"key": key, "holderOwnerId": holder_owner_id, "expiresAt": expires_at},
        retry_after_ms=retry_after(ms_until_free),
    )


def contention_exceeded(key: str, *, cap: int, ms_until_free: int | None) -> ApiError:
    return ApiError(
        Code.CONTENTION_EXCEEDED,
        f"more than {cap} callers are already waiting for this key",
        details={"key": key, "waiterCap": cap},
        retry_after_ms=retry_after(ms_until_free),
    )


def lock_not_held(key: str) -> ApiError:
    return ApiError(Code.NOT_FOUND, "lock is not held", details={"resource": "lock", "id": key})


def expected_token_mismatch(key: str, *, expected_token: int, token: int) -> ApiError:
    return ApiError(
        Code.FENCED_OUT,
        "expectedToken is not the current grant's token",
        details={"key": key, "presentedToken": expected_token, "highestToken": token},
    )
