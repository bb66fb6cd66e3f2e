"""Where a role's proxy sends one datagram per answer it made itself (dlock.edge_events): the
role's PROXY_EVENTS_PORT, a UDP port on 127.0.0.1, and the proxy's EDGE_EVENTS switch and
EDGE_EVENTS_SERVER (deploy/nginx/events-on.conf.template). docs/operations.md "The proxy's own
answers".
"""

from __future__ import annotations

from collections.abc import Mapping

from devstack.common import free_port

PORT_ENV = "PROXY_EVENTS_PORT"


def with_port(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with a PROXY_EVENTS_PORT: its own, else a free port of the reserved range (an empty
    value, given, turns the events off)."""
    return {PORT_ENV: str(free_port()), **env} if PORT_ENV not in env else dict(env)


def values(env: Mapping[str, str]) -> dict[str, str]:
    """EDGE_EVENTS and EDGE_EVENTS_SERVER for a role whose environment is `env`."""
    port = int(env[PORT_ENV]) if env.get(PORT_ENV) else None
    return {
        "EDGE_EVENTS": "on" if port else "off",
        "EDGE_EVENTS_SERVER": f"127.0.0.1:{port}" if port else "",
    }
