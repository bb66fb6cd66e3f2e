"""Liveness touches nothing; readiness makes a real round trip to each of the role's stores."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connections
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from dlock.errors import ApiError, Code
from dlock.handlers import error_response
from dlock.rendering import json_response

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

_extra_checks: dict[str, Callable[[], None]] = {}


def register_readiness_check(name: str, check: Callable[[], None]) -> None:
    """`check` raises on failure; e.g. the etcd lock backend registers a cluster round trip."""
    _extra_checks[name] = check


def _database_check(alias: str) -> Callable[[], None]:
    def check() -> None:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    return check


@csrf_exempt
@require_safe
def live(request: HttpRequest) -> HttpResponse:
    return json_response({"status": "UP", "service": settings.SERVICE_NAME})


@csrf_exempt
@require_safe
def ready(request: HttpRequest) -> HttpResponse:
    checks = {
        settings.DATABASES[alias]["NAME"]: _database_check(alias) for alias in settings.DATABASES
    }
    checks.update(_extra_checks)
    results: dict[str, str] = {}
    for name, check in checks.items():
        try:
            check()
            results[name] = "UP"
        except Exception:  # any failure is DOWN: readiness fails closed
            results[name] = "DOWN"
    if all(state == "UP" for state in results.values()):
        return json_response({"status": "UP", "service": settings.SERVICE_NAME, "checks": results})
    return error_response(
        ApiError(Code.NOT_LEADER, "a dependency is unavailable", details={"checks": results})
    )
