"""The three middleware layers (dlock.middleware): a machine's /v1 call skips the page
middlewares and still gets every header, envelope and metric the full stack gives; pages and
static files still get the full stack."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from prometheus_client import REGISTRY, generate_latest

pytestmark = pytest.mark.django_db(databases="__all__")

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _answer(client, accept: str):
    response = client.get(
        "/v1/accounts/no-such-account", HTTP_ACCEPT=accept, HTTP_TRACEPARENT=TRACEPARENT
    )
    return response, dict(response.headers)


def test_a_json_call_gets_the_same_answer_as_through_the_whole_page_stack(client):
    fast, fast_headers = _answer(client, "application/json")
    full, full_headers = _answer(client, "text/html")  # the browsable API's path: every layer

    assert fast.status_code == full.status_code == 404
    assert fast.content == full.content  # the same envelope, the same traceId
    assert fast.json()["traceId"] == "0af7651916cd43dd8448eb211c80319c"
    assert fast_headers == full_headers
    assert int(fast_headers["Content-Length"]) == len(fast.content)  # as CommonMiddleware sets it
    for name in ("Referrer-Policy", "Cross-Origin-Opener-Policy", "X-Frame-Options"):
        assert name in fast_headers, name  # SecurityMiddleware's and ours


def test_a_json_call_with_a_foreign_host_is_refused_as_the_whole_page_stack_refuses_it(client):
    # CommonMiddleware enforces ALLOWED_HOSTS (request.get_host()); skipping the page stack
    # for a /v1 call must not skip that check. Before the fix the lookup was served (404) and
    # a write reached its view (401 for want of a credential).
    foreign = {"HTTP_HOST": "evil.example", "HTTP_TRACEPARENT": TRACEPARENT}
    fast = client.get("/v1/accounts/no-such-account", HTTP_ACCEPT="application/json", **foreign)
    full = client.get("/v1/accounts/no-such-account", HTTP_ACCEPT="text/html", **foreign)
    write = client.post(
        "/v1/payouts/00000000-0000-4000-8000-000000000000/claim",
        data=b"{}",
        content_type="application/json",
        **foreign,
    )

    assert fast.status_code == full.status_code == write.status_code == 400
    assert fast.content == full.content
    assert fast.json()["code"] == write.json()["code"] == "VALIDATION_FAILED"
    assert dict(fast.headers) == dict(full.headers)
    allowed = client.get("/v1/accounts/no-such-account", HTTP_ACCEPT="application/json")
    assert allowed.status_code == 404


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


def test_an_unknown_method_is_501_and_never_a_metric_label(client):
    before = _sample("django_http_requests_before_middlewares_total")

    response = client.generic("BREW", "/v1/accounts/x")

    assert response.status_code == 501 and response.json()["code"] == "VALIDATION_FAILED"
    assert response["X-Content-Type-Options"] == "nosniff"
    # Counted by PrometheusBeforeMiddleware (no labels), refused before its labelled series.
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


def test_the_browsable_api_keeps_the_whole_stack(client):
    response = client.get("/v1/payouts", HTTP_ACCEPT="text/html")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")


def test_the_rail_stubs_submit_is_a_machine_call_like_a_v1_call(settings, rf):
    from django.http import HttpResponse

    from dlock.middleware import PagesMiddleware, _is_api_call
    from settings import railstub

    assert railstub.DLOCK_MACHINE_PATHS == frozenset({"/submit"})
    settings.DLOCK_MACHINE_PATHS = railstub.DLOCK_MACHINE_PATHS
    pages_ran: list[str] = []
    layer = PagesMiddleware(lambda request: HttpResponse(b"{}"))
    full = layer.pages
    layer.pages = lambda request: pages_ran.append(request.path) or full(request)
    machine = layer.machine_paths
    host = {"HTTP_HOST": "127.0.0.1"}

    assert _is_api_call(rf.post("/submit", **host), machine)
    response = layer(rf.post("/submit", **host))
    assert pages_ran == [] and response["Content-Length"] == "2"
    for request in (
        rf.post("/submit", HTTP_HOST="evil.example"),  # CommonMiddleware's 400 is the pages'
        rf.post("/submit", HTTP_ACCEPT="text/html", **host),  # the browsable API
        rf.post("/submit?format=api", **host),
        rf.post("/submit/", **host),
        rf.post("/submitted", **host),
    ):
        assert not _is_api_call(request, machine), request.get_full_path()
    assert not _is_api_call(rf.post("/submit", **host))  # a role without machine paths
    settings.DISALLOWED_USER_AGENTS = [re.compile("curl")]  # CommonMiddleware would act
    assert PagesMiddleware(lambda request: None).machine_paths == frozenset()
