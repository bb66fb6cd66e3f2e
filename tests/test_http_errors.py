"""Every non-2xx is the C3 envelope: unknown route, wrong method, bad media, bad JSON, too big."""

from __future__ import annotations

import re

import pytest
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from dlock.urls import common_patterns, handler404, handler500  # noqa: F401


class EchoView(APIView):
    def post(self, request):
        return Response({"received": request.data})


def boom(request):
    raise RuntimeError("secret stack detail")


urlpatterns = [path("echo", EchoView.as_view()), path("boom", boom), *common_patterns()]

ENVELOPE_KEYS = {"code", "message", "retrySafe", "retryAfterMillis", "details", "traceId"}


def assert_envelope(response, status, code="VALIDATION_FAILED"):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json; charset=utf-8"
    body = response.json()
    assert body["code"] == code
    assert set(body) <= ENVELOPE_KEYS
    assert "Traceback" not in response.content.decode()
    if code == "VALIDATION_FAILED":  # C3 3.2: always with details.fields[]
        assert body["details"]["fields"] and all(
            set(f) == {"field", "message"} for f in body["details"]["fields"]
        )
    assert int(response["Content-Length"]) == len(response.content)
    return body


pytestmark = pytest.mark.urls(__name__)


def post(client, body, content_type="application/json", **extra):
    return client.post("/echo", data=body, content_type=content_type, **extra)


def test_unknown_path_is_not_found(client):
    assert_envelope(client.get("/nope"), 404, "NOT_FOUND")


def test_wrong_method_is_405_with_allow(client):
    response = client.get("/echo")
    assert_envelope(response, 405)
    assert "POST" in response["Allow"]


def test_unsupported_media_type_is_415(client):
    assert_envelope(post(client, "a=b", "application/x-www-form-urlencoded"), 415)


@pytest.mark.parametrize(
    "raw",
    [
        "{",
        '{"a": NaN}',
        '{"a": Infinity}',
        '{"a": -Infinity}',
        '{"a": 1, "a": 2}',
        "[1, 2]",
        '"just a string"',
        "[" * 100 + "]" * 100,
        '{"a":' * 5000 + "1" + "}" * 5000,
    ],
)
def test_bad_json_is_validation_failed(client, raw):
    assert_envelope(post(client, raw), 400)


@pytest.mark.parametrize(
    ("url", "field"),
    [("/nope\x00", "path"), ("/echo?q=a%00b", "query"), ("/health/live?%00=1", "query")],
)
def test_a_nul_character_in_the_path_or_query_is_refused_before_any_view(client, url, field):
    body = assert_envelope(client.get(url), 400)
    assert body["details"]["fields"][0]["field"] == field


def test_invalid_utf8_is_validation_failed(client):
    assert_envelope(post(client, b'{"a": "\xff"}'), 400)


def test_body_over_the_limit_is_413(client, settings):
    big = '{"a": "' + "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10) + '"}'
    assert_envelope(post(client, big), 413)


def test_chunked_body_is_refused_with_envelope(client):
    response = client.post(
        "/echo", data=b"{}", content_type="application/json", HTTP_TRANSFER_ENCODING="chunked"
    )
    assert_envelope(response, 411)


def test_valid_json_passes(client):
    response = post(client, '{"a": [1, {"b": null}]}')
    assert response.status_code == 200
    assert response.json() == {"received": {"a": [1, {"b": None}]}}


def test_uncaught_exception_is_internal_without_stack(client):
    client.raise_request_exception = False
    body = assert_envelope(client.get("/boom"), 500, "INTERNAL")
    assert "secret stack detail" not in body["message"]


def test_liveness_needs_no_database(client):
    response = client.get("/health/live")
    assert response.status_code == 200
    assert response.json()["status"] == "UP"


@pytest.mark.django_db(databases=["default", "lockdb", "raildb"])
def test_readiness_round_trips_every_database(client):
    response = client.get("/health/ready")
    assert response.status_code == 200, response.content
    assert set(response.json()["checks"].values()) == {"UP"}


def test_metrics_list_every_labelled_series(client):
    # Other in-process tests may have counted already; zero-at-start-up is checked on fresh
    # processes in test_roles_live.py.
    text = client.get("/metrics").content.decode()
    for resource in ("account", "ledger", "rail"):
        assert re.search(rf'^lock_fenced_out_total{{resource="{resource}"}} \d', text, re.M)
    assert re.search(r"^rail_duplicate_attempted_total \d", text, re.M)
    assert re.search(r'^payout_execute_total{outcome="ambiguous"} \d', text, re.M)
    assert 'lock_acquire_total{backend="pg",outcome="granted"}' in text
    assert "payout_id" not in text and "account_id" not in text


def test_a_foreign_host_is_one_aggregated_warning_not_an_error_with_a_traceback(
    client, settings, capsys, monkeypatch
):
    """DisallowedHost reaches Django only when the proxy is bypassed; even then it is a client's
    mistake: 400, and the aggregated `host_refused` event (with a count), never one ERROR line
    with a traceback per request."""
    import logging.config

    from dlock.logs import hosts_refused

    logging.config.dictConfig(settings.LOGGING)
    # as in a fresh process: an earlier test's refusal within the last second would hold the line
    monkeypatch.setattr(hosts_refused, "_last", 0.0)
    for _ in range(30):
        response = client.get("/v1/schema", HTTP_HOST="evil.example")
        assert response.status_code == 400
    lines = capsys.readouterr().err.splitlines()
    assert not [line for line in lines if '"ERROR"' in line or "Traceback" in line], lines[:3]
    refused = [line for line in lines if '"host_refused"' in line]
    assert 1 <= len(refused) <= 2
