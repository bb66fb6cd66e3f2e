"""The one parsing seam for dlock's custom headers; runs before any database access.

`int()` would accept "4_2", "٤٢", "４２", " 42 " and "42\n"; none is a token. Leading zeros are
accepted ("0042" is 42), as Java's Long.parseLong does in T-022's token rule.
"""

from __future__ import annotations

import re

from django.http import HttpRequest

from dlock.errors import ApiError, Code, validation_error

INT64_MAX = 2**63 - 1
_TOKEN = re.compile(r"[0-9]{1,64}", re.ASCII)  # a bound on padding; the value is checked below
OWNER_ID_MAX = 64
IDEMPOTENCY_KEY_MAX = 128
# Printable ASCII, no control characters (CR/LF can never reach a log line or a header echo).
_OWNER_ID = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?", re.ASCII)
_IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9:._\-]+", re.ASCII)


def parse_token_value(raw: str | None, *, field: str = "X-Fencing-Token") -> int:
    """A fencing token: ASCII decimal digits, no sign or spaces, value 1 … 2**63-1. Never
    coerced to 0."""
    if raw is None or raw == "":
        raise ApiError(Code.INVALID_TOKEN, f"{field} is required", details={"field": field})
    if not _TOKEN.fullmatch(raw) or not 0 < int(raw) <= INT64_MAX:
        raise ApiError(
            Code.INVALID_TOKEN,
            f"{field} must be a decimal int64 greater than 0",
            details={"field": field},
        )
    return int(raw)


def fencing_token(request: HttpRequest) -> int:
    return parse_token_value(request.META.get("HTTP_X_FENCING_TOKEN"))


def owner_id(request: HttpRequest, *, fallback: str | None = None) -> str:
    """X-Owner-Id (or `fallback`, e.g. a body field): 1…64 printable ASCII characters."""
    raw = request.META.get("HTTP_X_OWNER_ID")
    if raw is None or raw == "":
        raw = fallback
    return validate_owner_id(raw, field="X-Owner-Id")


def validate_owner_id(raw: object, *, field: str = "ownerId") -> str:
    if raw is None or raw == "":
        raise validation_error(f"{field} is required", [{"field": field, "message": "required"}])
    if not isinstance(raw, str):
        raise validation_error(f"{field} must be a string", [{"field": field, "message": "string"}])
    if len(raw) > OWNER_ID_MAX:
        raise validation_error(
            f"{field} is longer than {OWNER_ID_MAX} characters",
            [{"field": field, "message": f"at most {OWNER_ID_MAX} characters"}],
        )
    if not _OWNER_ID.fullmatch(raw):
        raise validation_error(
            f"{field} must be printable ASCII",
            [{"field": field, "message": "printable ASCII, no leading/trailing space"}],
        )
    return raw


def idempotency_key(request: HttpRequest) -> str:
    """X-Idempotency-Key: 1…128 characters of [A-Za-z0-9:._-]."""
    field = "X-Idempotency-Key"
    raw = request.META.get("HTTP_X_IDEMPOTENCY_KEY")
    if raw is None or raw == "":
        raise validation_error(f"{field} is required", [{"field": field, "message": "required"}])
    if len(raw) > IDEMPOTENCY_KEY_MAX or not _IDEMPOTENCY_KEY.fullmatch(raw):
        raise validation_error(
            f"{field} must be 1…{IDEMPOTENCY_KEY_MAX} characters of [A-Za-z0-9:._-]",
            [{"field": field, "message": f"1…{IDEMPOTENCY_KEY_MAX} of [A-Za-z0-9:._-]"}],
        )
    return raw
