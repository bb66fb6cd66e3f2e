"""The VALUES of the nginx in front of every server role; its configuration is deploy/nginx/.

`deploy/nginx/dlock.conf.tmpl` (with `roles/<role>.conf` and the pieces it includes) is the whole
configuration as nginx text; `values()` computes what fills its placeholders (ports, timeouts,
sizes, names, paths, the envelopes) and `render()` fills it (devstack/proxy_template.py) for a
role instance (`make up`, the tests, the bench: `devstack.pod` runs it beside the role's gunicorn)
and for Kubernetes (`python -m devstack.proxy k8s` writes k8s/nginx/<component>.conf, which
kustomize's configMapGenerator turns into the `<component>-nginx` ConfigMaps; checked current by
tests/production/test_deploy_artifacts.py). The proxy's own error answers are C3 envelopes built
by dlock's error catalogue (`dlock.errors.ApiError`), with nginx's request id (or the client's
traceparent trace id) as traceId. docs/operations.md "Serving topology".
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from devstack import proxy_admin, proxy_template
from devstack.common import PROJECT
from dlock.budgets import BUDGETS, LONGEST_REQUEST_S, RAIL_READ_TIMEOUT_S
from dlock.errors import ApiError, Code
from dlock.roles import SERVICE_NAMES
from dlock.wire import JSON_SECURITY_HEADERS, KNOWN_METHODS, SECURITY_HEADERS

TEMPLATE = proxy_template.DIRECTORY / "dlock.conf.tmpl"
NGINX = "/usr/sbin/nginx"
# nginx cuts a request this long after the role's own deadline would have answered it.
READ_TIMEOUT_MARGIN_MS = 250
# A third party's proxy knows nothing of our budgets: the rail-proxy's own RAIL_READ_TIMEOUT_MS
# decides when the rail took too long, exactly as when the stub had no proxy.
RAILSTUB_READ_TIMEOUT_MS = 60_000
# Requests in progress per client address (limit_conn), far below what one proxy holds
# (worker_connections 8192): one address cannot take the role's connections. Locally every
# executor, test and bench driver is 127.0.0.1, so the default is four times one executor's 64
# in flight; Kubernetes (one address per executor pod) sets it lower (K8S_CONN_PER_CLIENT).
# Behind SNAT or a mesh sidecar every caller shares one address and so this cap:
# docs/operations.md "Serving topology".
DEFAULT_CONN_PER_CLIENT = 256
# Connections one proxy holds (worker_connections), and requests in progress in all
# (limit_conn per_proxy): a forwarded request holds two connections (client and gunicorn), so
# the sum stays below half of them; the rest is headroom for idle keep-alives, heads being read
# and refusals, so an honest caller meets a 503 envelope at worst, never a reset. The count
# bounds the sidecar's memory too (docs/operations.md "Serving topology").
DEFAULT_WORKER_CONNECTIONS = 2048
DEFAULT_CONN_PER_PROXY = 768
# A refused request's body is read and dropped this long at most, each part within
# LINGERING_TIMEOUT_MS of the one before (an honest client writes its body in one go).
LINGERING_TIME_S = 2
LINGERING_TIMEOUT_MS = 250
# Between two reads of a request body (client_body_timeout). nginx has no timer on a whole body,
# only this one per read, so it is short: an honest client writes its body (< 4 KiB, one
# segment) right behind the head; a trickle slower than one byte a second is closed at its
# first gap. The whole body's bound is this times the route's size limit
# (deploy/nginx/roles/<role>.conf).
DEFAULT_BODY_TIMEOUT_MS = 1_000
# The largest body of a page route (`location /`: everything but /v1, probes and the rail's
# /submit): the admin's forms (a bulk action's 100 selected ids is about 6 KiB), nothing on the
# other roles (their pages are GET: API docs, schema).
PAGE_MAX_BODY_BYTES = {"admin": 16 * 1024}
# Strict-Transport-Security under TLS: a year, this host only.
HSTS = "max-age=31536000"
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


def _retry_after_s() -> int:
    overloaded = ApiError(Code.OVERLOADED)
    return max(1, -(-(overloaded.retry_after_ms or 0) // 1000))


def passes_drops(config: ProxyConfig) -> bool:
    """A forwarded request whose answer was cut is dropped (no answer) rather than 502: the rail
    stub's default (PROXY_PASS_DROPS=1), so its injected drops stay drops."""
    default = "1" if config.role == "railstub" else "0"
    return config.env.get("PROXY_PASS_DROPS", default) == "1"


def envelopes(config: ProxyConfig) -> dict[str, str]:
    """ENVELOPE_<name>: the body of every answer the proxy writes itself (errors.conf)."""
    vf = Code.VALIDATION_FAILED
    request = {  # name -> (status, message) of a malformed request, field "request"
        "400": (None, "the request could not be parsed"),
        "400_TLS": (None, "this port speaks TLS: use https://"),
        "405": (405, "method not allowed"),
        "408": (408, "the request did not arrive in time"),
        "411": (411, "chunked request bodies are not accepted; send Content-Length"),
        "413": (413, "request body exceeds the limit of this route"),
        "414": (414, "the request line is too long"),
        "431": (431, "a request header is too large"),
        "505": (None, "only HTTP/1.0 and HTTP/1.1 are spoken here"),
    }
    bodies = {
        name: envelope(vf, message, status=status, field_name="request")
        for name, (status, message) in request.items()
    }
    service = SERVICE_NAMES.get(config.role, config.role)
    outcome = "the request was forwarded and its outcome is unknown"
    bodies |= {
        "404": envelope(Code.NOT_FOUND, "no such resource or route"),
        "500": envelope(Code.INTERNAL, "the proxy failed to handle the request"),
        "503": envelope(Code.OVERLOADED, "too many requests in progress; nothing was forwarded"),
        "FOREIGN_HOST": envelope(
            vf, "this server does not answer for that Host", field_name="Host"
        ),
        "HEADER_CTL": envelope(
            vf, "a request header holds a control character", field_name="headers"
        ),
        "UPSTREAM_NOT_SENT": envelope(
            Code.OVERLOADED, f"the {service} server could not be reached; nothing was forwarded"
        ),
        "UPSTREAM_TIMEOUT": envelope(
            Code.UPSTREAM_TIMEOUT, f"the {service} server did not answer in time; {outcome}"
        ),
        "UPSTREAM_FAILED": envelope(
            Code.UPSTREAM_FAILED,
            f"the answer of the {service} server was cut or malformed; {outcome}",
        ),
    }
    return {f"ENVELOPE_{name}": body for name, body in bodies.items()}


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


def check_templates() -> None:
    """What two places must say alike: envelope-headers.conf and dlock.wire (Django's answers
    carry the same headers); the client headers machine-headers.conf forwards and the ones
    $dlock_header_ctl's map checks for control bytes (dlock.conf.tmpl)."""
    text = (proxy_template.DIRECTORY / "envelope-headers.conf").read_text()
    written = dict(re.findall(r'^add_header (\S+) "(.*)" always;$', text, re.MULTILINE))
    written.pop("Strict-Transport-Security", None)  # the proxy's own, under TLS
    if written != {**SECURITY_HEADERS, **JSON_SECURITY_HEADERS}:
        raise ValueError("deploy/nginx/envelope-headers.conf differs from dlock.wire's headers")
    forwarded = re.findall(
        r"^proxy_set_header \S+ (\$(?:http_\w+|content_type));$",
        (proxy_template.DIRECTORY / "machine-headers.conf").read_text(),
        re.MULTILINE,
    )
    checked = re.search(r'map "(.*)" \$dlock_header_ctl', TEMPLATE.read_text())
    if not checked or checked.group(1).split("|") != forwarded:
        raise ValueError("$dlock_header_ctl's map differs from machine-headers.conf's headers")


def values(config: ProxyConfig) -> dict[str, str | bool]:
    """What fills deploy/nginx/dlock.conf.tmpl for `config`: values and yes/no section switches."""
    names = config.names
    any_host = "*" in names
    env = config.env
    return {
        "USER": bool(config.user),
        "WORKER_USER": config.user or "",
        "PREFIX": str(config.prefix),
        "ERROR_LOG": config.error_log,
        "SHUTDOWN_TIMEOUT_S": str(shutdown_timeout_s(config.role, env)),
        "HEADER_TIMEOUT_MS": str(_ms(env, "SERVER_HEADER_TIMEOUT_MS", 3_000)),
        "BODY_TIMEOUT_MS": str(_ms(env, "PROXY_BODY_TIMEOUT_MS", DEFAULT_BODY_TIMEOUT_MS)),
        "MAX_BODY_BYTES": str(_ms(env, "DLOCK_MAX_BODY_BYTES", 64 * 1024)),
        "UPSTREAM": config.upstream,
        "UPSTREAM_KEEPALIVE_S": str(UPSTREAM_KEEPALIVE_S),
        "READ_TIMEOUT_MS": str(read_timeout_ms(config.role, env)),
        "ROLE": config.role,
        "ANY_HOST": any_host,
        "HOST_PATTERN": host_pattern(names) or "",
        # "" also takes requests without a Host header (HTTP/1.0)
        "SERVER_NAME": "_" if any_host else " ".join([*names, '""']),
        "LISTEN": config.listen,
        "MAIN_DEFAULT": " default_server" if any_host else "",
        "METRICS": bool(config.metrics_listen),
        "METRICS_LISTEN": config.metrics_listen or "",
        "TLS": config.tls,
        "SSL": " ssl" if config.tls else "",
        "TLS_CERTIFICATE": config.tls_certificate or "",
        "TLS_KEY": config.tls_key or "",
        "CONN_PER_CLIENT": str(_ms(env, "PROXY_CONN_PER_CLIENT", DEFAULT_CONN_PER_CLIENT)),
        "CONN_PER_PROXY": str(_ms(env, "PROXY_CONN_PER_PROXY", DEFAULT_CONN_PER_PROXY)),
        "WORKER_CONNECTIONS": str(_ms(env, "PROXY_WORKER_CONNECTIONS", DEFAULT_WORKER_CONNECTIONS)),
        "PAGE_MAX_BODY_BYTES": str(PAGE_MAX_BODY_BYTES.get(config.role, 1024)),
        "HSTS": HSTS,
        "LINGERING_TIME_S": str(LINGERING_TIME_S),
        "LINGERING_TIMEOUT_MS": str(LINGERING_TIMEOUT_MS),
        "ALLOWED_METHODS": ", ".join(sorted(KNOWN_METHODS)),
        "KNOWN_METHODS": "|".join(sorted(KNOWN_METHODS)),
        "RETRY_AFTER_S": str(_retry_after_s()),
        "PASS_DROPS": passes_drops(config),
        **envelopes(config),
        **proxy_admin.values(config),
    }


def render(config: ProxyConfig) -> str:
    check_templates()
    return proxy_template.render(TEMPLATE, values(config))


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


def kubernetes_files() -> dict[Path, str]:
    """k8s/nginx/<component>.conf: each server role's rendered config, which kustomize's
    configMapGenerator (k8s/kustomization.yaml) turns into its `<component>-nginx` ConfigMap."""
    header = (
        "# Generated by `python -m devstack.proxy k8s` from deploy/nginx/ and the role manifests'\n"
        "# settings; tests/production/test_deploy_artifacts.py checks it is current. Do not edit.\n"
    )
    return {K8S / "nginx" / f"{c}.conf": header + render(kubernetes_config(c)) for c in K8S_ROLES}


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["k8s"]:
        for path, text in kubernetes_files().items():
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(PROJECT)}")
    else:
        sys.exit("usage: python -m devstack.proxy k8s")
