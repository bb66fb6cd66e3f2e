"""Each role's own /v1/schema against C3: every contract path with its statuses and fields, no
extra path, explicit unique operation ids, the C3 headers, and one envelope behind every error.

C3 below is transcribed from the contract tables (§3.3–3.6), independently of the apps'
openapi.py declarations, so a drift between the two fails here.
"""

from __future__ import annotations

import pytest
import requests

from tests.conftest import ROLES

ENVELOPE = "#/components/schemas/ErrorEnvelope"
# Paths a role may serve besides C3's; none of them is an API operation in the schema today.
ALLOWED_EXTRA = ("/health/", "/metrics", "/v1/schema", "/v1/docs", "/v1/redoc", "/admin/")
STATES = {
    "PENDING",
    "CLAIMED",
    "SUBMITTING",
    "RAIL_ACKED",
    "POSTED",
    "FAILED",
    "ABANDONED",
    "RAIL_AMBIGUOUS",
}
GRANT = {"key", "ownerId", "sessionId", "fencingToken", "fencingProof", "acquiredAt", "expiresAt"}

# role -> (method, path) -> (2xx status, error statuses C3 lists, 2xx body fields C3 names)
C3: dict[str, dict[tuple[str, str], tuple[str, set[str], set[str]]]] = {
    "lockserver": {
        ("post", "/v1/sessions"): (
            "201",
            {"400", "503"},
            {"sessionId", "ownerId", "ttlMillis", "expiresAt"},
        ),
        ("post", "/v1/sessions/{session_id}/heartbeat"): (
            "200",
            {"404", "410", "503"},
            {"sessionId", "expiresAt", "serverTime", "heldLockCount"},
        ),
        ("delete", "/v1/sessions/{session_id}"): ("204", {"404", "503"}, set()),
        ("post", "/v1/locks/{key}/acquire"): (
            "200",
            {"409", "429", "404", "410", "503"},
            GRANT,
        ),
        ("post", "/v1/locks/{key}/renew"): ("200", {"409", "400", "410"}, GRANT),
        ("delete", "/v1/locks/{key}"): ("204", {"409", "400"}, set()),
        ("get", "/v1/locks/{key}"): (
            "200",
            {"404"},
            {"key", "held", "ownerId", "fencingToken", "acquiredAt", "expiresAt", "waiterCount"},
        ),
        ("post", "/v1/locks/{key}/revoke"): (
            "200",
            {"404", "409", "400"},
            {"revokedToken", "newTokenFloor", "revocationId"},
        ),
        # ARCHITECTURE decision 25, CHANGELOG row 120: the public keys proofs are checked with
        ("get", "/v1/fencing-keys"): ("200", set(), {"keys", "proofVersion", "signingKid"}),
    },
    "payments": {
        ("get", "/v1/payouts"): ("200", {"400"}, {"items", "nextCursor"}),
        ("post", "/v1/payouts/{payout_id}/claim"): (
            "200",
            {"409", "422", "400"},
            {"payoutId", "state", "claimToken", "accountFence", "attemptCount", "idempotencyKey"},
        ),
        ("post", "/v1/payouts/{payout_id}/post"): (
            "200",
            {"409", "400"},
            {"payoutId", "state", "entries", "balanceMinor"},
        ),
        ("get", "/v1/payouts/{payout_id}"): ("200", {"404"}, {"payoutId", "state", "submissions"}),
        ("get", "/v1/accounts/{account_id}"): (
            "200",
            {"404"},
            {"accountId", "currency", "balanceMinor", "fence", "updatedAt", "ledgerSumMinor"},
        ),
    },
    "railproxy": {
        ("post", "/v1/rail/submissions"): (
            "200",
            {"409", "422", "503", "400"},
            {
                "submissionId",
                "payoutId",
                "presentedToken",
                "outcome",
                "railReference",
                "submittedAt",
                "resolvedAt",
            },
        ),
    },
    "railstub": {("post", "/submit"): ("200", {"402"}, {"railReference", "acceptedAt"})},
}

TOKEN, OWNER, IDEMPOTENCY = "X-Fencing-Token", "X-Owner-Id", "X-Idempotency-Key"
PROOF = "X-Fencing-Proof"  # ARCHITECTURE decision 15: beside every token
PROTECTED = {TOKEN: True, PROOF: True, OWNER: True, IDEMPOTENCY: True}
# (method, path) -> header name -> required (C3 §3.1 and the per-path Request column)
HEADERS: dict[tuple[str, str], dict[str, bool]] = {
    ("post", "/v1/sessions"): {OWNER: False},  # ownerId in the body instead
    ("post", "/v1/sessions/{session_id}/heartbeat"): {OWNER: True},
    ("delete", "/v1/sessions/{session_id}"): {OWNER: True},
    ("post", "/v1/locks/{key}/acquire"): {OWNER: True},
    ("post", "/v1/locks/{key}/renew"): {TOKEN: True, PROOF: True, OWNER: True},
    ("delete", "/v1/locks/{key}"): {TOKEN: True, PROOF: True, OWNER: True},
    ("post", "/v1/payouts/{payout_id}/claim"): PROTECTED,
    ("post", "/v1/payouts/{payout_id}/post"): PROTECTED,
    ("post", "/v1/rail/submissions"): PROTECTED,
}


@pytest.fixture(scope="module")
def schemas(live_stack) -> dict[str, dict]:
    found = {}
    for role in ROLES:
        response = requests.get(f"{live_stack.url(role)}/v1/schema?format=json", timeout=30)
        assert response.status_code == 200, (role, response.text[:500])
        found[role] = response.json()
    return found


def operations(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


@pytest.mark.live
@pytest.mark.parametrize("role", ROLES)
def test_the_role_documents_exactly_its_c3_paths_with_their_statuses_and_fields(schemas, role):
    schema = schemas[role]
    served = {(method, path) for path, method, _ in operations(schema)}
    extra = {op for op in served - set(C3[role]) if not op[1].startswith(ALLOWED_EXTRA)}
    assert not extra, f"{role} documents paths C3 does not list: {sorted(extra)}"
    assert set(C3[role]) <= served, f"{role} misses {sorted(set(C3[role]) - served)}"
    for (method, path), (success, errors, fields) in C3[role].items():
        responses = schema["paths"][path][method]["responses"]
        assert [s for s in responses if s.startswith("2")] == [success], (method, path)
        assert errors <= set(responses), (method, path, errors - set(responses))
        content = responses[success].get("content")
        if not fields:
            assert content is None, (method, path, "documents a body for a bodiless answer")
            continue
        body = resolve(schema, content["application/json"]["schema"])
        assert set(body["properties"]) >= fields, (method, path, fields - set(body["properties"]))


@pytest.mark.live
def test_every_operation_has_an_explicit_unique_operation_id(schemas):
    ids = [op["operationId"] for s in schemas.values() for _, _, op in operations(s)]
    assert len(ids) == len(set(ids)) == sum(len(c) for c in C3.values()), ids
    # drf-spectacular's derived ids look like payouts_retrieve / payouts_retrieve_2
    assert not [i for i in ids if "_" in i], ids


@pytest.mark.live
@pytest.mark.parametrize("role", ROLES)
def test_every_error_response_of_every_operation_is_the_shared_envelope(schemas, role):
    schema = schemas[role]
    envelope = schema["components"]["schemas"]["ErrorEnvelope"]
    assert envelope["additionalProperties"] is False
    assert set(envelope["required"]) == {"code", "message", "retrySafe", "traceId"}
    for path, method, operation in operations(schema):
        errors = {s: r for s, r in operation["responses"].items() if s[0] in "45"}
        assert {"400", "404", "500", "503", "504"} <= set(errors), (method, path)
        for status, response in errors.items():
            body = response["content"]["application/json"]["schema"]
            if role == "railstub" and status in ("402", "500"):
                continue  # the third party's own bodies (C3 §3.6), documented as such
            assert body == {"$ref": ENVELOPE}, (method, path, status)


@pytest.mark.live
@pytest.mark.parametrize("role", ROLES)
def test_c3_headers_and_query_parameters_are_documented_with_their_requiredness(schemas, role):
    for path, method, operation in operations(schemas[role]):
        params = {(p["in"], p["name"]): p for p in operation.get("parameters", [])}
        headers = {
            name: p.get("required", False)
            for (where, name), p in params.items()
            if where == "header"
        }
        assert headers == HEADERS.get((method, path), {}), (method, path)
        if (method, path) == ("delete", "/v1/locks/{key}"):
            assert params[("query", "sessionId")]["required"] is True
            assert params[("query", "sessionId")]["schema"]["format"] == "uuid"
        if (method, path) == ("get", "/v1/payouts"):
            query = {name: p for (where, name), p in params.items() if where == "query"}
            assert set(query) == {"state", "accountId", "limit", "cursor"}
            assert not any(p.get("required") for p in query.values())
            assert set(query["state"]["schema"]["enum"]) == STATES | {""}  # empty: any state
            limit = query["limit"]["schema"]
            assert (limit["minimum"], limit["maximum"]) == (1, 500)


@pytest.mark.live
def test_request_bodies_are_closed_and_spelled_as_in_c3(schemas):
    expected = {
        ("post", "/v1/sessions"): {"ownerId", "ttlMillis"},
        ("post", "/v1/locks/{key}/acquire"): {"sessionId", "ttlMillis", "waitMillis"},
        ("post", "/v1/locks/{key}/renew"): {"sessionId", "ttlMillis"},
        ("post", "/v1/locks/{key}/revoke"): {"operator", "reason", "expectedToken"},
        ("post", "/v1/payouts/{payout_id}/claim"): {"expectedState"},
        ("post", "/v1/payouts/{payout_id}/post"): {"railReference", "submissionId", "railOutcome"},
        ("post", "/v1/rail/submissions"): {
            "payoutId",
            "accountId",
            "amountMinor",
            "currency",
            "beneficiaryRef",
        },
        ("post", "/submit"): {"clientRef", "amountMinor", "currency"},
    }
    seen = {}
    for schema in schemas.values():
        for path, method, operation in operations(schema):
            if "requestBody" in operation:
                body = resolve(
                    schema, operation["requestBody"]["content"]["application/json"]["schema"]
                )
                assert body["additionalProperties"] is False, (method, path)
                seen[(method, path)] = set(body["properties"])
    assert seen == expected


@pytest.mark.django_db(databases=["default"])
def test_the_docs_pages_point_at_the_local_schema_and_assets(client):
    page = client.get("/v1/docs").content.decode()
    assert "/v1/schema" in page and "/static/drf_spectacular_sidecar/" in page
    assert "cdn.jsdelivr" not in page and "unpkg" not in page
    redoc = client.get("/v1/redoc").content.decode()
    assert "/static/drf_spectacular_sidecar/redoc" in redoc
