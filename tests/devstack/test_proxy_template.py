"""deploy/nginx/ is filled by three rules (devstack/proxy_template.py), and what two files must say
alike is checked before anything is rendered (devstack/proxy.py `check_templates`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack import proxy, proxy_template


def config(role: str, **env: str) -> proxy.ProxyConfig:
    return proxy.ProxyConfig(
        role=role,
        listen="127.0.0.1:1",
        upstream="unix:/nowhere.sock",
        prefix=Path("/nowhere"),
        error_log="stderr",
        env=env,
    )


def test_sections_nest_includes_indent_and_values_fill(tmp_path):
    template = tmp_path / "t.conf"
    template.write_text(
        "a {{A}};\n"
        "{{if ON}}\n"
        "  {{if not OFF}}\n"
        "    {{include tls.conf}}\n"
        "  {{else}}\n"
        "dropped;\n"
        "  {{end}}\n"
        "{{else}}\n"
        "dropped too;\n"
        "{{end}}\n"
    )
    values = {"A": "1", "ON": True, "OFF": False, "TLS_CERTIFICATE": "/c", "TLS_KEY": "/k"}
    values["HSTS"] = "max-age=1"
    text = proxy_template.render(template, values)
    assert text.startswith("a 1;\n    ssl_certificate /c;\n    ssl_certificate_key /k;\n")
    assert "dropped" not in text and "{{" not in text
    assert "# TLS" not in text  # an included file's opening comment stays in its file


@pytest.mark.parametrize(
    ("body", "values", "error"),
    [
        ("a {{MISSING}};\n", {}, "no value for"),
        ("{{if A}}\n", {"A": True}, "without"),
        ("{{end}}\n", {}, "outside a section"),
        ("{{if A}}\n{{end}}\n", {"A": "yes"}, "yes/no"),
        ("a {{A}};\n", {"A": True}, "no value for"),
    ],
)
def test_a_template_the_rules_cannot_fill_is_refused(tmp_path, body, values, error):
    template = tmp_path / "t.conf"
    template.write_text(body)
    with pytest.raises(ValueError, match=error):
        proxy_template.render(template, values)


def test_each_role_gets_its_own_routes_and_only_the_admin_its_login_limit():
    limit = "{\n            client_max_body_size"
    own = {
        "lockserver": f"location ~ ^/v1/locks/[^/]+/revoke$ {limit} 32768;",
        "payments": f"location ~ ^/v1/payouts/[^/]+/claim$ {limit} 1024;",
        "railproxy": f"location /v1/ {limit} 4096;",
        "railstub": f"location = /submit {limit} 4096;",
        "admin": "limit_req zone=admin_login burst=20 nodelay;",
    }
    for role, expected in own.items():
        text = proxy.render(config(role))
        assert expected in text, role
        assert ("limit_req_zone" in text) == (role == "admin"), role
        assert ("return 444;" in text) == (role == "railstub"), role  # PROXY_PASS_DROPS


def test_the_envelope_headers_must_be_dlock_wires(monkeypatch):
    proxy.check_templates()
    monkeypatch.setattr(proxy, "SECURITY_HEADERS", {**proxy.SECURITY_HEADERS, "X-New": "1"})
    with pytest.raises(ValueError, match="envelope-headers.conf"):
        proxy.render(config("payments"))


def test_the_control_byte_map_must_check_every_forwarded_header(monkeypatch, tmp_path):
    template = tmp_path / "dlock.conf.tmpl"
    template.write_text(proxy.TEMPLATE.read_text().replace("|$http_user_agent", ""))
    monkeypatch.setattr(proxy, "TEMPLATE", template)
    with pytest.raises(ValueError, match="dlock_header_ctl"):
        proxy.render(config("payments"))
