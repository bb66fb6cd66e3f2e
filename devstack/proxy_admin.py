"""The admin role's log-in limit in its nginx (issue 38; docs/security.md "Admin hardening").

`limit_req` per client address on `POST /admin/login/` (other methods of the path are not
counted: the key is empty for them); over the limit a 429 C3 envelope (`OVERLOADED`, with
`Retry-After`), nothing forwarded. django-axes locks by user name and address behind it
(settings/admin.py). Rendered into the admin role's config by devstack.proxy only.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from dlock.errors import ApiError, Code

if TYPE_CHECKING:
    from devstack.proxy import ProxyConfig

ADMIN_LOGIN_PATH = "/admin/login/"
# Attempts per minute per client address, and how many may come at once before the rate applies.
ADMIN_LOGIN_PER_MINUTE = 10
ADMIN_LOGIN_BURST = 20


def _setting(config: ProxyConfig, name: str, default: int) -> int:
    raw = config.env.get(name, "")
    return int(raw) if raw else default


def per_minute(config: ProxyConfig) -> int:
    return _setting(config, "PROXY_ADMIN_LOGIN_PER_MINUTE", ADMIN_LOGIN_PER_MINUTE)


def http_blocks(config: ProxyConfig) -> list[str]:
    """What the admin's limit needs in the http block: its key, its zone, its error page."""
    if config.role != "admin":
        return []
    return [
        "\n".join(
            [
                "    # The admin's log-in form: attempts per client address (POST only).",
                "    map $request_method $dlock_admin_login_client {",
                "        POST $binary_remote_addr;",
                '        default "";',
                "    }",
                "    limit_req_zone $dlock_admin_login_client zone=admin_login:2m "
                f"rate={per_minute(config)}r/m;",
                "    error_page 429 = /_dlock/429;",
            ]
        )
    ]


def locations(config: ProxyConfig) -> list[str]:
    """The admin's server: the limited log-in location and the limit's own answer."""
    from devstack.proxy import TRACE, _error_location, _header_guard, _host_guard, _methods_guard

    if config.role != "admin":
        return []
    burst = _setting(config, "PROXY_ADMIN_LOGIN_BURST", ADMIN_LOGIN_BURST)
    wait_s = max(1, -(-60 // per_minute(config)))  # one attempt's worth of the rate
    error = ApiError(
        Code.OVERLOADED,
        "too many log-in attempts from this address; nothing was forwarded",
        http_status=429,
        retry_after_ms=wait_s * 1000,
    )
    text = json.dumps(error.envelope("TRACE"), separators=(",", ":"))
    return [
        f"        location = {ADMIN_LOGIN_PATH} {{",
        *_host_guard(config),
        *_header_guard(),
        *_methods_guard(),
        f"            limit_req zone=admin_login burst={burst} nodelay;",
        "            limit_req_status 429;",
        "            limit_req_log_level warn;",
        "            proxy_pass http://dlock_role;",
        "        }",
        _error_location("429", 429, text.replace('"TRACE"', f'"{TRACE}"'), retry_after=wait_s),
    ]
