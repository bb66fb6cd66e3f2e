"""OpenAPI post-processing: every documented error response is the C3 envelope.

Views document their 2xx bodies and, with `extend_schema(responses={409: None, ...})` or any
serializer, the error statuses they answer; this hook replaces every non-2xx body with the one
shared `ErrorEnvelope` component and adds the statuses every endpoint can answer (400 bad input,
404, 405/406/413/415 protocol rejections, 500, 503 OVERLOADED/NOT_LEADER, 504 DEADLINE_EXCEEDED).
"""

from __future__ import annotations

from typing import Any

from dlock.errors import CATALOGUE, PROTOCOL_STATUSES, Code

ENVELOPE_REF = {"$ref": "#/components/schemas/ErrorEnvelope"}
JSON = "application/json"

ENVELOPE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "C3 §3.1 error envelope: every non-2xx response of every dlock service.",
    "properties": {
        "code": {"type": "string", "enum": [code.value for code in Code]},
        "message": {"type": "string", "description": "Human text; not stable, not parseable."},
        "retrySafe": {"type": "boolean"},
        "retryAfterMillis": {"type": "integer", "minimum": 0},
        "details": {"type": "object", "additionalProperties": True},
        "traceId": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
    },
    "required": ["code", "message", "retrySafe", "traceId"],
    "additionalProperties": False,
}

# Statuses any endpoint can answer regardless of what it does.
COMMON_ERRORS: dict[str, str] = {
    "400": "VALIDATION_FAILED or INVALID_TOKEN: the request is malformed.",
    "404": "NOT_FOUND: no such resource or route.",
    "500": "INTERNAL: an unexpected failure; the traceId finds the log line.",
    "503": "OVERLOADED (no database slot within the queue deadline) or NOT_LEADER.",
    "504": "DEADLINE_EXCEEDED: the database exchange hit the request deadline; rolled back.",
}
PROTOCOL_ERRORS = {
    str(status): "VALIDATION_FAILED: protocol rejection" for status in PROTOCOL_STATUSES
}


def _codes_for(status: str) -> list[str]:
    return [code.value for code, spec in CATALOGUE.items() if str(spec.status) == status]


def _error_response(status: str, description: str | None) -> dict[str, Any]:
    codes = _codes_for(status)
    text = description or (", ".join(codes) if codes else "error")
    return {"description": text, "content": {JSON: {"schema": ENVELOPE_REF}}}


def envelope_errors_hook(result: dict, generator, request, public) -> dict:
    """drf-spectacular POSTPROCESSING_HOOK (see SPECTACULAR_SETTINGS)."""
    result.setdefault("components", {}).setdefault("schemas", {})["ErrorEnvelope"] = ENVELOPE_SCHEMA
    for path, path_item in result.get("paths", {}).items():
        for method, operation in path_item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            _apply_contract(path, method, operation)
            responses = operation["responses"]
            for status in list(responses):
                if status[:1] in ("4", "5") or status == "default":
                    given = responses[status].get("description")
                    responses[status] = _error_response(status, given)
            extra = dict(COMMON_ERRORS)
            if method in ("post", "put", "patch"):
                extra.update(PROTOCOL_ERRORS)
            else:
                extra["405"] = PROTOCOL_ERRORS["405"]
                extra["406"] = PROTOCOL_ERRORS["406"]
            for status, description in extra.items():
                responses.setdefault(status, _error_response(status, description))
    return result


# --------------------------------------------------------------------------- C3 as OpenAPI
# The wire contract's request and response shapes, applied where a view documents nothing
# itself (an `extend_schema` on the view wins). Keeping them here lets Schemathesis check every
# role against C3 rather than against what the code happens to do.

_STR = {"type": "string"}
_INT64 = {"type": "integer", "format": "int64"}
_TS = {"type": "string", "format": "date-time"}
_UUID = {"type": "string", "format": "uuid"}
_OWNER = {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[!-~]([ -~]*[!-~])?$"}
_STATES = [
    "PENDING",
    "CLAIMED",
    "SUBMITTING",
    "RAIL_ACKED",
    "POSTED",
    "FAILED",
    "ABANDONED",
    "RAIL_AMBIGUOUS",
]
_CURRENCY = {"type": "string", "pattern": "^[A-Z]{3}$"}

TOKEN_HEADER = {
    "name": "X-Fencing-Token",
    "in": "header",
    "required": True,
    "description": "Decimal int64 > 0 of the grant (C3 §3.1).",
    "schema": {"type": "string", "pattern": "^[1-9][0-9]{0,17}$"},
}
OWNER_HEADER = {
    "name": "X-Owner-Id",
    "in": "header",
    "required": True,
    "description": "Opaque worker identity, attribution only.",
    "schema": _OWNER,
}
IDEMPOTENCY_HEADER = {
    "name": "X-Idempotency-Key",
    "in": "header",
    "required": True,
    "description": "The payout's stable key (`payout-<payoutId>`).",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9:._-]{1,128}$"},
}
PROTECTED_WRITE = [TOKEN_HEADER, OWNER_HEADER, IDEMPOTENCY_HEADER]


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None, *, closed=False):
    schema: dict[str, Any] = {"type": "object", "properties": {**required, **(optional or {})}}
    if required:
        schema["required"] = list(required)
    if closed:  # request bodies: the strict serializers reject unknown fields
        schema["additionalProperties"] = False
    return schema


LOCK_GRANT = _obj(
    {
        "key": _STR,
        "ownerId": _STR,
        "sessionId": _UUID,
        "fencingToken": _INT64,
        "acquiredAt": _TS,
        "expiresAt": _TS,
    }
)
_SESSION_BODY = {"sessionId": _UUID}
_TTL = {"type": "integer", "minimum": 1_000, "maximum": 60_000}

# (method, path) -> contract: extra parameters, request body, success (status, schema), errors.
CONTRACT: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/sessions"): {
        "body": _obj({}, {"ownerId": _OWNER, "ttlMillis": _TTL}, closed=True),
        "parameters": [{**OWNER_HEADER, "required": False}],
        "success": (
            "201",
            _obj({"sessionId": _UUID, "ownerId": _STR, "ttlMillis": _INT64, "expiresAt": _TS}),
        ),
        "errors": {"400", "503"},
    },
    ("post", "/v1/sessions/{session_id}/heartbeat"): {
        "parameters": [OWNER_HEADER],
        "success": (
            "200",
            _obj(
                {
                    "sessionId": _UUID,
                    "expiresAt": _TS,
                    "serverTime": _TS,
                    "heldLockCount": {"type": "integer"},
                }
            ),
        ),
        "errors": {"400", "404", "410", "503"},
    },
    ("delete", "/v1/sessions/{session_id}"): {
        "parameters": [OWNER_HEADER],
        "success": ("204", None),
        "errors": {"400", "404", "410", "503"},
    },
    ("post", "/v1/locks/{key}/acquire"): {
        "parameters": [OWNER_HEADER],
        "body": _obj(
            _SESSION_BODY,
            {"ttlMillis": _TTL, "waitMillis": {"type": "integer", "minimum": 0, "maximum": 2000}},
            closed=True,
        ),
        "success": ("200", LOCK_GRANT),
        "errors": {"400", "404", "409", "410", "429", "503"},
    },
    ("post", "/v1/locks/{key}/renew"): {
        "parameters": [TOKEN_HEADER, OWNER_HEADER],
        "body": _obj(_SESSION_BODY, {"ttlMillis": _TTL}, closed=True),
        "success": ("200", LOCK_GRANT),
        "errors": {"400", "404", "409", "410", "503"},
    },
    ("delete", "/v1/locks/{key}"): {
        "parameters": [
            TOKEN_HEADER,
            OWNER_HEADER,
            {"name": "sessionId", "in": "query", "required": True, "schema": _UUID},
        ],
        "success": ("204", None),
        "errors": {"400", "404", "409", "410", "503"},
    },
    ("get", "/v1/locks/{key}"): {
        "success": (
            "200",
            _obj(
                {"key": _STR, "held": {"type": "boolean"}, "waiterCount": {"type": "integer"}},
                {
                    "ownerId": _STR,
                    "fencingToken": _INT64,
                    "acquiredAt": _TS,
                    "expiresAt": _TS,
                },
            ),
        ),
        "errors": {"400", "404"},
    },
    ("post", "/v1/locks/{key}/revoke"): {
        "body": _obj(
            {
                "operator": {"type": "string", "minLength": 1},
                "reason": {"type": "string", "minLength": 8},
            },
            {"expectedToken": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}},
            closed=True,
        ),
        "success": (
            "200",
            _obj({"revokedToken": _INT64, "newTokenFloor": _INT64, "revocationId": _STR}),
        ),
        "errors": {"400", "404", "409", "503"},
    },
    ("get", "/v1/payouts"): {
        "parameters": [
            {"name": "state", "in": "query", "required": False, "schema": {"enum": _STATES}},
            {"name": "accountId", "in": "query", "required": False, "schema": _STR},
            {
                "name": "limit",
                "in": "query",
                "required": False,
                "schema": {"type": "integer", "minimum": 1, "maximum": 500},
            },
            {"name": "cursor", "in": "query", "required": False, "schema": _STR},
        ],
        "success": (
            "200",
            _obj(
                {
                    "items": {
                        "type": "array",
                        "items": _obj(
                            {
                                "payoutId": _UUID,
                                "accountId": _STR,
                                "amountMinor": _INT64,
                                "currency": _CURRENCY,
                                "state": {"enum": _STATES},
                                "attemptCount": {"type": "integer"},
                                "createdAt": _TS,
                            }
                        ),
                    }
                },
                {"nextCursor": {"type": "string", "nullable": True}},
            ),
        ),
        "errors": {"400"},
    },
    ("post", "/v1/payouts/{payout_id}/claim"): {
        "parameters": PROTECTED_WRITE,
        "body": _obj({"expectedState": {"enum": ["PENDING", "CLAIMED"]}}, closed=True),
        "success": (
            "200",
            _obj(
                {
                    "payoutId": _UUID,
                    "state": {"enum": ["CLAIMED"]},
                    "claimToken": _INT64,
                    "accountFence": _INT64,
                    "attemptCount": {"type": "integer"},
                    "idempotencyKey": _STR,
                }
            ),
        ),
        "errors": {"400", "404", "409", "422"},
    },
    ("post", "/v1/payouts/{payout_id}/post"): {
        "parameters": PROTECTED_WRITE,
        "body": _obj(
            {
                "railReference": {"type": "string", "minLength": 1, "maxLength": 128},
                "submissionId": _UUID,
            },
            {"railOutcome": {"enum": ["ACKED"]}},
            closed=True,
        ),
        "success": (
            "200",
            _obj(
                {
                    "payoutId": _UUID,
                    "state": {"enum": ["POSTED"]},
                    "entries": {"type": "array"},
                    "balanceMinor": _INT64,
                }
            ),
        ),
        "errors": {"400", "404", "409", "422"},
    },
    ("get", "/v1/payouts/{payout_id}"): {
        "success": ("200", _obj({"payoutId": _UUID, "state": {"enum": _STATES}})),
        "errors": {"400", "404"},
    },
    ("get", "/v1/accounts/{account_id}"): {
        "success": (
            "200",
            _obj(
                {
                    "accountId": _STR,
                    "currency": _CURRENCY,
                    "balanceMinor": _INT64,
                    "fence": _INT64,
                    "updatedAt": _TS,
                    "ledgerSumMinor": _INT64,
                }
            ),
        ),
        "errors": {"404"},
    },
    ("post", "/v1/rail/submissions"): {
        "parameters": PROTECTED_WRITE,
        "body": _obj(
            {
                "payoutId": _UUID,
                "accountId": {"type": "string", "minLength": 1, "maxLength": 64},
                "amountMinor": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                "currency": _CURRENCY,
                "beneficiaryRef": {"type": "string", "minLength": 1, "maxLength": 128},
            },
            closed=True,
        ),
        "success": (
            "200",
            _obj(
                {
                    "submissionId": _UUID,
                    "payoutId": _UUID,
                    "presentedToken": _INT64,
                    "outcome": {"enum": ["ACKED"]},
                    "railReference": _STR,
                    "submittedAt": _TS,
                    "resolvedAt": _TS,
                }
            ),
        ),
        "errors": {"400", "404", "409", "422", "503"},
    },
    ("post", "/submit"): {
        "body": _obj(
            {
                "clientRef": {"type": "string", "minLength": 1, "maxLength": 128},
                "amountMinor": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                "currency": _CURRENCY,
            },
            closed=True,
        ),
        "success": ("200", _obj({"railReference": _STR, "acceptedAt": _TS})),
        "errors": {"400", "402", "503"},
    },
}

_PATH_PARAMS = {
    "key": {"type": "string", "pattern": "^[a-zA-Z0-9:._-]{1,128}$"},
    "session_id": _UUID,
    "payout_id": _UUID,
}


def _apply_contract(path: str, method: str, operation: dict) -> None:
    contract = CONTRACT.get((method, path))
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "path" and parameter.get("name") in _PATH_PARAMS:
            parameter["schema"] = _PATH_PARAMS[parameter["name"]]
    if contract is None:
        return
    present = {(p.get("in"), p.get("name")) for p in operation.get("parameters", [])}
    for parameter in contract.get("parameters", []):
        if (parameter["in"], parameter["name"]) not in present:
            operation.setdefault("parameters", []).append(dict(parameter))
    if "body" in contract and "requestBody" not in operation:
        operation["requestBody"] = {
            "required": True,
            "content": {JSON: {"schema": contract["body"]}},
        }
    status, schema = contract["success"]
    responses = operation["responses"]
    documented = [s for s in responses if s.startswith("2") and "content" in responses[s]]
    if not documented:
        for default in [s for s in responses if s.startswith("2")]:
            del responses[default]
        responses[status] = {"description": "C3 success"}
        if schema is not None:
            responses[status]["content"] = {JSON: {"schema": schema}}
    for error in contract.get("errors", ()):
        responses.setdefault(error, _error_response(error, None))
