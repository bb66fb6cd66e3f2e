"""Request plumbing shared by every role: traceId, request guards, the envelope safety net."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from dlock.errors import PROTOCOL_STATUSES, ApiError, Code
from dlock.handlers import error_response, render_exception
from dlock.parsers import too_large
from dlock.tracing import new_trace_id, reset_trace_id, set_trace_id, trace_id_from_traceparent
from dlock.wire import JSON_SECURITY_HEADERS, SECURITY_HEADERS


class TraceMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        trace_id = trace_id_from_traceparent(request.headers.get("traceparent")) or new_trace_id()
        request.trace_id = trace_id
        token = set_trace_id(trace_id)
        try:
            response = self.get_response(request)
        finally:
            reset_trace_id(token)
        return secure_headers(response)


def secure_headers(response: HttpResponse) -> HttpResponse:
    """Outermost, so envelopes built by any later layer get the headers too."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if response.get("Content-Type", "").startswith("application/json"):
        for name, value in JSON_SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
    return response


MONITORING_PATHS = frozenset({"/metrics", "/health/live", "/health/ready"})


def _local_port(request: HttpRequest) -> int | None:
    """The port the connection arrived on (from the socket, never from the Host header)."""
    sock = request.META.get("gunicorn.socket")
    try:
        return sock.getsockname()[1] if sock is not None else None
    except (OSError, IndexError, TypeError):
        return None


class RequestGuardMiddleware:
    """Refuse what no view should see: bodies we would have to buffer blindly, NUL characters in
    the path or query; before any view or database work."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if settings.METRICS_PORT and request.path not in MONITORING_PATHS:
            if _local_port(request) == settings.METRICS_PORT:
                return error_response(ApiError(Code.NOT_FOUND, "no such resource or route"))
        for part, value in (
            ("path", request.path),
            ("query", request.META.get("QUERY_STRING", "")),
        ):
            # PostgreSQL text cannot hold NUL: refuse it here, not as a driver error later.
            if "\x00" in value or "%00" in value:
                return error_response(
                    ApiError(
                        Code.VALIDATION_FAILED,
                        f"the {part} contains a NUL character",
                        details={"fields": [{"field": part, "message": "NUL is not allowed"}]},
                    )
                )
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if request.META.get("HTTP_TRANSFER_ENCODING", "").lower() not in ("", "identity"):
            return error_response(
                ApiError(
                    Code.VALIDATION_FAILED,
                    "chunked request bodies are not accepted; send Content-Length",
                    http_status=411,
                )
            )
        raw_length = request.META.get("CONTENT_LENGTH") or "0"
        if not raw_length.isdigit():
            return error_response(ApiError(Code.VALIDATION_FAILED, "invalid Content-Length"))
        if int(raw_length) > limit:
            return error_response(too_large(limit))
        return self.get_response(request)


def _is_human_page(request: HttpRequest, response: HttpResponse) -> bool:
    return (
        request.path.startswith(("/admin/", "/v1/docs", "/v1/redoc")) and response.status_code < 500
    )


class EnvelopeMiddleware:
    """Safety net: any non-2xx that is not already the envelope becomes one (404, 405, 400, 500)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code < 400 or getattr(response, "dlock_envelope", False):
            return response
        if _is_human_page(request, response):
            return response
        return error_response(envelope_for_status(response.status_code, response))

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse:
        return render_exception(exc)


def envelope_for_status(status: int, response: HttpResponse | None = None) -> ApiError:
    if status == 404:
        return ApiError(Code.NOT_FOUND, "no such resource or route")
    if status in PROTOCOL_STATUSES:
        error = ApiError(Code.VALIDATION_FAILED, f"HTTP {status}", http_status=status)
        if status == 405 and response is not None and response.has_header("Allow"):
            error.headers["Allow"] = response["Allow"]
        return error
    if status < 500:
        return ApiError(Code.VALIDATION_FAILED, "request rejected")
    return ApiError(Code.INTERNAL, "internal error; see the service log for this traceId")
