"""OpenAPI for every role: the shared envelope, the C3 headers, and the post-processing hook.

Each app's `openapi.py` declares its C3 operations (`extend_schema` on the view methods): request
and 2xx bodies, headers, query and path parameters, and the error statuses C3 lists for the path
as `errors(...)` (a description only). This hook gives every non-2xx response without a body of
its own the one shared `ErrorEnvelope` component, closes every request body (each is parsed by a
`StrictSerializer`, which rejects unknown fields) and adds the statuses every endpoint can answer
(400 bad input, 404, 405/406/411/413/415 protocol rejections, 500, 503 OVERLOADED/NOT_LEADER,
504 DEADLINE_EXCEEDED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse

from dlock.errors import CATALOGUE, PROTOCOL_STATUSES, Code
from dlock.headers import IDEMPOTENCY_KEY_MAX, OWNER_ID_MAX

if TYPE_CHECKING:
    from drf_spectacular.generators import SchemaGenerator
    from rest_framework.request import Request

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
    "503": "OVERLOADED (no thread or database slot within its queue deadline) or NOT_LEADER.",
    "504": "DEADLINE_EXCEEDED: the database exchange hit the request deadline; rolled back.",
}
# dlock.auth: every /v1 operation of lock-server, payment-resource and rail-proxy.
AUTH_ERRORS = {
    "401": "UNAUTHENTICATED: no credential, or one this service does not know.",
    "403": "FORBIDDEN: the credential lacks this operation's scope, or the session is another's.",
}
SECURITY_SCHEMES = {
    "bearerAuth": {
        "type": "http",
        "scheme": "bearer",
        "description": "A caller credential (scope executor; operator for L8).",
    },
    "basicAuth": {
        "type": "http",
        "scheme": "basic",
        "description": "For a browser: any user name, the credential as password.",
    },
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


# /v1 paths that need no credential (dlock.auth.OPEN_ROUTES): the schema, and the lock server's
# public fencing keys (no secret in them; a verifier reads them before it holds any credential).
OPEN_PATHS = frozenset({"/v1/schema", "/v1/fencing-keys"})


def envelope_errors_hook(
    result: dict, generator: SchemaGenerator, request: Request | None, public: bool
) -> dict:
    """drf-spectacular POSTPROCESSING_HOOK (see SPECTACULAR_SETTINGS)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorEnvelope"] = ENVELOPE_SCHEMA
    guarded = settings.ROLE != "railstub"  # the rail stub stands in for a third party: open
    if guarded:
        result["components"]["securitySchemes"] = SECURITY_SCHEMES
    for path, path_item in result.get("paths", {}).items():
        for method, operation in path_item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            _close_request_body(operation, schemas)
            if guarded and path.startswith("/v1/") and path not in OPEN_PATHS:
                operation["security"] = [{"bearerAuth": []}, {"basicAuth": []}]
                operation["responses"].setdefault("401", _error_response("401", AUTH_ERRORS["401"]))
                operation["responses"].setdefault("403", _error_response("403", AUTH_ERRORS["403"]))
            responses = operation["responses"]
            for status in list(responses):
                if (status[:1] in ("4", "5") or status == "default") and not responses[status].get(
                    "content"
                ):
                    responses[status] = _error_response(
                        status, responses[status].get("description")
                    )
            extra = dict(COMMON_ERRORS)
            if method in ("post", "put", "patch"):
                extra.update(PROTOCOL_ERRORS)
            else:
                extra["405"] = PROTOCOL_ERRORS["405"]
                extra["406"] = PROTOCOL_ERRORS["406"]
            for status, description in extra.items():
                responses.setdefault(status, _error_response(status, description))
    return result


def _close_request_body(operation: dict, schemas: dict) -> None:
    for media in operation.get("requestBody", {}).get("content", {}).values():
        ref = media.get("schema", {}).get("$ref", "")
        component = schemas.get(ref.rsplit("/", 1)[-1]) if ref else None
        if component is not None:
            component["additionalProperties"] = False


# --------------------------------------------------------------------------- shared declarations
# Used by the apps' openapi.py modules.

OWNER_PATTERN = "^[!-~]([ -~]*[!-~])?$"  # printable ASCII, no leading/trailing space
TOKEN_PATTERN = "^[1-9][0-9]{0,18}$"  # noqa: S105 - decimal int64 > 0 (≤ 9223372036854775807)
KEY_PATTERN = "^[A-Za-z0-9:._-]+$"
UUID_SCHEMA = {"type": "string", "format": "uuid"}


def header(name: str, schema: dict, description: str, *, required: bool = True) -> OpenApiParameter:
    return OpenApiParameter(
        name,
        type=schema,
        location=OpenApiParameter.HEADER,
        required=required,
        description=description,
    )


TOKEN_HEADER = header(
    "X-Fencing-Token",
    {"type": "string", "pattern": TOKEN_PATTERN},
    "Fencing token of the grant: decimal int64 > 0 (C3 §3.1). Malformed → 400 INVALID_TOKEN.",
)
OWNER_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": OWNER_ID_MAX,
    "pattern": OWNER_PATTERN,
}
OWNER_HEADER = header(
    "X-Owner-Id", OWNER_SCHEMA, "Opaque worker identity, attribution only (C3 §3.1)."
)
OPTIONAL_OWNER_HEADER = header(
    "X-Owner-Id",
    {**OWNER_SCHEMA, "minLength": 0, "pattern": f"^$|{OWNER_PATTERN}"},
    "Opaque worker identity, or `ownerId` in the body; an empty value counts as absent.",
    required=False,
)
IDEMPOTENCY_HEADER = header(
    "X-Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX, "pattern": KEY_PATTERN},
    "The payout's stable key, never regenerated on retry (C3 §3.1).",
)
PROOF_HEADER = header(
    "X-Fencing-Proof",
    {
        "type": "string",
        "maxLength": 128,
        "pattern": "^v1\\.[A-Za-z0-9_-]{1,32}\\.[A-Za-z0-9_-]{43}$",
    },
    "The grant's fencingProof from L4/L5, sent beside X-Fencing-Token (ARCHITECTURE decision "
    "15). Missing, malformed, unknown kid, or not issued for this lock key and token → 400 "
    "INVALID_TOKEN with details.reason; nothing is written.",
)
PROTECTED_WRITE_HEADERS = [TOKEN_HEADER, PROOF_HEADER, OWNER_HEADER, IDEMPOTENCY_HEADER]


def path_param(name: str, schema: dict, description: str) -> OpenApiParameter:
    return OpenApiParameter(
        name, type=schema, location=OpenApiParameter.PATH, description=description
    )


def query_param(
    name: str, schema: dict | Any, description: str, *, required: bool = False
) -> OpenApiParameter:
    return OpenApiParameter(
        name,
        type=schema,
        location=OpenApiParameter.QUERY,
        required=required,
        description=description,
    )


def errors(by_status: dict[int, str]) -> dict[int, OpenApiResponse]:
    """C3's error statuses for a path, each described by its codes; the hook adds the envelope."""
    return {status: OpenApiResponse(description=text) for status, text in by_status.items()}
