"""RFC 3339 UTC with exactly milliseconds: 2026-11-30T09:00:00.123Z."""

from __future__ import annotations

import datetime as dt


def rfc3339_ms(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetime has no place on the wire")
    value = value.astimezone(dt.UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
