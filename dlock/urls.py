"""Routes every role serves, and the handlers that keep Django's HTML error pages away."""

from __future__ import annotations

from typing import TYPE_CHECKING

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


def api_docs_patterns() -> list:
    """/v1/schema (OpenAPI 3 of this role's URLconf), /v1/docs (Swagger UI), /v1/redoc.

    Their assets (and the admin's) are served by whitenoise from the app directories."""
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
            SpectacularSwaggerView.as_view(
                url_name="schema", title=f"dlock {settings.SERVICE_NAME} — Swagger UI"
            ),
            name="swagger-ui",
        ),
        path(
            "v1/redoc",
            SpectacularRedocView.as_view(
                url_name="schema",
                title=f"dlock {settings.SERVICE_NAME} — Redoc",
                template_name="dlock/redoc.html",
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
