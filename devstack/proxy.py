"""The VALUES of the nginx in front of every server role; its configuration is deploy/nginx/.

deploy/nginx/*.conf.template are the whole configuration as plain nginx text (nginx's own
`include`) with `${EDGE_*}` placeholders. `values()` computes what fills them for one role
instance from the role's settings (ports, timeouts, sizes, names, paths, switches) and `fill()`
writes the filled files beside each other for `make up`, the tests and the bench (`devstack.pod`
runs nginx on them beside the role's gunicorn): `string.Template` over the same files the
official nginx image fills with envsubst in Kubernetes, where the values are the proxy
container's EDGE_* environment in k8s/<component>.yaml (`kubernetes_values()` is what the
parity test expects there). docs/operations.md "Serving topology".
"""

from __future__ import annotations

import functools
import os
import re
import string
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from devstack import proxy_admin, proxy_events
from devstack.common import PROJECT
from dlock.budgets import BUDGETS, LONGEST_REQUEST_S, RAIL_READ_TIMEOUT_S
from dlock.roles import SERVICE_NAMES

DIRECTORY = PROJECT / "deploy" / "nginx"
SUFFIX = ".template"  # the official nginx image's NGINX_ENVSUBST_TEMPLATE_SUFFIX
NGINX = "/usr/sbin/nginx"
# nginx cuts a request this long after the role's own deadline would have answered it.
READ_TIMEOUT_MARGIN_MS = 250
# A third party's proxy knows nothing of our budgets: the rail-proxy's own RAIL_READ_TIMEOUT_MS
# decides when the rail took too long, exactly as when the stub had no proxy.
RAILSTUB_READ_TIMEOUT_MS = 60_000
# Requests in progress per client address (limit_conn), well below the proxy's bound on all of
# them (PROXY_CONN_PER_PROXY): one address cannot take the role's connections. Locally every
# executor, test and bench driver is 127.0.0.1, so the default is four times one executor's 64
# in flight; Kubernetes (one address per executor pod) sets it lower (K8S_CONN_PER_CLIENT).
# Behind SNAT or a mesh sidecar every caller shares one address and so this cap:
# docs/operations.md "Serving topology".
DEFAULT_CONN_PER_CLIENT = 256
# Connections per client address counted at accept, before any byte (the stream hop's
# limit_conn): whatever an address sends -- partial heads, nothing at all, idle keep-alives --
# it holds no more of the proxy's connections than this. Twice its requests in progress
# (PROXY_CONN_PER_CLIENT), so a busy honest address meets the 503 envelope long before a closed
# connection. Default: that multiple of the address's cap.
TCP_PER_CLIENT_FACTOR = 2
# Connections one proxy holds (worker_connections), and requests in progress in all
# (limit_conn per_proxy). Each client connection costs three of them (the client's, the stream
# hop's to the inner http listener, and that listener's end) and a forwarded request one more
# (gunicorn's), plus up to UPSTREAM_KEEPALIVE idle ones to gunicorn: one address at its
# PROXY_TCP_PER_CLIENT and the sum at PROXY_CONN_PER_PROXY take
# 3 x 512 + 4 x 512 + 64 = 3 648 of 4 096 (k8s: 3 x 256 + ... = 2 880); the rest is headroom for
# other addresses' idle keep-alives, heads being read and refusals, so an honest caller meets a
# 503 envelope at worst, never a reset. `connection_budget()` is that sum; values() refuses a
# worker_connections at or below it. The count bounds the sidecar's memory too: an idle TLS
# keep-alive costs about 26 KiB with its stream hop, and nginx holds at most a third of
# worker_connections of them (docs/operations.md "Serving topology").
DEFAULT_WORKER_CONNECTIONS = 4096
DEFAULT_CONN_PER_PROXY = 512
UPSTREAM_KEEPALIVE = 64  # nginx.conf's `keepalive` to gunicorn
# Where the stream hop passes each connection to the http servers: a unix socket in the pod's
# directory (a new directory per start: no stale socket), or in Kubernetes a loopback port of
# the pod (an emptyDir outlives a crashed nginx, a socket file in it would stop the next start).
HTTP_SOCKET = "http.sock"
METRICS_SOCKET = "metrics.sock"
K8S_HTTP_LISTEN = "127.0.0.1:8082"
K8S_METRICS_HTTP_LISTEN = "127.0.0.1:9101"
# Between two reads of a request body (client_body_timeout). nginx has no timer on a whole body,
# only this one per read, so it is short: an honest client writes its body (< 4 KiB, one
# segment) right behind the head; a trickle slower than one byte a second is closed at its
# first gap. The whole body's bound is this times the route's size limit
# (deploy/nginx/role-<role>.conf.template).
DEFAULT_BODY_TIMEOUT_MS = 1_000
# The largest body of a page route (`location /`: everything but /v1, probes and the rail's
# /submit): the admin's forms (a bulk action's 100 selected ids is about 6 KiB), nothing on the
# other roles (their pages are GET: API docs, schema).
PAGE_MAX_BODY_BYTES = {"admin": 16 * 1024}
# Strict-Transport-Security under TLS: a year, this host only.
HSTS = "max-age=31536000"


def _ms(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    return int(raw) if raw else default


def tcp_per_client(env: Mapping[str, str]) -> int:
    """PROXY_TCP_PER_CLIENT, by default twice PROXY_CONN_PER_CLIENT."""
    default = TCP_PER_CLIENT_FACTOR * _ms(env, "PROXY_CONN_PER_CLIENT", DEFAULT_CONN_PER_CLIENT)
    return _ms(env, "PROXY_TCP_PER_CLIENT", default)


def connection_budget(env: Mapping[str, str]) -> int:
    """The connections one address at its cap and the sum of requests in progress take:
    worker_connections must exceed this, the rest being headroom."""
    return (
        3 * tcp_per_client(env)
        + 4 * _ms(env, "PROXY_CONN_PER_PROXY", DEFAULT_CONN_PER_PROXY)
        + UPSTREAM_KEEPALIVE
    )


@functools.cache
def stream_module_path(nginx: str = NGINX) -> str | None:
    """The stream module this nginx must load (its path), or None when it is built in (or there
    is no nginx here to ask)."""
    try:
        built = subprocess.run([nginx, "-V"], capture_output=True, text=True, check=True).stderr
    except (OSError, subprocess.CalledProcessError):
        return None
    if "--with-stream=dynamic" not in built:
        return None
    found = re.search(r"--modules-path=(\S+)", built)
    modules = found.group(1) if found else "/usr/lib/nginx/modules"
    return f"{modules}/ngx_stream_module.so"


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
    error_log: str  # a path or "stderr"
    env: Mapping[str, str] = field(default_factory=dict)
    metrics_listen: str | None = None  # a listener answering /metrics and /health/* only
    tls_certificate: str | None = None
    tls_key: str | None = None
    # The stream hop's inner listeners ("unix:/path" or "127.0.0.1:port"); fill() puts unix
    # sockets in its directory when these are empty.
    http_listen: str = ""
    metrics_http_listen: str = ""
    # The stream module to load (a path), or None when nginx has it built in.
    stream_module: str | None = field(default_factory=stream_module_path)

    @property
    def names(self) -> list[str]:
        return server_names(self.env.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost"))

    @property
    def tls(self) -> bool:
        return bool(self.tls_certificate)


def passes_drops(config: ProxyConfig) -> bool:
    """A forwarded request whose answer was cut is dropped (no answer) rather than 502: the rail
    stub's default (PROXY_PASS_DROPS=1), so its injected drops stay drops."""
    default = "1" if config.role == "railstub" else "0"
    return config.env.get("PROXY_PASS_DROPS", default) == "1"


def host_pattern(names: list[str]) -> str:
    """A PCRE for the Host header values DJANGO_ALLOWED_HOSTS admits, with an optional port, in
    nginx's map syntax (case-insensitive); any Host when `*` is allowed.

    nginx picks a server by the request line's host when the request line is absolute
    (`GET http://127.0.0.1:8082/v1/...`) and by the part of Host before its first `:` otherwise,
    so `Host: evil.example` beside an absolute URI, or `Host: 127.0.0.1:8081@evil.example`,
    reach the role's server: the whole header is checked against this in every location."""
    if "*" in names:
        return "~."
    alternatives = []
    for name in names:
        if name.startswith("."):  # Django's subdomain form: the domain and any subdomain
            alternatives.append(r"([a-z0-9-]+\.)*" + _pcre_escape(name[1:]))
        else:
            alternatives.append(_pcre_escape(name))
    return "~*^(" + "|".join(alternatives) + ")(:[0-9]{1,5})?$"


def _pcre_escape(text: str) -> str:
    return "".join("\\" + c if not (c.isalnum() or c in "-_") else c for c in text)


def values(config: ProxyConfig) -> dict[str, str]:
    """What fills deploy/nginx/*.conf.template for `config` (each an EDGE_* name)."""
    env = config.env
    tls = config.tls
    worker_connections = _ms(env, "PROXY_WORKER_CONNECTIONS", DEFAULT_WORKER_CONNECTIONS)
    budget = connection_budget(env)
    if worker_connections <= budget:
        raise ValueError(
            f"PROXY_WORKER_CONNECTIONS ({worker_connections}) must exceed 3 x "
            f"PROXY_TCP_PER_CLIENT + 4 x PROXY_CONN_PER_PROXY + {UPSTREAM_KEEPALIVE} "
            f"({budget}): an honest caller would meet a reset"
        )
    return {
        "EDGE_ROLE": config.role,
        "EDGE_SERVICE": SERVICE_NAMES.get(config.role, config.role),
        "EDGE_ERROR_LOG": config.error_log,
        "EDGE_SHUTDOWN_TIMEOUT_S": str(shutdown_timeout_s(config.role, env)),
        "EDGE_WORKER_CONNECTIONS": str(worker_connections),
        "EDGE_HEADER_TIMEOUT_MS": str(_ms(env, "SERVER_HEADER_TIMEOUT_MS", 3_000)),
        "EDGE_BODY_TIMEOUT_MS": str(_ms(env, "PROXY_BODY_TIMEOUT_MS", DEFAULT_BODY_TIMEOUT_MS)),
        "EDGE_MAX_BODY_BYTES": str(_ms(env, "DLOCK_MAX_BODY_BYTES", 64 * 1024)),
        "EDGE_PAGE_MAX_BODY_BYTES": str(PAGE_MAX_BODY_BYTES.get(config.role, 1024)),
        "EDGE_CONN_PER_CLIENT": str(_ms(env, "PROXY_CONN_PER_CLIENT", DEFAULT_CONN_PER_CLIENT)),
        "EDGE_CONN_PER_PROXY": str(_ms(env, "PROXY_CONN_PER_PROXY", DEFAULT_CONN_PER_PROXY)),
        "EDGE_TCP_PER_CLIENT": str(tcp_per_client(env)),
        "EDGE_STREAM_MODULE": "load" if config.stream_module else "builtin",
        "EDGE_STREAM_MODULE_PATH": config.stream_module or "",
        "EDGE_UPSTREAM": config.upstream,
        "EDGE_READ_TIMEOUT_MS": str(read_timeout_ms(config.role, env)),
        "EDGE_PASS_DROPS": "1" if passes_drops(config) else "0",
        "EDGE_HOST_PATTERN": host_pattern(config.names),
        # "" also takes requests without a Host header (HTTP/1.0)
        "EDGE_SERVER_NAME": " ".join([*config.names, '""']) if "*" not in config.names else '~. ""',
        "EDGE_LISTEN": config.listen,
        "EDGE_HTTP_LISTEN": config.http_listen,
        "EDGE_METRICS_HTTP_LISTEN": config.metrics_http_listen if config.metrics_listen else "",
        "EDGE_TLS": "on" if tls else "off",
        "EDGE_SSL": "ssl" if tls else "",
        "EDGE_TLS_CERTIFICATE": config.tls_certificate or "",
        "EDGE_TLS_KEY": config.tls_key or "",
        "EDGE_HSTS": HSTS if tls else "",
        "EDGE_METRICS": "on" if config.metrics_listen else "off",
        "EDGE_METRICS_LISTEN": config.metrics_listen or "",
        **proxy_events.values(env),
        **(proxy_admin.values(env) if config.role == "admin" else {}),
    }


class EdgeTemplate(string.Template):
    """What the nginx image's envsubst fills: `${EDGE_NAME}` (and `$EDGE_NAME`); nginx's own
    `$variables` are left alone."""

    idpattern = r"EDGE_[A-Z0-9_]+"
    flags = re.NOFLAG


def fill(directory: Path, config: ProxyConfig) -> Path:
    """deploy/nginx/*.conf.template filled for `config` as directory/*.conf (nginx -p directory
    -c directory/nginx.conf); the path of nginx.conf. A placeholder left unfilled in a file the
    role includes is an error (another role's role-*.conf may keep its own). The stream hop's
    inner listeners, unless `config` names them, are unix sockets in `directory` (one left by a
    killed nginx is removed: nginx would not bind over it)."""
    sockets = {"http_listen": HTTP_SOCKET, "metrics_http_listen": METRICS_SOCKET}
    for name, socket_name in sockets.items():
        if not getattr(config, name):
            (directory / socket_name).unlink(missing_ok=True)
            config = replace(config, **{name: f"unix:{directory / socket_name}"})
    filled = values(config)
    for template in sorted(DIRECTORY.glob(f"*{SUFFIX}")):
        text = EdgeTemplate(template.read_text()).safe_substitute(filled)
        name = template.name.removesuffix(SUFFIX)
        left = re.search(r"\$\{?EDGE_\w+", text)
        if left and not (name.startswith("role-") and not name.startswith(f"role-{config.role}")):
            raise ValueError(f"{template.name}: no value for {left.group(0)}")
        (directory / name).write_text(text)
    return directory / "nginx.conf"


def worker_user() -> str | None:
    """nginx started as root runs its worker as nobody (the socket directory lets it in)."""
    return "nobody nogroup" if os.geteuid() == 0 else None


# ------------------------------------------------------------------------------ Kubernetes

K8S = PROJECT / "k8s"
_K8S_SERVERS = ("lockserver", "payments", "railproxy", "railstub", "admin")
K8S_ROLES = {SERVICE_NAMES[r]: r for r in _K8S_SERVERS}  # Deployment / component name -> ROLE
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
        error_log="stderr",
        env=env,
        metrics_listen="9100",
        tls_certificate=str(K8S_TLS / "tls.crt"),
        tls_key=str(K8S_TLS / "tls.key"),
        http_listen=K8S_HTTP_LISTEN,
        metrics_http_listen=K8S_METRICS_HTTP_LISTEN,
        stream_module=None,  # built into the official nginx image
    )


def kubernetes_values(component: str) -> dict[str, str]:
    """The EDGE_* environment the proxy container of k8s/<component>.yaml must carry: what
    `make up` would fill for the same settings (tests/production/test_deploy_artifacts.py)."""
    return values(kubernetes_config(component))
