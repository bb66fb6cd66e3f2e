"""The OpenAPI document: one envelope component behind every documented error, C3 shapes."""

from __future__ import annotations

import pytest

from dlock.schema import CONTRACT

pytestmark = pytest.mark.django_db(databases=["default"])


@pytest.fixture
def schema(client):
    response = client.get("/v1/schema")
    assert response.status_code == 200
    return response.json()


def operations(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def test_every_error_response_of_every_operation_is_the_shared_envelope(schema):
    envelope = schema["components"]["schemas"]["ErrorEnvelope"]
    assert envelope["additionalProperties"] is False
    assert set(envelope["required"]) == {"code", "message", "retrySafe", "traceId"}
    for path, method, operation in operations(schema):
        errors = {s: r for s, r in operation["responses"].items() if s[0] in "45"}
        assert {"400", "404", "500", "503", "504"} <= set(errors), (method, path)
        for status, response in errors.items():
            ref = response["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/ErrorEnvelope", (method, path, status)


def test_every_contract_operation_is_served_and_documented_with_its_c3_shape(schema):
    served = {(method, path) for path, method, _ in operations(schema)}
    assert set(CONTRACT) <= served
    claim = schema["paths"]["/v1/payouts/{payout_id}/claim"]["post"]
    headers = {p["name"] for p in claim["parameters"] if p["in"] == "header"}
    assert headers == {"X-Fencing-Token", "X-Owner-Id", "X-Idempotency-Key"}
    assert {"409", "422"} <= set(claim["responses"])
    sessions = schema["paths"]["/v1/sessions"]["post"]
    assert "201" in sessions["responses"] and "200" not in sessions["responses"]


def test_the_docs_pages_point_at_the_local_schema_and_assets(client):
    page = client.get("/v1/docs").content.decode()
    assert "/v1/schema" in page and "/static/drf_spectacular_sidecar/" in page
    assert "cdn.jsdelivr" not in page and "unpkg" not in page
    redoc = client.get("/v1/redoc").content.decode()
    assert "/static/drf_spectacular_sidecar/redoc" in redoc
