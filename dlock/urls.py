"""Routes every role serves, and the handlers that keep Django's HTML error pages away."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from drf_spectacular.renderers import OpenApiJsonRenderer, OpenApiYamlRenderer
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from dlock import adminpages, health, metrics
from dlock.errors import ApiError, Code
from dlock.handlers import error_response

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse


# An inline <script> without src, or an inline <style>: what a docs page's CSP must name by hash.
_INLINE = re.compile(rb"<(script|style)(?![^>]*\bsrc=)[^>]*>(.*?)</\1>", re.S | re.I)
DOCS_POLICY = (
    "default-src 'none'; script-src {scripts}; "
    # Redoc styles itself at run time (styled-components writes <style> elements): inline
    # styles are allowed, inline scripts only by hash.
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; worker-src 'self' blob:; form-action 'none'; "
    "frame-ancestors 'none'; base-uri 'none'"
)


def docs_policy(html: bytes) -> str:
    """The Content-Security-Policy of one rendered docs page: its own inline scripts by
    SHA-256 hash (Swagger UI's start-up script, Redoc's logo guard), every asset from this
    origin, nothing else."""
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'"
        for kind, body in _INLINE.findall(html)
        if kind.lower() == b"script"
    ]
    return DOCS_POLICY.format(scripts=" ".join(["'self'", *hashes]))


def with_docs_policy(view: Callable[..., Any]) -> Callable[..., Any]:
    """A docs page (Swagger UI, Redoc) with its hash-based CSP (docs/security.md)."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        if hasattr(response, "render") and not response.is_rendered:
            response.render()
        if response.get("Content-Type", "").startswith("text/html"):
            response["Content-Security-Policy"] = docs_policy(response.content)
        return response

    return wrapped


def api_docs_patterns() -> list:
    """/v1/schema (OpenAPI 3 of this role's URLconf), /v1/docs (Swagger UI), /v1/redoc, the
    two pages under a hash-based Content-Security-Policy (`with_docs_policy`).

    Their assets are served by whitenoise from the app directories."""
    title = {"TITLE": f"dlock {settings.SERVICE_NAME}"}
    return [
        path(
            "v1/schema",
            SpectacularAPIView.as_view(
                renderer_classes=[OpenApiJsonRenderer, OpenApiYamlRenderer], custom_settings=title
            ),
            name="schema",
        ),
        path(
            "v1/docs",
            with_docs_policy(
                SpectacularSwaggerView.as_view(
                    url_name="schema", title=f"dlock {settings.SERVICE_NAME} — Swagger UI"
                )
            ),
            name="swagger-ui",
        ),
        path(
            "v1/redoc",
            with_docs_policy(
                SpectacularRedocView.as_view(
                    url_name="schema",
                    title=f"dlock {settings.SERVICE_NAME} — Redoc",
                    template_name="dlock/redoc.html",
                )
            ),
            name="redoc",
        ),
    ]


def monitoring_patterns() -> list:
    """Health and metrics: every role, the admin's included."""
    return [
        path("health/live", health.live, name="health-live"),
        path("health/ready", health.ready, name="health-ready"),
        path(
            "metrics",
            csrf_exempt(require_safe(metrics.export)),
            name="prometheus-django-metrics",
        ),
    ]


def common_patterns() -> list:
    """What every role with a /v1 surface serves besides it: monitoring and its API docs."""
    return [*monitoring_patterns(), *api_docs_patterns()]


def not_found_view(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_response(ApiError(Code.NOT_FOUND, "no such resource or route"))


def bad_request_view(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_response(ApiError(Code.VALIDATION_FAILED, "bad request"))


def forbidden_view(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if adminpages.is_admin_page(request):  # a staff user without the permission: a 403 page
        return adminpages.forbidden_page(request)
    return error_response(ApiError(Code.VALIDATION_FAILED, "request rejected"))


def server_error_view(request: HttpRequest) -> HttpResponse:
    return error_response(ApiError(Code.INTERNAL, "internal error; see the service log"))


handler400 = "dlock.urls.bad_request_view"
handler403 = "dlock.urls.forbidden_view"
handler404 = "dlock.urls.not_found_view"
handler500 = "dlock.urls.server_error_view"

urlpatterns = common_patterns()
