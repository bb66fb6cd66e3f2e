"""The values of the admin role's log-in limit (issue 38; docs/security.md "Admin hardening").

deploy/nginx/roles/admin.conf and roles/admin-http.conf are the configuration: `limit_req` per
client address on `POST /admin/login/` (other methods of the path are not counted); over the limit
a 429 C3 envelope (`OVERLOADED`, with `Retry-After`), nothing forwarded. django-axes locks by user
name and address behind it (settings/admin.py). This computes what fills them, for the admin role
only (`ADMIN` switches them on in deploy/nginx/dlock.conf.tmpl).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from dlock.errors import ApiError, Code

if TYPE_CHECKING:
    from devstack.proxy import ProxyConfig

ADMIN_LOGIN_PATH = "/admin/login/"  # roles/admin.conf's location
# Attempts per minute per client address, and how many may come at once before the rate applies.
ADMIN_LOGIN_PER_MINUTE = 10
ADMIN_LOGIN_BURST = 20


def _setting(config: ProxyConfig, name: str, default: int) -> int:
    raw = config.env.get(name, "")
    return int(raw) if raw else default


def per_minute(config: ProxyConfig) -> int:
    return _setting(config, "PROXY_ADMIN_LOGIN_PER_MINUTE", ADMIN_LOGIN_PER_MINUTE)


def values(config: ProxyConfig) -> dict[str, str | bool]:
    """ADMIN (the admin role's sections on or off) and, for the admin, its limit's values."""
    from devstack.proxy import TRACE

    if config.role != "admin":
        return {"ADMIN": False}
    wait_s = max(1, -(-60 // per_minute(config)))  # one attempt's worth of the rate
    error = ApiError(
        Code.OVERLOADED,
        "too many log-in attempts from this address; nothing was forwarded",
        http_status=429,
        retry_after_ms=wait_s * 1000,
    )
    text = json.dumps(error.envelope("TRACE"), separators=(",", ":"))
    return {
        "ADMIN": True,
        "ADMIN_LOGIN_PER_MINUTE": str(per_minute(config)),
        "ADMIN_LOGIN_BURST": str(_setting(config, "PROXY_ADMIN_LOGIN_BURST", ADMIN_LOGIN_BURST)),
        "ADMIN_RETRY_AFTER_S": str(wait_s),
        "ENVELOPE_ADMIN_LOGIN": text.replace('"TRACE"', f'"{TRACE}"'),
    }
