"""A JSON parser that refuses what Python's json module would quietly accept.

Rejected as VALIDATION_FAILED: NaN/Infinity, duplicate keys, nesting deeper than
DLOCK_MAX_JSON_DEPTH, invalid UTF-8, a top level that is not an object; a body over
DATA_UPLOAD_MAX_MEMORY_SIZE is VALIDATION_FAILED with HTTP 413 (DRF reads the stream itself,
so Django's own limit never fires for DRF views).
"""

from __future__ import annotations

import json
from typing import IO, TYPE_CHECKING, Any

from django.conf import settings
from rest_framework.parsers import BaseParser

from dlock.errors import ApiError, Code

if TYPE_CHECKING:
    from collections.abc import Mapping


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _depth_exceeds(raw: str, limit: int) -> bool:
    """Bracket depth outside strings; checked before json.loads so deep input can't recurse."""
    depth = 0
    in_string = escaped = False
    for ch in raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def too_large(limit: int) -> ApiError:
    return ApiError(
        Code.VALIDATION_FAILED,
        f"request body exceeds {limit} bytes",
        details={"fields": [{"field": "body", "message": f"at most {limit} bytes"}]},
        http_status=413,
    )


def loads_strict(data: bytes) -> dict[str, Any]:
    """Decode one JSON object strictly or raise ApiError(VALIDATION_FAILED)."""
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(Code.VALIDATION_FAILED, "request body is not valid UTF-8") from None
    if _depth_exceeds(raw, settings.DLOCK_MAX_JSON_DEPTH):
        raise ApiError(
            Code.VALIDATION_FAILED,
            f"JSON nesting deeper than {settings.DLOCK_MAX_JSON_DEPTH}",
        )
    try:
        value = json.loads(raw, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:
        raise ApiError(Code.VALIDATION_FAILED, f"malformed JSON body: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(Code.VALIDATION_FAILED, "request body must be a JSON object")
    return value


class StrictJSONParser(BaseParser):
    media_type = "application/json"

    def parse(
        self,
        stream: IO[Any] | None,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        data = stream.read(limit + 1) if stream is not None else b""
        if len(data) > limit:
            raise too_large(limit)
        if not data.strip():
            return {}
        return loads_strict(data)
