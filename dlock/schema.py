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
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
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
