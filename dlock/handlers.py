"""The one place a failure becomes an HTTP answer: the C3 envelope, never HTML or a stack."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.http import Http404, HttpResponse
from psycopg_pool import PoolTimeout, TooManyRequests
from rest_framework import exceptions as drf
from rest_framework.views import set_rollback

from dlock.errors import ApiError, Code, validation_error
from dlock.logs import Aggregate
from dlock.tracing import current_trace_id
from dlock.wire import JSON_CONTENT_TYPE

logger = logging.getLogger("dlock.handlers")


def envelope_headers(error: ApiError) -> dict[str, str]:
    """The headers an envelope carries besides its content type: Retry-After, per-error ones."""
    headers = dict(error.headers)
    if error.retry_after_ms is not None:
        headers["Retry-After"] = str(max(1, -(-error.retry_after_ms // 1000)))
    return headers


def error_response(error: ApiError) -> HttpResponse:
    response = HttpResponse(
        error.envelope_bytes(error.trace_id or current_trace_id()),
        status=error.status,
        content_type=JSON_CONTENT_TYPE,
    )
    # Set here, not left to CommonMiddleware: envelopes answered in front of it must not fall
    # back to chunked encoding.
    response["Content-Length"] = str(len(response.content))
    for name, value in envelope_headers(error).items():
        response[name] = value
    response.dlock_envelope = True  # type: ignore[attr-defined]  # read by the safety net
    return response


def _drf_fields(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    fields: list[dict[str, str]] = []
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if key == "non_field_errors":
                name = prefix or "body"
            fields.extend(_drf_fields(value, name))
    elif isinstance(detail, list):
        for item in detail:
            fields.extend(_drf_fields(item, prefix))
    else:
        fields.append({"field": prefix or "body", "message": str(detail)})
    return fields


_REACHABILITY_TTL_S = 1.0
_reachability: dict[str, Any] = {"at": -_REACHABILITY_TTL_S, "ok": True}
_reachability_lock = threading.Lock()


def _databases_reachable() -> bool:
    """Can a fresh connection reach every pooled database of this process? Asked only when a
    pool slot timed out; one probe per second per process at most (cached), so an overload
    does not become a connection storm against the database."""
    with _reachability_lock:
        now = time.monotonic()
        if now - _reachability["at"] < _REACHABILITY_TTL_S:
            return _reachability["ok"]
        ok = True
        for wrapper in connections.all(initialized_only=True):
            pool = getattr(wrapper, "pool", None)  # Django's psycopg pool; None if not pooled
            if pool is None:
                continue
            try:
                psycopg.connect(pool.conninfo, **{**pool.kwargs, "connect_timeout": 1}).close()
            except psycopg.Error:
                ok = False
        _reachability.update(at=time.monotonic(), ok=ok)
        return ok


def _database_error(exc: DatabaseError | InterfaceError) -> ApiError:
    """Map driver failures: deadline → 504, no pool slot → 503 OVERLOADED, unreachable → 503."""
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate in ("57014", "55P03"):  # query_canceled (statement_timeout), lock_not_available
        return ApiError(Code.DEADLINE_EXCEEDED, "database work exceeded the request deadline")
    # Django re-raises psycopg_pool's errors as django.db.OperationalError `from` the original.
    if isinstance(cause, PoolTimeout):
        # A pool whose server is gone also times out (it cannot open a connection to hand
        # out): that is an outage, not load, and alerts filter on the code.
        if not _databases_reachable():
            return ApiError(Code.NOT_LEADER, "database unreachable")
        return ApiError(Code.OVERLOADED, "no database slot within the queue deadline")
    if isinstance(cause, TooManyRequests):
        return ApiError(Code.OVERLOADED, "too many requests already waiting for a database slot")
    if sqlstate == "25006":  # read_only_sql_transaction: we are talking to a standby
        return ApiError(Code.NOT_LEADER, "database is a read-only standby")
    return ApiError(Code.NOT_LEADER, "database unreachable")


def to_api_error(exc: BaseException) -> ApiError:
    """Translate any exception into the catalogue; unknown ones become INTERNAL."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, drf.ValidationError):
        return validation_error("request failed validation", _drf_fields(exc.detail))
    if isinstance(exc, drf.MethodNotAllowed):
        return ApiError(Code.VALIDATION_FAILED, str(exc.detail), http_status=405)
    if isinstance(exc, drf.UnsupportedMediaType):
        return ApiError(
            Code.VALIDATION_FAILED,
            "Content-Type must be application/json",
            http_status=415,
        )
    if isinstance(exc, drf.NotAcceptable):
        return ApiError(Code.VALIDATION_FAILED, str(exc.detail), http_status=406)
    if isinstance(exc, drf.ParseError):
        return ApiError(Code.VALIDATION_FAILED, f"malformed request body: {exc.detail}")
    if isinstance(exc, Http404 | drf.NotFound):
        return ApiError(Code.NOT_FOUND, "no such resource or route")
    if isinstance(exc, RequestDataTooBig):
        return ApiError(Code.VALIDATION_FAILED, "request body too large", http_status=413)
    if isinstance(exc, drf.APIException) and exc.status_code < 500:
        return ApiError(Code.VALIDATION_FAILED, str(exc.detail))
    if isinstance(exc, SuspiciousOperation | PermissionDenied):
        return ApiError(Code.VALIDATION_FAILED, "request rejected")
    if isinstance(exc, OperationalError | InterfaceError):
        return _database_error(exc)
    if isinstance(exc, DatabaseError) and getattr(exc.__cause__, "sqlstate", None) in (
        "57014",
        "55P03",
        "25006",
    ):
        return _database_error(exc)
    return ApiError(Code.INTERNAL, "internal error; see the service log for this traceId")


_DEPENDENCY_FAILURES = {
    code: Aggregate("dependency_failure")
    for code in (Code.NOT_LEADER, Code.OVERLOADED, Code.DEADLINE_EXCEEDED)
}


def render_exception(exc: BaseException) -> HttpResponse:
    error = to_api_error(exc)
    if error.code is Code.INTERNAL:
        logger.error(
            "unhandled exception",
            exc_info=(type(exc), exc, exc.__traceback__),
            extra={"event": "unhandled_exception"},
        )
    elif error.code in _DEPENDENCY_FAILURES:
        # one line a second per code at most: under load a line per shed request adds load
        _DEPENDENCY_FAILURES[error.code].add(code=error.code.value, error=type(exc).__name__)
    return error_response(error)


def drf_exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse:
    """DRF EXCEPTION_HANDLER: render the envelope; roll back a request-wide transaction if one
    is configured (ATOMIC_REQUESTS — services own their transactions, which have already rolled
    back by the time an exception reaches this handler)."""
    response = render_exception(exc)
    set_rollback()
    return response
