"""The page routes behind each role's nginx: small bodies only, no gunicorn HTML for a client's
scheme headers, and under TLS the admin's cookies Secure and HSTS on every answer."""

from __future__ import annotations

import os
import uuid

import pytest
import requests

from devstack.common import free_port
from devstack.roles import RoleProcess, manage
from devstack.secrets_env import role_environment
from devstack.tls import ensure_tls
from tests.conftest import migrated_db
from tests.production.test_proxy_limits import assert_envelope, exchange

pytestmark = [pytest.mark.live, pytest.mark.slow]

HSTS = "max-age=31536000"


@pytest.fixture(scope="module")
def paydb() -> dict[str, str]:
    return {
        "PAY_DATABASE_URL": migrated_db(
            f"pages_{uuid.uuid4().hex[:10]}", "admin", "PAY_DATABASE_URL"
        ),
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DJANGO_DEBUG": "false",
    }


@pytest.fixture(scope="module")
def admin(paydb, tmp_path_factory):
    logdir = tmp_path_factory.mktemp("pages-admin")
    env = role_environment("admin", paydb)
    proc = RoleProcess("admin", free_port(), env, logdir / "admin.log", inherit_environ=False)
    yield proc.start()
    proc.stop()


@pytest.fixture(scope="module")
def admin_tls(paydb, tmp_path_factory):
    """The admin as `make up TLS=1` runs it: its proxy on https, DLOCK_TLS=1 in its env."""
    base = tmp_path_factory.mktemp("pages-admin-tls")
    files = ensure_tls(base / "tls")
    env = {
        **role_environment("admin", paydb),
        "DLOCK_TLS": "1",
        "DLOCK_CA_BUNDLE": str(files.ca),
    }
    proc = RoleProcess(
        "admin",
        free_port(),
        env,
        base / "admin.log",
        inherit_environ=False,
        tls=(str(files.certificate), str(files.key)),
    )
    yield proc.start(), str(files.ca)
    proc.stop()


@pytest.fixture(scope="module")
def payments(paydb, tmp_path_factory):
    logdir = tmp_path_factory.mktemp("pages-payments")
    proc = RoleProcess("payments", free_port(), paydb, logdir / "payments.log").start()
    yield proc
    proc.stop()


def post(port: int, path: bytes, size: int) -> bytes:
    head = (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded"
        b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (path, size)
    )
    return exchange(port, head + b"a" * size)


@pytest.mark.parametrize("path", [b"/admin/login/", b"/admin/payments/payout/", b"/admin/x/"])
def test_an_admin_page_takes_no_body_over_16_kib(admin, path):
    assert_envelope(post(admin.port, path, 20 * 1024), 413, "VALIDATION_FAILED")
    within = post(admin.port, path, 8 * 1024)
    assert b" 413 " not in within.split(b"\r\n", 1)[0], within[:300]


@pytest.mark.parametrize("path", [b"/", b"/static/x.css", b"/anything"])
def test_a_page_of_payment_resource_takes_no_body_over_1_kib(payments, path):
    assert_envelope(post(payments.port, path, 2 * 1024), 413, "VALIDATION_FAILED")


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Forwarded-Ssl": "on", "X-Forwarded-Proto": "http"},
        {"X-Forwarded-Protocol": "ssl"},
        {"X-Forwarded-Ssl": "off", "X-Forwarded-Protocol": "ssl"},
    ],
    ids=["ssl", "protocol", "both"],
)
def test_a_client_s_scheme_headers_on_a_page_never_get_gunicorn_s_html_400(
    admin, payments, headers
):
    for url in (f"{admin.url}/admin/login/", f"{payments.url}/v1/docs"):
        answer = requests.get(url, headers=headers, timeout=30)
        assert answer.status_code == 200, (url, answer.status_code, answer.text[:300])
        assert "Contradictory" not in answer.text


def test_under_tls_the_admin_s_cookies_are_secure_and_every_answer_carries_hsts(admin_tls):
    proc, ca = admin_tls
    login = requests.get(f"{proc.url}/admin/login/", verify=ca, timeout=30)
    assert login.status_code == 200
    assert login.headers["Strict-Transport-Security"] == HSTS
    cookies = {cookie.name: cookie for cookie in login.cookies}
    assert cookies["csrftoken"].secure, login.headers.get("Set-Cookie")
    # the proxy's own answers too (an envelope), and the probes
    for path in ("/_dlock/x", "/health/live"):
        answer = requests.get(f"{proc.url}{path}", verify=ca, timeout=30)
        assert answer.headers["Strict-Transport-Security"] == HSTS, path


def test_under_tls_the_proxy_marks_cookies_secure_whatever_the_role_sets(paydb, tmp_path):
    """DLOCK_SECURE_COOKIES=false (a mistake): the proxy still makes every cookie Secure."""
    files = ensure_tls(tmp_path / "tls")
    env = {
        **role_environment("admin", paydb),
        "DLOCK_SECURE_COOKIES": "false",
        "DLOCK_CA_BUNDLE": str(files.ca),
    }
    proc = RoleProcess(
        "admin",
        free_port(),
        env,
        tmp_path / "admin.log",
        inherit_environ=False,
        tls=(str(files.certificate), str(files.key)),
    ).start()
    try:
        login = requests.get(f"{proc.url}/admin/login/", verify=str(files.ca), timeout=30)
    finally:
        proc.stop()
    assert "secure" in login.headers["Set-Cookie"].lower(), login.headers["Set-Cookie"]


def test_without_tls_there_is_no_hsts(admin):
    login = requests.get(f"{admin.url}/admin/login/", timeout=30)
    assert login.status_code == 200 and "Strict-Transport-Security" not in login.headers


@pytest.mark.parametrize(
    ("env", "secure"),
    [
        ({}, False),
        ({"DLOCK_TLS": "1"}, True),  # what `make up TLS=1` gives every role
        ({"DLOCK_TLS": "1", "DLOCK_SECURE_COOKIES": "false"}, False),  # an explicit choice
        ({"DLOCK_SECURE_COOKIES": "true"}, True),  # k8s
    ],
)
def test_django_sets_secure_cookies_whenever_the_stack_runs_tls(paydb, env, secure):
    shown = manage(
        [
            "shell",
            "-c",
            "from django.conf import settings; "
            "print(settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE)",
        ],
        {**role_environment("admin", paydb), "DLOCK_TLS": "", "DLOCK_SECURE_COOKIES": "", **env},
        role="admin",
        capture=True,
    )
    assert shown.stdout.split()[-2:] == [str(secure), str(secure)]
