"""traceId per request: from a W3C traceparent header when valid, else 32 fresh hex digits."""

from __future__ import annotations

import contextvars
import re
import secrets

_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "dlock_trace_id", default=None
)


def new_trace_id() -> str:
    return secrets.token_hex(16)


def trace_id_from_traceparent(header: str | None) -> str | None:
    if not header:
        return None
    match = _TRACEPARENT.fullmatch(header.strip().lower())
    if not match or match.group(1) == "0" * 32:
        return None
    return match.group(1)


def set_trace_id(trace_id: str | None) -> contextvars.Token:
    return _current.set(trace_id)


def reset_trace_id(token: contextvars.Token) -> None:
    _current.reset(token)


def current_trace_id() -> str:
    """The request's traceId; outside a request one is minted and kept for this context."""
    trace_id = _current.get()
    if trace_id is None:
        trace_id = new_trace_id()
        _current.set(trace_id)
    return trace_id


def traceparent(trace_id: str | None = None) -> str:
    """A traceparent header value that propagates `trace_id` to the next hop."""
    return f"00-{trace_id or current_trace_id()}-{secrets.token_hex(8)}-01"
