"""Which requests the plain read views (P1, P4; dlock.hotview.hot_read_view) take: a machine's
JSON GET is answered plainly, anything DRF would negotiate otherwise (HTML, an indent, a
`?format=`) by the DRF class. test_differential.py proves the answers equal on the wire; this
proves the plain path is the one the executor's reads take, and the browsable API is DRF's."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import RequestFactory
from rest_framework.response import Response

from dlock.hotview import negotiates_plain_json
from tests.payments import factories

pytestmark = pytest.mark.django_db(databases="__all__")

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


@pytest.mark.parametrize(
    ("accept", "query", "plain"),
    [
        (None, "", True),
        ("application/json", "", True),  # the executor's (dlock.http)
        ("*/*", "state=PENDING&limit=100", True),  # requests' default
        ("application/*", "", True),
        ("application/json", "format=json", False),  # URL_FORMAT_OVERRIDE wins over Accept
        ("application/json", "format=api", False),
        ("application/json", "format", False),
        ("application/json; indent=4", "", False),
        ("application/json;indent=4", "", False),
        ("*/*;q=0.8", "", False),
        ("", "", False),
        (" application/json", "", False),
        ("application/json, text/html", "", False),
        ("text/html", "", False),
        (BROWSER, "", False),
        ("application/xml", "", False),
    ],
)
def test_only_a_request_drf_would_answer_with_compact_json_is_plain(accept, query, plain):
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    request = RequestFactory().get(f"/v1/payouts?{query}", **headers)
    assert negotiates_plain_json(request) is plain


@pytest.mark.parametrize("route", ["list", "detail", "unknown"])
def test_the_executors_reads_take_the_plain_view_and_a_browser_gets_drf(client, route):
    payout = factories.payout(factories.account())
    path = {
        "list": "/v1/payouts?limit=2",
        "detail": f"/v1/payouts/{payout.payout_id}",
        "unknown": f"/v1/payouts/{uuid.uuid4()}",
    }[route]
    machine = client.get(path, HTTP_ACCEPT="application/json")
    browser = client.get(path, HTTP_ACCEPT=BROWSER)
    indented = client.get(path, HTTP_ACCEPT="application/json; indent=4")

    assert machine["Content-Type"] == "application/json; charset=utf-8"
    assert machine["Vary"] == "Accept"
    for response in (machine, browser, indented):
        assert response["Allow"] == "GET, HEAD, OPTIONS"
        assert response["Vary"].startswith("Accept")  # a page also varies on Cookie
    if route == "unknown":  # the envelope, as JSON, whichever path answered it
        assert machine.status_code == browser.status_code == indented.status_code == 404
        assert browser["Content-Type"] == "application/json; charset=utf-8"
        assert machine.content.replace(machine.json()["traceId"].encode(), b"") == (
            browser.content.replace(browser.json()["traceId"].encode(), b"")
        )
        return
    assert not isinstance(machine, Response)  # no DRF Response: the plain view answered
    assert isinstance(indented, Response) and isinstance(browser, Response)
    assert machine.status_code == browser.status_code == indented.status_code == 200
    assert browser["Content-Type"] == "text/html; charset=utf-8"
    assert b"<html" in browser.content
    assert indented.content.startswith(b"{\n    ")
    assert json.loads(indented.content) == machine.json()
    assert str(payout.payout_id) in machine.content.decode()


def test_head_and_wrong_methods_stay_with_drf(client):
    head = client.head("/v1/payouts")
    wrong = client.post("/v1/payouts", data=b"{}", content_type="application/json")

    assert isinstance(head, Response) and head.status_code == 200
    assert wrong.status_code == 405 and wrong["Allow"] == "GET, HEAD, OPTIONS"
    assert wrong.json()["code"] == "VALIDATION_FAILED"
