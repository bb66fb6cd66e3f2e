"""The nginx in front of every server role: its configuration, rendered from one template.

`deploy/nginx/dlock.conf.tmpl` is the one template; `render()` fills it for a role instance
(`make up`, the tests, the bench: `devstack.pod` runs it beside the role's gunicorn) and for
Kubernetes (`k8s/nginx-config.yaml`, checked equal to `render(kubernetes_config(role))` by
tests/production/test_deploy_artifacts.py). The proxy's own error answers are C3 envelopes built
by dlock's error catalogue (`dlock.errors.ApiError`), with nginx's request id (or the client's
traceparent trace id) as traceId. docs/operations.md "Serving topology".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from devstack import proxy_admin
from devstack.common import PROJECT
from dlock.budgets import BUDGETS, LONGEST_REQUEST_S, RAIL_READ_TIMEOUT_S
from dlock.errors import ApiError, Code
from dlock.roles import SERVICE_NAMES
from dlock.wire import JSON_SECURITY_HEADERS, KNOWN_METHODS, SECURITY_HEADERS

TEMPLATE = PROJECT / "deploy" / "nginx" / "dlock.conf.tmpl"
NGINX = "/usr/sbin/nginx"
# nginx cuts a request this long after the role's own deadline would have answered it.
READ_TIMEOUT_MARGIN_MS = 250
# A third party's proxy knows nothing of our budgets: the rail-proxy's own RAIL_READ_TIMEOUT_MS
# decides when the rail took too long, exactly as when the stub had no proxy.
RAILSTUB_READ_TIMEOUT_MS = 60_000
# Requests in progress per client address (limit_conn), far below what one proxy holds
# (worker_connections 8192): one address cannot take the role's connections. Locally every
# executor, test and bench driver is 127.0.0.1, so the default is four times one executor's 64
# in flight; Kubernetes (one address per executor pod) sets it lower (k8s/nginx-config.yaml).
# Behind SNAT or a mesh sidecar every caller shares one address and so this cap:
# docs/operations.md "Serving topology".
DEFAULT_CONN_PER_CLIENT = 256
# Between two reads of a request body (client_body_timeout). nginx has no timer on a whole body,
# only this one per read, so it is short: an honest client writes its body (< 4 KiB, one
# segment) right behind the head; a trickle slower than one byte a second is closed at its
# first gap. The whole body's bound is this times the route's size limit (BODY_LIMITS).
DEFAULT_BODY_TIMEOUT_MS = 1_000
# The largest body each route family takes (client_max_body_size), from C3's bodies with margin
# for JSON escapes (a field of n characters is at most 12n bytes as \u surrogate pairs):
# (nginx location, bytes). Anything else (health, metrics, docs, pages) keeps
# DLOCK_MAX_BODY_BYTES. docs/operations.md "Serving topology" has the table.
BODY_LIMITS: dict[str, list[tuple[str, int]]] = {
    # L8 revoke: reason <= 2 000 characters; L1-L6: ownerId <= 64, ids, ttlMillis, waitMillis
    "lockserver": [("~ ^/v1/locks/[^/]+/revoke$", 32 * 1024), ("/v1/", 2 * 1024)],
    # P2 claim: expectedState only; P3 post: railReference <= 128, submissionId (uuid)
    "payments": [("~ ^/v1/payouts/[^/]+/claim$", 1024), ("/v1/", 4 * 1024)],
    # submissions: payoutId, accountId <= 64, amountMinor, currency, beneficiaryRef <= 128
    "railproxy": [("/v1/", 4 * 1024)],
    # the rail's own /submit: clientRef <= 128, amountMinor, currency and the proxy's fields
    "railstub": [("= /submit", 4 * 1024), ("/v1/", 4 * 1024)],
}
# What an envelope's traceId is on the proxy's own answers (an nginx variable, see template).
TRACE = "$dlock_trace_id"
UPSTREAM_KEEPALIVE_S = 4  # below gunicorn's keepalive (5 s, settings/gunicorn.py)


def _ms(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    return int(raw) if raw else default


def role_deadline_ms(role: str, env: Mapping[str, str]) -> int:
    """The longest a legitimate request of `role` runs, from the role's own settings.

    lock-server: the longest acquire wait (C3 L4 waitMillis ≤ 30 s) plus its request deadline
    (queue + one etcd call, dlock.budgets.inward_chains); payment-resource: queue + database
    slot + statement deadlines; rail-proxy: queue + rail connect + rail read (inward_chains)."""
    queue = _ms(env, "SERVER_QUEUE_DEADLINE_MS", 500)
    if role == "lockserver":
        return 30_000 + queue + _ms(env, "ETCD_REQUEST_TIMEOUT_MS", 400)
    if role == "payments":
        return (
            queue
            + _ms(env, "DB_QUEUE_DEADLINE_MS", 2_000)
            + _ms(env, "DB_STATEMENT_TIMEOUT_MS", 2_500)
        )
    if role == "railproxy":
        return (
            queue
            + _ms(env, "RAIL_CONNECT_TIMEOUT_MS", 1_000)
            + _ms(env, "RAIL_READ_TIMEOUT_MS", int(RAIL_READ_TIMEOUT_S * 1000))
        )
    return int(LONGEST_REQUEST_S.get(role, 15) * 1000)


def caller_read_timeout_ms(role: str, env: Mapping[str, str]) -> int | None:
    """The longest read timeout of any dlock client calling `role` (dlock.budgets), or None."""
    if role == "lockserver":  # acquire waits up to 30 s on top of its read timeout
        return int((BUDGETS["lock.acquire"].read_s + 30) * 1000)
    if role == "payments":
        return int(BUDGETS["payments.write"].read_s * 1000)
    if role == "railproxy":
        rail = _ms(env, "RAIL_READ_TIMEOUT_MS", int(RAIL_READ_TIMEOUT_S * 1000))
        return rail + 2_000  # dlock.budgets "rail.submit": rail read timeout + 2 s
    if role == "railstub":
        return _ms(env, "RAIL_READ_TIMEOUT_MS", int(RAIL_READ_TIMEOUT_S * 1000))
    return None


def read_timeout_ms(role: str, env: Mapping[str, str]) -> int:
    """proxy_read_timeout: above the role's own deadline, so nginx never cuts a request the role
    would still answer (docs/operations.md "Budgets" lists where that is below the callers)."""
    if env.get("PROXY_READ_TIMEOUT_MS"):  # an operator's (or a test's) explicit choice
        return int(env["PROXY_READ_TIMEOUT_MS"])
    if role == "railstub":
        return RAILSTUB_READ_TIMEOUT_MS
    return role_deadline_ms(role, env) + READ_TIMEOUT_MARGIN_MS


def shutdown_timeout_s(role: str, env: Mapping[str, str]) -> int:
    """How long a draining proxy lets requests in flight finish: gunicorn's graceful timeout."""
    raw = env.get("GUNICORN_GRACEFUL_TIMEOUT", "")
    return int(raw) if raw else int(LONGEST_REQUEST_S.get(role, 15))


def server_names(allowed_hosts: str) -> list[str]:
    """nginx server_name values for DJANGO_ALLOWED_HOSTS (Django's `.example.com` subdomain
    form is nginx's too); `*` means any host: then the role's server is the default one."""
    names = []
    for host in (h.strip() for h in allowed_hosts.split(",")):
        if host and host not in names:
            names.append(host)
    return names or ["127.0.0.1", "localhost"]


@dataclass
class ProxyConfig:
    """One proxy: where it listens, which gunicorn it fronts, what it allows."""

    role: str
    listen: str  # "127.0.0.1:8082" or "8080"
    upstream: str  # "unix:/path/role.sock" or "127.0.0.1:8081"
    prefix: Path  # nginx's prefix: pid file and temp directories
    error_log: str  # a path or "stderr"
    env: Mapping[str, str] = field(default_factory=dict)
    metrics_listen: str | None = None  # a listener answering /metrics and /health/* only
    tls_certificate: str | None = None
    tls_key: str | None = None
    user: str | None = None  # the worker's user when nginx starts as root ("nobody nogroup")

    @property
    def names(self) -> list[str]:
        return server_names(self.env.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost"))

    @property
    def tls(self) -> bool:
        return bool(self.tls_certificate)


def envelope(code: Code, message: str, *, status: int | None = None, field_name: str = "") -> str:
    """The C3 envelope (the same six fields dlock writes) as an nginx `return` text."""
    details = None
    if field_name:
        details = {"fields": [{"field": field_name, "message": message}]}
    error = ApiError(code, message, http_status=status, details=details)
    body = json.dumps(error.envelope("TRACE"), separators=(",", ":"))
    if "'" in body or "\\" in body or "$" in body:  # nginx would read them in a quoted text
        raise ValueError(f"envelope text nginx cannot quote: {body}")
    return body.replace('"TRACE"', f'"{TRACE}"')


def _error_location(name: str, status: int, text: str, *, retry_after: int | None = None) -> str:
    lines = [f"        location = /_dlock/{name} {{", "            internal;"]
    lines += _envelope_headers(retry_after)
    lines.append(f"            return {status} '{text}';")
    lines.append("        }")
    return "\n".join(lines)


def _envelope_headers(retry_after: int | None) -> list[str]:
    headers = {**SECURITY_HEADERS, **JSON_SECURITY_HEADERS}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return [f'            add_header {name} "{value}" always;' for name, value in headers.items()]


def _retry_after_s() -> int:
    overloaded = ApiError(Code.OVERLOADED)
    return max(1, -(-(overloaded.retry_after_ms or 0) // 1000))


def _static_errors(config: ProxyConfig) -> list[tuple[str, int, str]]:
    """(location name, status, envelope) of each fixed answer."""
    vf = Code.VALIDATION_FAILED
    return [
        ("400", 400, envelope(vf, "the request could not be parsed", field_name="request")),
        (
            "400-tls",
            400,
            envelope(vf, "this port speaks TLS: use https://", field_name="request"),
        ),
        ("404", 404, envelope(Code.NOT_FOUND, "no such resource or route")),
        ("405", 405, envelope(vf, "method not allowed", status=405, field_name="request")),
        (
            "408",
            408,
            envelope(vf, "the request did not arrive in time", status=408, field_name="request"),
        ),
        (
            "411",
            411,
            envelope(
                vf,
                "chunked request bodies are not accepted; send Content-Length",
                status=411,
                field_name="request",
            ),
        ),
        (
            "413",
            413,
            envelope(
                vf,
                "request body exceeds the limit of this route",
                status=413,
                field_name="request",
            ),
        ),
        (
            "414",
            414,
            envelope(vf, "the request line is too long", status=414, field_name="request"),
        ),
        (
            "431",
            431,
            envelope(vf, "a request header is too large", status=431, field_name="request"),
        ),
        ("500", 500, envelope(Code.INTERNAL, "the proxy failed to handle the request")),
        (
            "505",
            400,
            envelope(vf, "only HTTP/1.0 and HTTP/1.1 are spoken here", field_name="request"),
        ),
    ]


def error_locations(config: ProxyConfig) -> str:
    """/_dlock/<status>: every answer nginx writes itself, as a C3 envelope."""
    retry_after = _retry_after_s()
    parts = [_error_location(name, status, text) for name, status, text in _static_errors(config)]
    parts.append(
        _error_location(
            "503",
            503,
            envelope(Code.OVERLOADED, "too many requests in progress; nothing was forwarded"),
            retry_after=retry_after,
        )
    )
    parts.append(_upstream_location(config, retry_after))
    return "\n".join(parts)


def passes_drops(config: ProxyConfig) -> bool:
    """A forwarded request whose answer was cut is dropped (no answer) rather than 502: the rail
    stub's default (PROXY_PASS_DROPS=1), so its injected drops stay drops."""
    default = "1" if config.role == "railstub" else "0"
    return config.env.get("PROXY_PASS_DROPS", default) == "1"


def _upstream_location(config: ProxyConfig, retry_after: int) -> str:
    """502/504 from the upstream: the answer depends on whether any byte reached the role."""
    service = SERVICE_NAMES.get(config.role, config.role)
    not_sent = envelope(
        Code.OVERLOADED, f"the {service} server could not be reached; nothing was forwarded"
    )
    timed_out = envelope(
        Code.UPSTREAM_TIMEOUT,
        f"the {service} server did not answer in time; the request was forwarded and its "
        "outcome is unknown",
    )
    failed = envelope(
        Code.UPSTREAM_FAILED,
        f"the answer of the {service} server was cut or malformed; the request was forwarded and "
        "its outcome is unknown",
    )
    upstream = ["        location = /_dlock/upstream {", "            internal;"]
    upstream += _envelope_headers(None)
    upstream += [
        "            if ($dlock_forwarded = 0) {",
        *("    " + line for line in _envelope_headers(retry_after)),
        f"                return 503 '{not_sent}';",
        "            }",
        "            if ($upstream_status = 504) {",
        *("    " + line for line in _envelope_headers(None)),
        f"                return 504 '{timed_out}';",
        "            }",
        # The rail stub is the third party: when it drops a connection (its injected faults,
        # railstub/views.py) its proxy drops the caller's too (444: close, no answer), so the
        # rail-proxy sees exactly what a rail that hangs up shows it.
        "            return 444;"
        if passes_drops(config)
        else f"            return 502 '{failed}';",
        "        }",
    ]
    return "\n".join(upstream)


def _listen(address: str, config: ProxyConfig, *, default: bool = False) -> str:
    flags = " ssl" if config.tls else ""
    flags += " default_server" if default else ""
    return f"        listen {address}{flags};"


TLS12_CIPHERS = ":".join(
    [
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
    ]
)


def _tls_lines(config: ProxyConfig) -> list[str]:
    if not config.tls:
        return []
    return [
        f"        ssl_certificate {config.tls_certificate};",
        f"        ssl_certificate_key {config.tls_key};",
        "        ssl_protocols TLSv1.2 TLSv1.3;",
        # Mozilla "intermediate": TLS 1.2 with forward-secret AEAD suites only (no CBC, no
        # SHA-1 MAC, no static RSA); TLS 1.3 suites are all AEAD.
        f"        ssl_ciphers {TLS12_CIPHERS};",
        "        ssl_prefer_server_ciphers off;",
        "        ssl_session_cache shared:dlock_tls:1m;",
        "        ssl_session_timeout 10m;",
    ]


def _methods_guard() -> list[str]:
    """In each forwarding location (at server level they would run again for the error page's
    internal redirect and turn it into nginx's HTML page)."""
    methods = "|".join(sorted(KNOWN_METHODS))
    return [
        # Methods no route has (TRACE, M-SEARCH, ...): 405 before anything reads a body.
        f"            if ($request_method !~ ^({methods})$) {{",
        "                return 405;",
        "            }",
        # Chunked (or any transfer-coded) request bodies: dlock's contract is Content-Length.
        '            if ($http_transfer_encoding != "") {',
        "                return 411;",
        "            }",
    ]


def _refusing_server(config: ProxyConfig, errors: str) -> str:
    """The default server: a Host outside DJANGO_ALLOWED_HOSTS (or none) is refused, except for
    the probes and scrapes that address a pod by its IP."""
    refuse = _refuse_host_envelope()
    return "\n".join(
        [
            "    # A Host outside DJANGO_ALLOWED_HOSTS (or none): refused here.",
            "    server {",
            _listen(config.listen, config, default=True),
            *(
                [_listen(config.metrics_listen, config, default=True)]
                if config.metrics_listen
                else []
            ),
            "        server_name _;",
            *_tls_lines(config),
            # Kubelet probes and Prometheus address a pod by its IP (Host = pod IP): liveness,
            # readiness and metrics are answered whatever the Host (the role exempts these
            # paths from its own Host check too; no cookies, no data).
            *_forwarding_location(config, MONITORING, MONITORING_BODY, host_guard=False),
            "        location / {",
            *_envelope_headers(None),
            f"            return 400 '{refuse}';",
            "        }",
            errors,
            "    }",
        ]
    )


def host_pattern(names: list[str]) -> str | None:
    """A PCRE for the Host header values DJANGO_ALLOWED_HOSTS admits, with an optional port, in
    nginx's map syntax (case-insensitive); None when any host is allowed (`*`).

    nginx picks a server by the request line's host when the request line is absolute
    (`GET http://127.0.0.1:8082/v1/...`) and by the part of Host before its first `:` otherwise,
    so `Host: evil.example` beside an absolute URI, or `Host: 127.0.0.1:8081@evil.example`,
    reach the role's server: the whole header is checked against this in every location."""
    if "*" in names:
        return None
    alternatives = []
    for name in names:
        if name.startswith("."):  # Django's subdomain form: the domain and any subdomain
            alternatives.append(r"([a-z0-9-]+\.)*" + _pcre_escape(name[1:]))
        else:
            alternatives.append(_pcre_escape(name))
    return "~*^(" + "|".join(alternatives) + ")(:[0-9]{1,5})?$"


def _pcre_escape(text: str) -> str:
    return "".join("\\" + c if not (c.isalnum() or c in "-_") else c for c in text)


def _host_map(names: list[str]) -> str:
    pattern = host_pattern(names)
    lines = [
        "    # 1 when the client's Host is one of DJANGO_ALLOWED_HOSTS (or absent): the only",
        "    # Host a forwarded request carries (Django never meets a foreign one).",
        "    map $http_host $dlock_host_ok {",
        "        default 0;" if pattern else "        default 1;",
        '        "" 1;',
    ]
    if pattern:
        lines.append(f'        "{pattern}" 1;')
    lines.append("    }")
    return "\n".join(lines)


def _host_guard(config: ProxyConfig) -> list[str]:
    refuse = _refuse_host_envelope()
    return [
        "            if ($dlock_host_ok = 0) {",
        *("    " + line for line in _envelope_headers(None)),
        f"                return 400 '{refuse}';",
        "            }",
    ]


def _refuse_host_envelope() -> str:
    return envelope(
        Code.VALIDATION_FAILED, "this server does not answer for that Host", field_name="Host"
    )


# What a machine route (C3's /v1 calls, the rail's /submit) is forwarded with: the headers dlock
# reads and nothing else (a header no route reads never reaches gunicorn, whatever it holds),
# beside the proxy's own (the template's proxy_set_header lines, repeated: a location that sets
# any replaces them all). Their values are checked for control bytes first (_header_map).
MACHINE_HEADERS = {
    "Authorization": "$http_authorization",
    "Accept": "$http_accept",
    "Content-Type": "$content_type",
    "X-Fencing-Token": "$http_x_fencing_token",
    "X-Fencing-Proof": "$http_x_fencing_proof",
    "X-Owner-Id": "$http_x_owner_id",
    "X-Idempotency-Key": "$http_x_idempotency_key",
    "traceparent": "$http_traceparent",
    "User-Agent": "$http_user_agent",
}
PROXY_HEADERS = {
    "Connection": '""',
    "Host": "$dlock_host",
    "X-Request-Start": '"t=$msec"',
    "X-Forwarded-For": "$remote_addr",
    "X-Forwarded-Proto": "$scheme",
}


def _header_map() -> str:
    """$dlock_header_ctl is 1 when a header dlock reads holds a control byte (what gunicorn would
    refuse with its own HTML page): nginx answers the envelope instead."""
    joined = "|".join(MACHINE_HEADERS.values())
    return "\n".join(
        [
            f'    map "{joined}" $dlock_header_ctl {{',
            "        default 0;",
            '        "~[\\x00-\\x08\\x0a-\\x1f\\x7f]" 1;',
            "    }",
        ]
    )


def _header_guard() -> list[str]:
    refuse = envelope(
        Code.VALIDATION_FAILED,
        "a request header holds a control character",
        field_name="headers",
    )
    return [
        "            if ($dlock_header_ctl) {",
        *("    " + line for line in _envelope_headers(None)),
        f"                return 400 '{refuse}';",
        "            }",
    ]


# Probes and scrapes: machine paths too (no body, only the headers dlock reads).
MONITORING = "~ ^/(health/live|health/ready|metrics)$"
MONITORING_BODY = 1024


def _forwarding_location(
    config: ProxyConfig, match: str, max_body: int | None, *, host_guard: bool = True
) -> list[str]:
    machine = max_body is not None  # a machine route: only the headers dlock reads
    headers = (
        [
            "            proxy_pass_request_headers off;",
            *(
                f"            proxy_set_header {name} {value};"
                for name, value in {**PROXY_HEADERS, **MACHINE_HEADERS}.items()
            ),
        ]
        if machine
        else []
    )
    return [
        f"        location {match} {{",
        *([f"            client_max_body_size {max_body};"] if max_body else []),
        *(_host_guard(config) if host_guard else []),
        *_header_guard(),
        *_methods_guard(),
        *headers,
        "            proxy_pass http://dlock_role;",
        "        }",
    ]


def _reserved_location() -> list[str]:
    """/_dlock/ is the proxy's own: a client asking for it gets the 404 envelope."""
    not_found = envelope(Code.NOT_FOUND, "no such resource or route")
    return [
        "        location ^~ /_dlock/ {",
        *_envelope_headers(None),
        f"            return 404 '{not_found}';",
        "        }",
    ]


def servers(config: ProxyConfig) -> str:
    errors = error_locations(config)
    names = config.names
    any_host = "*" in names
    # the admin's log-in limit in the admin role's config only (devstack/proxy_admin.py)
    blocks = [_host_map(names), _header_map(), *proxy_admin.http_blocks(config)]
    if not any_host:
        blocks.append(_refusing_server(config, errors))
    # "" also takes requests without a Host header (HTTP/1.0; HTTP/1.1 without one is a 400).
    server_name = "_" if any_host else " ".join([*names, '""'])
    blocks.append(
        "\n".join(
            [
                f"    # {config.role}: what reaches gunicorn.",
                "    server {",
                _listen(config.listen, config, default=any_host),
                f"        server_name {server_name};",
                *_tls_lines(config),
                f"        limit_conn per_client {_ms(config.env, 'PROXY_CONN_PER_CLIENT', DEFAULT_CONN_PER_CLIENT)};",  # noqa: E501
                *(
                    line
                    for match, size in [
                        *BODY_LIMITS.get(config.role, []),
                        (MONITORING, MONITORING_BODY),
                    ]
                    for line in _forwarding_location(config, match, size)
                ),
                *proxy_admin.locations(config),
                *_forwarding_location(config, "/", None),
                *_reserved_location(),
                errors,
                "    }",
            ]
        )
    )
    if config.metrics_listen:
        not_found = envelope(Code.NOT_FOUND, "no such resource or route")
        blocks.append(
            "\n".join(
                [
                    "    # The monitoring listener: /metrics and /health/* only.",
                    "    server {",
                    _listen(config.metrics_listen, config, default=any_host),
                    f"        server_name {server_name};",
                    *_tls_lines(config),
                    *_forwarding_location(config, MONITORING, MONITORING_BODY),
                    "        location / {",
                    *_envelope_headers(None),
                    f"            return 404 '{not_found}';",
                    "        }",
                    errors,
                    "    }",
                ]
            )
        )
    return "\n\n".join(blocks)


def render(config: ProxyConfig) -> str:
    values = {
        "USER": f"user {config.user};" if config.user else "# user: the starting user's own",
        "PREFIX": str(config.prefix),
        "ERROR_LOG": config.error_log,
        "SHUTDOWN_TIMEOUT_S": str(shutdown_timeout_s(config.role, config.env)),
        "HEADER_TIMEOUT_MS": str(_ms(config.env, "SERVER_HEADER_TIMEOUT_MS", 3_000)),
        "BODY_TIMEOUT_MS": str(_ms(config.env, "PROXY_BODY_TIMEOUT_MS", DEFAULT_BODY_TIMEOUT_MS)),
        "MAX_BODY_BYTES": str(_ms(config.env, "DLOCK_MAX_BODY_BYTES", 64 * 1024)),
        "UPSTREAM": config.upstream,
        "UPSTREAM_KEEPALIVE_S": str(UPSTREAM_KEEPALIVE_S),
        "READ_TIMEOUT_MS": str(read_timeout_ms(config.role, config.env)),
        "SERVERS": servers(config),
    }
    text = TEMPLATE.read_text()
    for name, value in values.items():
        text = text.replace("{{" + name + "}}", value)
    if "{{" in text:
        raise ValueError(f"unfilled placeholder in {TEMPLATE}: {text[text.index('{{') :][:40]}")
    return text


def worker_user() -> str | None:
    """nginx started as root runs its worker as nobody (the socket directory lets it in)."""
    return "nobody nogroup" if os.geteuid() == 0 else None


# ------------------------------------------------------------------------------ Kubernetes

K8S = PROJECT / "k8s"
_K8S_SERVERS = ("lockserver", "payments", "railproxy", "railstub", "admin")
K8S_ROLES = {SERVICE_NAMES[r]: r for r in _K8S_SERVERS}  # Deployment / component name -> ROLE
K8S_PREFIX = Path("/tmp/nginx")  # noqa: S108 - the sidecar's own emptyDir
K8S_UPSTREAM = "127.0.0.1:8081"  # gunicorn inside the pod (GUNICORN_BIND)
K8S_CONN_PER_CLIENT = "128"  # one address per executor pod (64 in flight each)
K8S_TLS = Path("/etc/dlock-tls")  # the dlock-tls Secret in the proxy sidecar


def _manifest_env(component: str) -> dict[str, str]:
    """The role container's literal env values and the shared dlock-settings ConfigMap."""
    import yaml

    env: dict[str, str] = {}
    for doc in yaml.safe_load_all((K8S / "config.yaml").read_text()):
        if doc and doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == "dlock-settings":
            env.update({k: str(v) for k, v in doc["data"].items()})
    for doc in yaml.safe_load_all((K8S / f"{component}.yaml").read_text()):
        if doc and doc.get("kind") == "Deployment":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            env.update({e["name"]: str(e["value"]) for e in container["env"] if "value" in e})
    return env


def kubernetes_config(component: str) -> ProxyConfig:
    env = {"PROXY_CONN_PER_CLIENT": K8S_CONN_PER_CLIENT, **_manifest_env(component)}
    return ProxyConfig(
        role=K8S_ROLES[component],
        listen="8080",
        upstream=K8S_UPSTREAM,
        prefix=K8S_PREFIX,
        error_log="stderr",
        env=env,
        metrics_listen="9100",
        tls_certificate=str(K8S_TLS / "tls.crt"),
        tls_key=str(K8S_TLS / "tls.key"),
    )


def kubernetes_configmaps() -> str:
    """k8s/nginx-config.yaml: one ConfigMap `<component>-nginx` per server role."""
    parts = [
        "# Generated by `python -m devstack.proxy k8s` from deploy/nginx/dlock.conf.tmpl and the\n"
        "# role manifests' settings; tests/production/test_deploy_artifacts.py checks it is\n"
        "# current. Do not edit by hand.\n"
    ]
    for component in K8S_ROLES:
        text = render(kubernetes_config(component))
        body = "".join(f"    {line}\n" if line else "\n" for line in text.splitlines())
        parts.append(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n"
            f"  name: {component}-nginx\n"
            "  labels: {app.kubernetes.io/name: dlock, "
            f"app.kubernetes.io/component: {component}}}\n"
            "data:\n  nginx.conf: |\n" + body
        )
    return "".join(parts)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["k8s"]:
        (K8S / "nginx-config.yaml").write_text(kubernetes_configmaps())
        print(f"wrote {K8S / 'nginx-config.yaml'}")
    else:
        sys.exit("usage: python -m devstack.proxy k8s")
