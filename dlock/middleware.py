"""Request plumbing shared by every role: traceId, request guards, credentials, the envelope
safety net; in two layers (settings.base.MIDDLEWARE), each one call per request: EdgeMiddleware
outermost, ApiMiddleware innermost. Request metrics are django-prometheus' middlewares around
them; the page middlewares (sessions, CSRF, auth, ...) exist only in the admin role's list
(settings/admin.py) and the ops overlay's, between the two."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost, PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.middleware.security import SecurityMiddleware

from dlock import adminpages, auth
from dlock.errors import PROTOCOL_STATUSES, ApiError, Code
from dlock.handlers import error_response, render_exception
from dlock.logs import hosts_refused
from dlock.parsers import too_large
from dlock.tracing import new_trace_id, reset_trace_id, set_trace_id, trace_id_from_traceparent
from dlock.wire import JSON_SECURITY_HEADERS, KNOWN_METHODS, MONITORING_PATHS, SECURITY_HEADERS

GetResponse = Callable[[HttpRequest], HttpResponse]


def secure_headers(response: HttpResponse) -> HttpResponse:
    """Outermost, so envelopes built by any later layer get the headers too."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if response.get("Content-Type", "").startswith("application/json"):
        for name, value in JSON_SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
    return response


def refusal(request: HttpRequest) -> HttpResponse | None:
    """What no view should see, answered at once: a Host outside ALLOWED_HOSTS, bodies we would
    have to buffer blindly, NUL characters in the path or query; before any view or database
    work. None: the request may go on.

    The role's proxy (deploy/nginx/) refuses most of it first, and alone owns what needs the
    connection: a missing Host on HTTP/1.1, an absolute-form target naming another host, the
    monitoring listener's paths. What stays here is what holds for every caller of the app,
    the test client and runserver included."""
    try:
        request.get_host()  # Django's ALLOWED_HOSTS check (CommonMiddleware's, where listed)
    except DisallowedHost:
        host = "this server does not answer for that Host"
        hosts_refused.add()  # a client's mistake: counted, never a line per request
        return error_response(
            ApiError(
                Code.VALIDATION_FAILED,
                host,
                details={"fields": [{"field": "Host", "message": host}]},
            )
        )
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
    return None


def _monitoring_host(request: HttpRequest) -> None:
    """Kubelet probes and Prometheus address a pod by its IP (Host = `<pod IP>:<port>`), which no
    ALLOWED_HOSTS lists: `/health/*` and `/metrics` answer whatever the Host (the role's proxy
    forwards them from any Host; no cookie, no link, no user data there), so their Host is
    replaced by the role's first listed name before anything (CommonMiddleware) checks it."""
    names = [h.lstrip(".") for h in settings.ALLOWED_HOSTS if h and h != "*"]
    if names:
        request.META["HTTP_HOST"] = names[0]


class EdgeMiddleware:
    """Outermost: what every request gets, in this order (one layer instead of five):

    1. traceId from `traceparent` or fresh, in a context variable for every log line; a probe's
       or scrape's Host made one of the role's names (`_monitoring_host`);
    2. 501 for a method no dlock view implements, before django-prometheus' labelled metrics
       (dlock.prometheus.AfterMiddleware, innermost) see it: no client-chosen method is a label
       (behind the role's proxy such methods are 405 there already; this covers runserver, the
       test client and a role run bare);
    3. Django's SecurityMiddleware (its request and response steps, same settings), unless the
       role lists the stock one in MIDDLEWARE itself (the admin's stock list);
    4. the request guards (`refusal`), Django's ALLOWED_HOSTS check among them;
    and on the way out Content-Length and the security headers of every answer
    (`secure_headers`), so envelopes built by any later layer get them too. (Host check and
    Content-Length are CommonMiddleware's two jobs a role with a /v1 surface needs; the admin's
    stock list runs CommonMiddleware itself as well.)
    """

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response
        stock = "django.middleware.security.SecurityMiddleware" in settings.MIDDLEWARE
        self.security = None if stock else SecurityMiddleware(get_response)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        trace_id = trace_id_from_traceparent(request.META.get("HTTP_TRACEPARENT")) or (
            new_trace_id()
        )
        request.trace_id = trace_id  # type: ignore[attr-defined]  # per-request attribute
        token = set_trace_id(trace_id)
        try:
            if request.method not in KNOWN_METHODS:
                return secure_headers(
                    error_response(
                        ApiError(Code.VALIDATION_FAILED, "method not implemented", http_status=501)
                    )
                )
            if request.path_info in MONITORING_PATHS:
                _monitoring_host(request)
            security = self.security
            response = (security and security.process_request(request)) or refusal(request)
            if response is None:
                response = self.get_response(request)
            if security is not None:
                response = security.process_response(request, response)
        finally:
            reset_trace_id(token)
        if not response.streaming and not response.has_header("Content-Length"):
            response.headers["Content-Length"] = str(len(response.content))
        return secure_headers(response)


def _is_human_page(request: HttpRequest, response: HttpResponse) -> bool:
    return (
        request.path.startswith(("/admin/", "/v1/docs", "/v1/redoc")) and response.status_code < 500
    )


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


class ApiMiddleware:
    """Innermost of dlock's layers: the credential check and the envelope safety net.

    * every /v1 route but the docs needs a credential with its scope, in process_view (the
      route is resolved, so the scope is the route's, not a path guess; an unknown route stays
      404); the rail stub stands in for a third party and stays open;
    * any non-2xx that is not already the envelope becomes one (404, 405, 400, 500), and an
      exception a view raised is rendered as one.
    """

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response
        self.check_credentials = settings.ROLE != "railstub"

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code < 400 or getattr(response, "dlock_envelope", False):
            return response
        if _is_human_page(request, response):
            return response
        return error_response(envelope_for_status(response.status_code, response))

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse:
        if isinstance(exc, PermissionDenied) and adminpages.is_admin_page(request):
            return adminpages.forbidden_page(request)  # staff without the permission: a page
        return render_exception(exc)

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., HttpResponse],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponse | None:
        if not self.check_credentials:
            return None
        scope = auth.required_scope(request)
        if scope is None:
            return None
        try:
            principal = auth.authenticate(request)
        except ApiError as error:
            response = error_response(error)
            response["WWW-Authenticate"] = auth.CHALLENGE
            return response
        if not auth.permits(request, principal, scope):
            return error_response(
                ApiError(
                    Code.FORBIDDEN,
                    f"this credential lacks the {scope} scope",
                    details={"requiredScope": scope},
                )
            )
        request.dlock_principal = principal  # type: ignore[attr-defined]  # per-request attribute
        return None
