"""Liveness touches nothing; readiness makes a real round trip to each of the role's stores.

A check raises when its dependency cannot serve (DOWN: 503), returns None when it is UP, or
returns another state the role can still serve in (`DEGRADED`: 200, reported by name). A role
may replace the plain round trip to one of its databases with a check of its own when it can
serve without that database for a while (the etcd lock-server's lockdb)."""

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

Check = Callable[[], "str | None"]
SERVING = ("UP", "DEGRADED")

_extra_checks: dict[str, Check] = {}
_database_checks: dict[str, Check] = {}


def register_readiness_check(name: str, check: Check) -> None:
    """`check` raises on failure; e.g. the etcd lock backend registers a cluster round trip."""
    _extra_checks[name] = check


def replace_database_check(alias: str, check: Check) -> None:
    """Judge database `alias` by `check` instead of a bare round trip (reported under the same
    name)."""
    _database_checks[alias] = check


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
        settings.DATABASES[alias]["NAME"]: _database_checks.get(alias) or _database_check(alias)
        for alias in settings.DATABASES
    }
    checks.update(_extra_checks)
    results: dict[str, str] = {}
    for name, check in checks.items():
        try:
            state = check() or "UP"
            results[name] = state if state in SERVING else "DOWN"
        except Exception:  # any failure is DOWN: readiness fails closed
            results[name] = "DOWN"
    if all(state in SERVING for state in results.values()):
        overall = "UP" if all(state == "UP" for state in results.values()) else "DEGRADED"
        return json_response(
            {"status": overall, "service": settings.SERVICE_NAME, "checks": results}
        )
    return error_response(
        ApiError(Code.NOT_LEADER, "a dependency is unavailable", details={"checks": results})
    )
