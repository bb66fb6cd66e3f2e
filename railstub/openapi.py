"""OpenAPI declaration of C3 §3.6 POST /submit (the third party's shape, not ours).

Documentation only. The stub's own 402 (declined) and injected 500 bodies are the rail's, not
the dlock envelope, so they are documented here with their own schemas (the hook leaves a
response that has a body alone); a 400 from our parser is the envelope.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers

from dlock.schema import ENVELOPE_REF, errors

INT64_MAX = 2**63 - 1


class Transfer(serializers.Serializer):
    clientRef = serializers.CharField(min_length=1, max_length=128)
    amountMinor = serializers.IntegerField(min_value=1, max_value=INT64_MAX)
    currency = serializers.RegexField(regex=r"^[A-Z]{3}$", help_text="ISO-4217")


class Accepted(serializers.Serializer):
    railReference = serializers.CharField()
    acceptedAt = serializers.DateTimeField()


class Declined(serializers.Serializer):
    status = serializers.ChoiceField(choices=["DECLINED"])
    reason = serializers.CharField()


RAIL_FAULT = {
    "type": "object",
    "properties": {"error": {"type": "string"}},
    "required": ["error"],
}

submit = extend_schema(
    operation_id="railSubmit",
    summary="The rail: every call is a fresh, non-idempotent transfer",
    description="Injected faults also hold the connection open and drop it without a response.",
    tags=["rail-stub"],
    request=Transfer,
    responses={
        200: Accepted,
        402: OpenApiResponse(Declined, description="Declined by the rail (injected)."),
        500: OpenApiResponse(
            {"oneOf": [RAIL_FAULT, ENVELOPE_REF]},
            description="Injected rail fault, or our own INTERNAL envelope.",
        ),
        **errors({400: "VALIDATION_FAILED"}),
    },
)
