"""deploy/nginx/ is the edge written once: plain nginx text that says what dlock says (its
envelopes, security headers, methods, forwarded headers), filled locally by devstack/proxy.py as
the nginx image's envsubst fills it in Kubernetes, and accepted by nginx in every shape a role
runs in (plain or TLS, with or without a monitoring listener)."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from devstack import proxy
from devstack.tls import ensure_tls
from dlock.errors import ApiError, Code
from dlock.roles import SERVICE_NAMES
from dlock.wire import JSON_SECURITY_HEADERS, KNOWN_METHODS, SECURITY_HEADERS

ROLES = ("lockserver", "payments", "railproxy", "railstub", "admin")


def template(name: str) -> str:
    return (proxy.DIRECTORY / f"{name}{proxy.SUFFIX}").read_text()


def all_templates() -> str:
    return "\n".join(p.read_text() for p in sorted(proxy.DIRECTORY.glob(f"*{proxy.SUFFIX}")))


def config(role: str, **fields) -> proxy.ProxyConfig:
    return proxy.ProxyConfig(
        role=role, listen="127.0.0.1:1", upstream="unix:/nowhere.sock", error_log="stderr", **fields
    )


def test_every_answer_the_proxy_writes_is_dlock_s_envelope_for_its_code():
    bodies = re.findall(r"return \d{3} '(.*)';", all_templates())
    assert len(bodies) >= 17
    for text in bodies:
        text = text.replace("$dlock_trace_id", "TRACE").replace("${EDGE_SERVICE}", "lock-server")
        text = text.replace("${EDGE_ADMIN_RETRY_AFTER_MS}", "6000")
        body = json.loads(text)
        error = ApiError(
            Code(body["code"]),
            body["message"],
            details=body.get("details"),
            retry_after_ms=body.get("retryAfterMillis"),
        )
        assert error.envelope("TRACE") == body, text


def test_the_retry_after_header_is_the_overloaded_envelope_s_wait():
    wait_s = math.ceil((ApiError(Code.OVERLOADED).retry_after_ms or 0) / 1000)
    assert (
        re.findall(r'add_header Retry-After "(\d+)" always;', template("errors.conf"))
        == [str(max(1, wait_s))] * 2
    )


def test_the_envelope_headers_are_dlock_wires():
    written = dict(
        re.findall(r'^add_header (\S+) "(.*)" always;$', template("envelope-headers.conf"), re.M)
    )
    assert written.pop("Strict-Transport-Security") == "${EDGE_HSTS}"
    assert written == {**SECURITY_HEADERS, **JSON_SECURITY_HEADERS}


def test_the_control_byte_map_checks_every_forwarded_header():
    forwarded = re.findall(
        r"^proxy_set_header \S+ (\$(?:http_\w+|content_type));$",
        template("machine-headers.conf"),
        re.M,
    )
    checked = re.search(r'map "(.*)" \$dlock_header_ctl', template("nginx.conf"))
    assert checked and checked.group(1).split("|") == forwarded


def test_the_methods_and_allow_are_dlock_wires():
    methods = re.search(r"\$request_method !~ \^\((.*)\)\$", template("request-guards.conf"))
    assert methods and set(methods.group(1).split("|")) == KNOWN_METHODS
    allow = re.findall(r'add_header Allow "(.*)" always;', template("errors.conf"))
    assert allow == [", ".join(sorted(KNOWN_METHODS)), "GET, HEAD"]


def test_each_role_gets_its_own_routes_and_only_the_admin_its_login_limit(tmp_path):
    limit = "{\n    client_max_body_size"
    own = {
        "lockserver": f"location ~ ^/v1/locks/[^/]+/revoke$ {limit} 32768;",
        "payments": f"location ~ ^/v1/payouts/[^/]+/claim$ {limit} 1024;",
        "railproxy": f"location /v1/ {limit} 4096;",
        "railstub": f"location = /submit {limit} 4096;",
        "admin": "limit_req zone=admin_login burst=20 nodelay;",
    }
    for role, expected in own.items():
        directory = tmp_path / role
        directory.mkdir()
        proxy.fill(directory, config(role))
        assert expected in (directory / f"role-{role}.conf").read_text(), role
        assert f"include role-{role}.conf;" in (directory / "nginx.conf").read_text()
        values = proxy.values(config(role))
        assert values["EDGE_PASS_DROPS"] == ("1" if role == "railstub" else "0"), role
        assert values["EDGE_SERVICE"] == SERVICE_NAMES[role]
        assert ("EDGE_ADMIN_LOGIN_PER_MINUTE" in values) == (role == "admin"), role


def test_a_placeholder_the_role_reads_without_a_value_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(proxy, "values", lambda config: {"EDGE_ROLE": config.role})
    with pytest.raises(ValueError, match="no value for"):
        proxy.fill(tmp_path, config("payments"))


def test_envsubst_and_the_local_filler_make_the_same_files(tmp_path):
    """What the nginx image does (gettext's envsubst, restricted to the EDGE_* names) and what
    `make up` does (devstack.proxy.fill) give the same text."""
    inner = {
        "metrics_listen": "127.0.0.1:2",
        "http_listen": f"unix:{tmp_path}/http.sock",
        "metrics_http_listen": f"unix:{tmp_path}/metrics.sock",
    }
    values = proxy.values(config("admin", **inner))
    names = " ".join(f"${{{name}}}" for name in values)
    proxy.fill(tmp_path, config("admin", **inner))
    for path in sorted(proxy.DIRECTORY.glob(f"*{proxy.SUFFIX}")):
        filled = subprocess.run(
            ["envsubst", names],
            input=path.read_text(),
            env=values,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert filled == (tmp_path / path.name.removesuffix(proxy.SUFFIX)).read_text(), path.name


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("metrics", [False, True], ids=["one-port", "metrics-port"])
def test_nginx_accepts_every_shape_a_role_runs_in(tmp_path, role, tls, metrics):
    files = ensure_tls(tmp_path / "tls") if tls else None
    fields = {
        "metrics_listen": "127.0.0.1:2" if metrics else None,
        "tls_certificate": str(files.certificate) if files else None,
        "tls_key": str(files.key) if files else None,
    }
    prefix = tmp_path / "pod"
    prefix.mkdir()
    conf = proxy.fill(prefix, config(role, **fields))
    checked = subprocess.run(
        [proxy.NGINX, "-t", "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "e.log")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr
    text = "\n".join(p.read_text() for p in Path(prefix).glob("*.conf"))
    assert ("ssl_certificate " in (prefix / "tls-on.conf").read_text()) and (
        (f"listen unix:{prefix}/http.sock ssl proxy_protocol" in text) == tls
    )
    assert "listen 127.0.0.1:1;" in text  # the stream hop: bytes as they are


def test_every_listener_is_capped_per_address_at_accept_and_http_listens_only_inside(tmp_path):
    """The role's port and the monitoring listener are the stream module's (limit_conn per
    address at accept); every http server listens only on an inner listener, with the PROXY
    protocol, and takes the client's address from it."""
    conf = proxy.fill(tmp_path, config("payments", metrics_listen="127.0.0.1:2"))
    main = conf.read_text()
    stream = main[main.index("\nstream {") : main.index("\nhttp {")]
    assert "limit_conn tcp_per_client 512;" in stream
    assert "listen 127.0.0.1:1;" in stream and f"proxy_pass unix:{tmp_path}/http.sock;" in stream
    metrics_stream = (tmp_path / "stream-metrics-on.conf").read_text()
    assert "listen 127.0.0.1:2;" in metrics_stream
    assert f"proxy_pass unix:{tmp_path}/metrics.sock;" in metrics_stream
    http = main[main.index("\nhttp {") :] + (tmp_path / "metrics-on.conf").read_text()
    listens = re.findall(r"^\s*listen (\S+)[^;]*;", http, re.MULTILINE)
    assert listens and all(addr.startswith(f"unix:{tmp_path}/") for addr in listens), listens
    assert all("proxy_protocol" in line for line in re.findall(r"^\s*listen .*$", http, re.M))
    assert "real_ip_header proxy_protocol;" in http and "set_real_ip_from unix:;" in http


def test_a_worker_connections_that_cannot_hold_one_address_and_the_sum_is_refused():
    """A client connection costs three of nginx's connections, a forwarded request four: one
    address at PROXY_TCP_PER_CLIENT and PROXY_CONN_PER_PROXY in progress must fit, with gunicorn's
    idle keep-alives, below worker_connections."""
    env = {"PROXY_WORKER_CONNECTIONS": "512", "PROXY_CONN_PER_PROXY": "160"}
    with pytest.raises(ValueError, match="PROXY_WORKER_CONNECTIONS"):
        proxy.values(config("payments", env=env))
    assert proxy.connection_budget({}) == 3 * 512 + 4 * 512 + 64 < 4096
    values = proxy.values(config("payments"))
    assert values["EDGE_TCP_PER_CLIENT"] == "512" and values["EDGE_WORKER_CONNECTIONS"] == "4096"
    for component in proxy.K8S_ROLES:
        k8s = proxy.kubernetes_values(component)
        assert k8s["EDGE_TCP_PER_CLIENT"] == "256" and k8s["EDGE_STREAM_MODULE"] == "builtin"
