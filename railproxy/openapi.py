"""OpenAPI declaration of C3 §3.5 POST /v1/rail/submissions.

Documentation only: the view parses with its own strict serializer and the dlock header seams.
Field names are C3's. `dlock.schema`'s hook gives each error status the `ErrorEnvelope` body
and adds the statuses every endpoint can answer.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers

from dlock.schema import PROTECTED_WRITE_HEADERS, errors

INT64_MAX = 2**63 - 1
CURRENCY = {"regex": r"^[A-Z]{3}$", "help_text": "ISO-4217"}


class Submission(serializers.Serializer):
    payoutId = serializers.UUIDField()
    accountId = serializers.CharField(min_length=1, max_length=64)
    amountMinor = serializers.IntegerField(min_value=1, max_value=INT64_MAX)
    currency = serializers.RegexField(**CURRENCY)
    beneficiaryRef = serializers.CharField(
        min_length=1, max_length=128, help_text="Opaque, synthetic."
    )


class SubmissionAcked(serializers.Serializer):
    submissionId = serializers.UUIDField()
    payoutId = serializers.UUIDField()
    presentedToken = serializers.IntegerField(min_value=1, max_value=INT64_MAX)
    outcome = serializers.ChoiceField(choices=["ACKED"])
    railReference = serializers.CharField()
    submittedAt = serializers.DateTimeField()
    resolvedAt = serializers.DateTimeField()


submit = extend_schema(
    operation_id="submitToRail",
    summary="Submit a claimed payout to the rail, once (fenced by the rail high-water mark)",
    tags=["rail"],
    parameters=PROTECTED_WRITE_HEADERS,
    request=Submission,
    responses={
        200: SubmissionAcked,
        **errors(
            {
                400: "INVALID_TOKEN or VALIDATION_FAILED",
                404: "NOT_FOUND: no such payout",
                409: "FENCED_OUT (outcome=FENCED), DUPLICATE_SUBMISSION, RAIL_AMBIGUOUS "
                "(outcome=TIMEOUT; never resubmit) or PAYOUT_NOT_CLAIMABLE",
                422: "VALIDATION_FAILED: the rail declined (REJECTED; payout FAILED), "
                "or IDEMPOTENCY_CONFLICT",
                503: "RAIL_UNAVAILABLE: nothing was presented; retry-safe",
            }
        ),
    },
)
