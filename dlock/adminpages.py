"""The staff admin's refusals as admin pages, and its login audit trail (docs/security.md
"Admin hardening").

* `forbidden_page`: a staff user without the permission for an admin page gets a 403 page in the
  admin's look (dlock.urls.forbidden_view sends admin paths here; /v1 keeps the C3 envelope).
* `locked_out_page`: django-axes' lockout answer (settings AXES_LOCKOUT_CALLABLE): 429 and a page
  saying why and how long, never the login form again.
* `connect_audit_log`: one JSON line per admin log-in, failed log-in and lockout (events
  `admin_login`, `admin_login_failed`, `admin_locked_out`), through dlock.logs like every event;
  never the password (Django cleanses it before the signal); and the counters
  `admin_login_failed_total` and `admin_lockouts_total` (no label: never a name or an address).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.template.response import TemplateResponse

from dlock import metrics
from dlock.logs import log_event

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

ADMIN_PREFIX = "/admin/"


def _axes(name: str) -> Any:
    """A django-axes setting: they exist in the admin role's settings only (settings/admin.py)."""
    return getattr(settings, name)


def is_admin_page(request: HttpRequest) -> bool:
    return request.path_info.startswith(ADMIN_PREFIX) and "django.contrib.admin" in (
        settings.INSTALLED_APPS
    )


def _admin_context(request: HttpRequest) -> dict[str, Any]:
    from django.contrib import admin

    return admin.site.each_context(request)


def forbidden_page(request: HttpRequest) -> HttpResponse:
    response = TemplateResponse(
        request, "dlock/admin_403.html", _admin_context(request), status=403
    )
    return response.render()


def locked_out_page(
    request: HttpRequest, response: HttpResponse | None = None, credentials: dict | None = None
) -> HttpResponse:
    from axes.helpers import get_client_username, get_cool_off, get_failure_limit

    cool_off = get_cool_off(request)
    context = {
        **_admin_context(request),
        "title": "Too many failed log-ins",
        "failure_limit": get_failure_limit(request, credentials),
        "username": get_client_username(request, credentials) or "",
        "cooloff_minutes": int(cool_off.total_seconds() // 60) if cool_off else None,
    }
    page = TemplateResponse(
        request, "dlock/admin_locked_out.html", context, status=_axes("AXES_HTTP_RESPONSE_CODE")
    )
    return page.render()


def client_ip(request: HttpRequest) -> str:
    """The client's address: the role's proxy sets X-Forwarded-For to it (a client's own copy
    is replaced, never passed on); behind its unix socket REMOTE_ADDR is empty. Also django-axes'
    AXES_CLIENT_IP_CALLABLE."""
    return request.META.get("HTTP_X_FORWARDED_FOR") or request.META.get("REMOTE_ADDR") or ""


def _client(request: HttpRequest | None) -> dict[str, Any]:
    if request is None:
        return {}
    return {
        "clientIp": client_ip(request),
        "path": request.path_info,
        "userAgent": request.META.get("HTTP_USER_AGENT", "")[:200],
    }


def _on_login(sender: Any, request: HttpRequest | None = None, user: Any = None, **_: Any) -> None:
    log_event("admin_login", username=getattr(user, "username", ""), **_client(request))


def _on_login_failed(
    sender: Any, credentials: dict | None = None, request: HttpRequest | None = None, **_: Any
) -> None:
    username = str((credentials or {}).get("username", ""))[:150]
    metrics.admin_login_failed.inc()
    log_event("admin_login_failed", level=logging.WARNING, username=username, **_client(request))


def _on_locked_out(
    sender: Any, request: HttpRequest | None = None, username: str | None = None, **_: Any
) -> None:
    metrics.admin_lockouts.inc()
    log_event(
        "admin_locked_out",
        level=logging.WARNING,
        username=str(username or "")[:150],
        failureLimit=_axes("AXES_FAILURE_LIMIT"),
        **_client(request),
    )


def connect_audit_log() -> None:
    """Called once at start-up (dlock.apps) where django-axes is installed (ROLE=admin)."""
    from axes.signals import user_locked_out
    from django.contrib.auth.signals import user_logged_in, user_login_failed

    user_logged_in.connect(_on_login, dispatch_uid="dlock.admin_login")
    user_login_failed.connect(_on_login_failed, dispatch_uid="dlock.admin_login_failed")
    user_locked_out.connect(_on_locked_out, dispatch_uid="dlock.admin_locked_out")
