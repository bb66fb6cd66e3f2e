"""The error catalogue, the envelope, and the fencing-token seam (no database needed)."""

from __future__ import annotations

import json

import pytest
from django.test import RequestFactory

from dlock.errors import CATALOGUE, ApiError, Code
from dlock.handlers import error_response
from dlock.headers import fencing_token, idempotency_key, owner_id, parse_token_value

EXPECTED = {
    "LOCK_CONTENDED": (409, True, True),
    "CONTENTION_EXCEEDED": (429, True, True),
    "NOT_LEADER": (503, True, True),
    "LOCK_LOST": (409, False, False),
    "SESSION_UNKNOWN": (404, False, False),
    "SESSION_EXPIRED": (410, False, False),
    "INVALID_TOKEN": (400, False, False),
    "FENCED_OUT": (409, False, False),
    "PAYOUT_NOT_CLAIMABLE": (409, False, False),
    "DUPLICATE_SUBMISSION": (409, False, False),
    "INSUFFICIENT_FUNDS": (422, False, False),
    "IDEMPOTENCY_CONFLICT": (422, False, False),
    "RAIL_UNAVAILABLE": (503, True, True),
    "RAIL_AMBIGUOUS": (409, False, False),
    "VALIDATION_FAILED": (400, False, False),
    "NOT_FOUND": (404, False, False),
    "OVERLOADED": (503, True, True),
    "DEADLINE_EXCEEDED": (504, True, False),
    "INTERNAL": (500, False, False),
    "UNAUTHENTICATED": (401, False, False),  # ARCHITECTURE 14
    "FORBIDDEN": (403, False, False),
    # Answered by a role's proxy: forwarded, outcome unknown (ARCHITECTURE 18, CHANGELOG)
    "UPSTREAM_TIMEOUT": (504, False, False),
    "UPSTREAM_FAILED": (502, False, False),
}


def test_catalogue_covers_every_code_exactly_once():
    assert {code.value for code in CATALOGUE} == set(EXPECTED)


@pytest.mark.parametrize("code", list(EXPECTED))
def test_every_code_renders_the_exact_envelope(code):
    status, retry_safe, has_retry_after = EXPECTED[code]
    response = error_response(ApiError(Code(code), "why", details={"k": 1}))
    body = json.loads(response.content)
    assert response.status_code == status
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert body["code"] == code
    assert body["retrySafe"] is retry_safe
    assert ("retryAfterMillis" in body) is has_retry_after
    if has_retry_after:
        assert isinstance(body["retryAfterMillis"], int) and body["retryAfterMillis"] > 0
    if code == "VALIDATION_FAILED":  # C3 3.2: VALIDATION_FAILED always has details.fields[]
        assert body["details"] == {"k": 1, "fields": [{"field": "request", "message": "why"}]}
    else:
        assert body["details"] == {"k": 1}
    assert len(body["traceId"]) == 32
    assert set(body) <= {"code", "message", "retrySafe", "retryAfterMillis", "details", "traceId"}


def test_validation_failed_keeps_fields_it_was_given():
    fields = [{"field": "ttlMillis", "message": "too big"}]
    error = ApiError(Code.VALIDATION_FAILED, "bad", details={"fields": fields})
    assert json.loads(error_response(error).content)["details"] == {"fields": fields}


def test_envelope_without_details_has_no_details_key():
    body = json.loads(error_response(ApiError(Code.LOCK_LOST)).content)
    assert set(body) == {"code", "message", "retrySafe", "traceId"}


GOOD_TOKENS = {
    "1": 1,
    "42": 42,
    "9223372036854775807": 2**63 - 1,
    "0042": 42,  # T-022: Long.parseLong semantics, leading zeros are not a parse failure
    "09223372036854775807": 2**63 - 1,
}
BAD_TOKENS = [
    None,
    "",
    "abc",
    "0",
    "-1",
    "+1",
    " 42",
    "42 ",
    " 42 ",
    "000",
    "09223372036854775808",
    "42\n",
    "4_2",
    "٤٢",
    "４２",
    "9223372036854775808",
    "99999999999999999999",
    "1e3",
    "1.0",
    "0x10",
    "1,2",
]


@pytest.mark.parametrize("raw,expected", GOOD_TOKENS.items())
def test_valid_tokens_parse(raw, expected):
    assert parse_token_value(raw) == expected


@pytest.mark.parametrize("raw", BAD_TOKENS)
def test_malformed_tokens_are_invalid_token_never_zero(raw):
    with pytest.raises(ApiError) as caught:
        parse_token_value(raw)
    assert caught.value.code is Code.INVALID_TOKEN
    assert caught.value.status == 400


def test_token_seam_reads_the_header():
    request = RequestFactory().post("/", HTTP_X_FENCING_TOKEN="17")
    assert fencing_token(request) == 17
    with pytest.raises(ApiError) as caught:
        fencing_token(RequestFactory().post("/"))
    assert caught.value.code is Code.INVALID_TOKEN


@pytest.mark.parametrize("raw", [None, "", "x" * 65, "a\tb", " lead", "trail ", "é"])
def test_bad_owner_ids_are_validation_failed(raw):
    extra = {} if raw is None else {"HTTP_X_OWNER_ID": raw}
    with pytest.raises(ApiError) as caught:
        owner_id(RequestFactory().post("/", **extra))
    assert caught.value.code is Code.VALIDATION_FAILED


def test_owner_id_accepts_64_printable_characters():
    assert owner_id(RequestFactory().post("/", HTTP_X_OWNER_ID="w" * 64)) == "w" * 64
    assert owner_id(RequestFactory().post("/", HTTP_X_OWNER_ID="worker 1")) == "worker 1"


@pytest.mark.parametrize("raw", [None, "", "k" * 129, "has space", "ключ"])
def test_bad_idempotency_keys_are_validation_failed(raw):
    extra = {} if raw is None else {"HTTP_X_IDEMPOTENCY_KEY": raw}
    with pytest.raises(ApiError) as caught:
        idempotency_key(RequestFactory().post("/", **extra))
    assert caught.value.code is Code.VALIDATION_FAILED


def test_traceparent_is_honoured(client):
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    response = client.get("/no/such/path", HTTP_TRACEPARENT=f"00-{trace}-00f067aa0ba902b7-01")
    assert response.status_code == 404
    assert response.json()["traceId"] == trace
