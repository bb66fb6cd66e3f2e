"""The middleware lists (ARCHITECTURE decision 22): the roles with a /v1 surface run dlock's two
layers and no page middleware at all; the admin (and the ops overlay the suite runs on) Django's
stock list; every request still gets its headers, envelope and metrics."""

from __future__ import annotations

import importlib
import re

import pytest
from django.test import Client
from prometheus_client import REGISTRY, generate_latest

pytestmark = pytest.mark.django_db(databases="__all__")

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


PAGE_MIDDLEWARE = {
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "axes.middleware.AxesMiddleware",
}
PAGE_APPS = {
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "csp",
    "axes",
}
MACHINE_ROLES = ("lockserver", "payments", "railproxy", "railstub")


def _overlay(role: str):
    return importlib.import_module(f"settings.{role}")


@pytest.mark.parametrize("role", MACHINE_ROLES)
def test_a_machine_role_runs_no_page_middleware_and_silences_no_check(role):
    """ARCHITECTURE decision 22: payment-resource (and every role with a /v1 surface) has no
    page middleware, no admin app, and no system check silenced to make that look fine."""
    overlay = _overlay(role)
    assert not PAGE_MIDDLEWARE & set(overlay.MIDDLEWARE), role
    assert not PAGE_APPS & set(overlay.INSTALLED_APPS), role
    assert "dlock.middleware.PagesMiddleware" not in overlay.MIDDLEWARE
    for gone in ("DLOCK_PAGE_MIDDLEWARE", "DLOCK_MACHINE_PATHS"):
        assert not hasattr(overlay, gone), (role, gone)
    assert not getattr(overlay, "SILENCED_SYSTEM_CHECKS", [])


@pytest.mark.parametrize("role", ["admin", "ops"])
def test_the_admin_and_ops_run_djangos_stock_list_in_its_order_and_silence_nothing(role):
    overlay = _overlay(role)
    stock = [
        "django.middleware.security.SecurityMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    ]
    assert [m for m in overlay.MIDDLEWARE if m in stock] == stock
    assert not getattr(overlay, "SILENCED_SYSTEM_CHECKS", [])
    if role == "admin":
        middleware = overlay.MIDDLEWARE
        assert "csp.middleware.CSPMiddleware" in middleware
        # django-axes last of the page middlewares, as its documentation asks
        assert middleware.index("axes.middleware.AxesMiddleware") > max(
            middleware.index(m) for m in stock
        )
        assert overlay.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"], "ip_address"]
        assert overlay.ROOT_URLCONF == "admin.urls"


def test_a_json_call_gets_content_length_the_trace_id_and_the_security_headers(client):
    response = client.get(
        "/v1/accounts/no-such-account",
        HTTP_ACCEPT="application/json",
        HTTP_TRACEPARENT=TRACEPARENT,
    )
    headers = dict(response.headers)
    assert response.status_code == 404
    assert response.json()["traceId"] == "0af7651916cd43dd8448eb211c80319c"
    assert int(headers["Content-Length"]) == len(response.content)  # EdgeMiddleware sets it
    for name in ("Referrer-Policy", "Cross-Origin-Opener-Policy", "X-Frame-Options"):
        assert name in headers, name  # SecurityMiddleware's and ours


def test_a_json_call_with_a_foreign_host_is_refused(client):
    foreign = {"HTTP_HOST": "evil.example", "HTTP_TRACEPARENT": TRACEPARENT}
    read = client.get("/v1/accounts/no-such-account", HTTP_ACCEPT="application/json", **foreign)
    write = client.post(
        "/v1/payouts/00000000-0000-4000-8000-000000000000/claim",
        data=b"{}",
        content_type="application/json",
        **foreign,
    )
    assert read.status_code == write.status_code == 400
    assert read.json()["code"] == write.json()["code"] == "VALIDATION_FAILED"


def _answer(client, accept: str):
    response = client.get(
        "/v1/accounts/no-such-account", HTTP_ACCEPT=accept, HTTP_TRACEPARENT=TRACEPARENT
    )
    return response, dict(response.headers)


def test_request_metrics_keep_their_names_labels_and_count_each_request_once(client):
    # django-prometheus' middlewares count a machine's /v1 call, which skips the page stack.
    labels = {"view": "account-detail", "method": "GET"}
    before = (
        _sample("django_http_requests_before_middlewares_total"),
        _sample("django_http_requests_total_by_method_total", method="GET"),
        _sample("django_http_requests_latency_seconds_by_view_method_count", **labels),
        _sample("django_http_responses_total_by_status_view_method_total", status="404", **labels),
    )

    _answer(client, "application/json")

    after = (
        _sample("django_http_requests_before_middlewares_total"),
        _sample("django_http_requests_total_by_method_total", method="GET"),
        _sample("django_http_requests_latency_seconds_by_view_method_count", **labels),
        _sample("django_http_responses_total_by_status_view_method_total", status="404", **labels),
    )
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1, 1]
    text = generate_latest(REGISTRY).decode()
    # django-prometheus' buckets, which the dashboard's quantiles were drawn on.
    assert re.search(
        r'django_http_requests_latency_seconds_by_view_method_bucket\{le="0\.075",method="GET",'
        r'view="account-detail"\}',
        text,
    )


def _request_families() -> set[str]:
    return {m.name for m in REGISTRY.collect() if m.name.startswith("django_http_")}


def test_a_request_updates_only_the_request_series_dlock_reads(client):
    # dlock.prometheus: django-prometheus' middlewares through its Metrics hook; the series the
    # dashboard, alerts, runbooks and tests read, and the exceptions', nothing per request else.
    _answer(client, "application/json")
    client.get("/v1/docs")  # a DRF template response, which the stock pair also counted by name

    assert _request_families() == {
        "django_http_requests_before_middlewares",
        "django_http_requests_total_by_method",
        "django_http_requests_latency_seconds_by_view_method",
        "django_http_responses_total_by_status_view_method",
        "django_http_exceptions_total_by_type",
        "django_http_exceptions_total_by_view",
        "django_http_requests_unknown_latency",
    }
    text = generate_latest(REGISTRY).decode()
    for dropped in (
        "django_http_requests_body_total_bytes",
        "django_http_responses_total_by_charset",
        "django_http_requests_latency_including_middlewares_seconds",
        "django_http_responses_total_by_templatename",
    ):
        assert dropped not in text, dropped


def test_an_unknown_method_is_501_and_never_a_metric_label(client):
    before = _sample("django_http_requests_before_middlewares_total")

    response = client.generic("BREW", "/v1/accounts/x")

    assert response.status_code == 501 and response.json()["code"] == "VALIDATION_FAILED"
    assert response["X-Content-Type-Options"] == "nosniff"
    # Counted by the before-middleware (no labels), refused before its labelled series.
    assert _sample("django_http_requests_before_middlewares_total") == before + 1
    assert "BREW" not in generate_latest(REGISTRY).decode()


def test_admin_pages_still_run_sessions_csrf_and_static_files(client):
    login = client.get("/admin/login/")
    static = client.get("/static/admin/css/base.css")

    assert login.status_code == 200
    assert "csrftoken" in login.cookies  # CsrfViewMiddleware ran for the page
    assert login["X-Frame-Options"] == "DENY"
    assert static.status_code == 200  # whitenoise still serves the admin's files
    assert b"".join(static.streaming_content)


def test_a_post_to_the_admin_without_a_csrf_token_is_refused():
    response = Client(enforce_csrf_checks=True).post(
        "/admin/login/", {"username": "x", "password": "y"}
    )

    assert response.status_code == 403


def test_the_browsable_api_answers_html(client):
    response = client.get("/v1/payouts", HTTP_ACCEPT="text/html")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
