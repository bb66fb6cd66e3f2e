"""The values of the admin role's log-in limit (docs/security.md "Admin hardening").

deploy/nginx/role-admin.conf.template and role-admin-http.conf.template are the configuration:
`limit_req` per client address on `POST /admin/login/` (other methods of the path are not
counted); over the limit a 429 C3 envelope (`OVERLOADED`, with `Retry-After`), nothing
forwarded. django-axes locks by user name and address behind it (settings/admin.py). This
computes what fills them, for the admin role only.
"""

from __future__ import annotations

from collections.abc import Mapping

ADMIN_LOGIN_PATH = "/admin/login/"  # role-admin.conf's location
# Attempts per minute per client address, and how many may come at once before the rate applies.
ADMIN_LOGIN_PER_MINUTE = 10
ADMIN_LOGIN_BURST = 20


def _setting(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    return int(raw) if raw else default


def per_minute(env: Mapping[str, str]) -> int:
    return _setting(env, "PROXY_ADMIN_LOGIN_PER_MINUTE", ADMIN_LOGIN_PER_MINUTE)


def values(env: Mapping[str, str]) -> dict[str, str]:
    """The admin's EDGE_ADMIN_* values from its settings `env`."""
    wait_s = max(1, -(-60 // per_minute(env)))  # one attempt's worth of the rate
    return {
        "EDGE_ADMIN_LOGIN_PER_MINUTE": str(per_minute(env)),
        "EDGE_ADMIN_LOGIN_BURST": str(_setting(env, "PROXY_ADMIN_LOGIN_BURST", ADMIN_LOGIN_BURST)),
        "EDGE_ADMIN_RETRY_AFTER_S": str(wait_s),
        "EDGE_ADMIN_RETRY_AFTER_MS": str(wait_s * 1000),
    }
