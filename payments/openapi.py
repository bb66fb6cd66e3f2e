"""OpenAPI declarations of C3 §3.4 P1–P5 (request/response shapes, headers, error statuses).

Documentation only: the views parse with their own strict serializers and the dlock header
seams; these serializers are never used to validate. Field names are C3's. Error statuses are
those C3 lists for the path (plus any the implementation answers); `dlock.schema`'s hook gives
each the `ErrorEnvelope` body and adds the statuses every endpoint can answer.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers

from dlock.schema import PROTECTED_WRITE_HEADERS, UUID_SCHEMA, errors, path_param, query_param
from payments.models import PayoutState
from payments.models.states import CLAIMABLE_STATES
from payments.selectors import LIMIT_DEFAULT, LIMIT_MAX, LIMIT_MIN

INT64_MAX = 2**63 - 1
ACCOUNT_ID_MAX = 64
STATES = [state.value for state in PayoutState]
# rail_submission.outcome (railproxy owns the table; its models are not installed in this role)
OUTCOMES = ["PENDING", "ACKED", "TIMEOUT", "DECLINED", "NOT_SENT", "FENCED"]
CURRENCY = {"regex": r"^[A-Z]{3}$", "help_text": "ISO-4217"}

PAYOUT_PARAM = path_param("payout_id", UUID_SCHEMA, "The payoutId.")
ACCOUNT_PARAM = path_param(
    "account_id", {"type": "string", "minLength": 1, "maxLength": ACCOUNT_ID_MAX}, "The accountId."
)


def _int64(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=-INT64_MAX - 1, max_value=INT64_MAX, **kwargs)


def _token(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=1, max_value=INT64_MAX, **kwargs)


def _always(value: str) -> serializers.CharField:
    """A field with one possible value. A pattern, not a one-value enum: the enum post-processing
    would otherwise name every `state` enum after a hash (they differ per body)."""
    schema = {"type": "string", "pattern": f"^{value}$", "example": value}
    field_class = extend_schema_field(schema)(type(f"Always{value}", (serializers.CharField,), {}))
    return field_class(help_text=f"Always {value}.")


# ------------------------------------------------------------------------------- request bodies


class Claim(serializers.Serializer):
    expectedState = serializers.ChoiceField(
        choices=list(CLAIMABLE_STATES), help_text="PENDING, or CLAIMED for a recovery re-claim."
    )


class Post(serializers.Serializer):
    railReference = serializers.CharField(min_length=1, max_length=128)
    submissionId = serializers.UUIDField()
    railOutcome = serializers.ChoiceField(choices=["ACKED"], required=False)


# ------------------------------------------------------------------------------ response bodies


class PayoutSummary(serializers.Serializer):
    payoutId = serializers.UUIDField()
    accountId = serializers.CharField()
    amountMinor = _int64()
    currency = serializers.RegexField(**CURRENCY)
    state = serializers.ChoiceField(choices=STATES)
    attemptCount = serializers.IntegerField(min_value=0)
    createdAt = serializers.DateTimeField()


class PayoutPage(serializers.Serializer):
    items = PayoutSummary(many=True)
    nextCursor = serializers.CharField(required=False, help_text="Opaque; absent on the last page.")


class PayoutClaimed(serializers.Serializer):
    payoutId = serializers.UUIDField()
    state = _always("CLAIMED")
    claimToken = _token()
    accountFence = _int64(help_text="The account's fence after the update.")
    attemptCount = serializers.IntegerField(min_value=0)
    idempotencyKey = serializers.CharField()
    beneficiaryRef = serializers.CharField(
        required=False,
        help_text="The payout's beneficiary, exactly as the rail submission must carry it (so "
        "the executor needs no P4 read before it submits). Absent only in a replay of a claim "
        "recorded before this field existed.",
    )


class LedgerEntry(serializers.Serializer):
    entryId = serializers.UUIDField()
    direction = serializers.ChoiceField(choices=["DEBIT", "CREDIT"])
    amountMinor = _int64()
    fence = _int64()


class PayoutPosted(serializers.Serializer):
    payoutId = serializers.UUIDField()
    state = _always("POSTED")
    entries = LedgerEntry(many=True, help_text="Two balanced rows: DEBIT and CREDIT.")
    balanceMinor = _int64(help_text="The debited account's balance after posting.")


class SubmissionSummary(serializers.Serializer):
    submissionId = serializers.UUIDField()
    presentedToken = _token()
    ownerId = serializers.CharField()
    outcome = serializers.ChoiceField(choices=OUTCOMES)
    railReference = serializers.CharField(allow_null=True)
    submittedAt = serializers.DateTimeField()
    resolvedAt = serializers.DateTimeField(allow_null=True)
    detail = serializers.CharField(allow_null=True)


class Payout(serializers.Serializer):
    payoutId = serializers.UUIDField()
    accountId = serializers.CharField()
    amountMinor = _int64()
    currency = serializers.RegexField(**CURRENCY)
    beneficiaryRef = serializers.CharField()
    state = serializers.ChoiceField(choices=STATES)
    attemptCount = serializers.IntegerField(min_value=0)
    claimToken = _token(allow_null=True)
    claimOwnerId = serializers.CharField(allow_null=True)
    idempotencyKey = serializers.CharField()
    railReference = serializers.CharField(allow_null=True)
    createdAt = serializers.DateTimeField()
    updatedAt = serializers.DateTimeField()
    submissions = SubmissionSummary(many=True)


class Account(serializers.Serializer):
    accountId = serializers.CharField()
    currency = serializers.RegexField(**CURRENCY)
    balanceMinor = _int64()
    fence = _int64()
    updatedAt = serializers.DateTimeField()
    ledgerSumMinor = _int64(help_text="Recomputed from the ledger; equals balanceMinor.")


# ------------------------------------------------------------------------------------ operations

list_payouts = extend_schema(
    operation_id="listPayouts",
    summary="P1 list payouts by state",
    tags=["payouts"],
    parameters=[
        query_param(
            "state",
            {"type": "string", "enum": [*STATES, ""]},
            "One of the payout states; absent or empty: every state.",
        ),
        query_param(
            "accountId",
            {"type": "string", "maxLength": ACCOUNT_ID_MAX},
            "Only this account; absent or empty: every account.",
        ),
        query_param(
            "limit",
            {"type": "integer", "minimum": LIMIT_MIN, "maximum": LIMIT_MAX},
            f"Page size, default {LIMIT_DEFAULT}.",
        ),
        query_param(
            "cursor",
            {"type": "string"},
            "The nextCursor of the previous page; absent or empty: first.",
        ),
    ],
    responses={200: PayoutPage, **errors({400: "VALIDATION_FAILED"})},
)

claim = extend_schema(
    operation_id="claimPayout",
    summary="P2 claim a payout (fenced write)",
    tags=["payouts"],
    parameters=[PAYOUT_PARAM, *PROTECTED_WRITE_HEADERS],
    request=Claim,
    responses={
        200: PayoutClaimed,
        **errors(
            {
                400: "INVALID_TOKEN or VALIDATION_FAILED (also when X-Idempotency-Key is not "
                "the payout's stable idempotencyKey; nothing is written)",
                404: "NOT_FOUND: no such payout",
                409: "FENCED_OUT (+details.presentedToken, highestToken, resourceType, "
                "resourceId, ownerId) or PAYOUT_NOT_CLAIMABLE",
                422: "INSUFFICIENT_FUNDS or IDEMPOTENCY_CONFLICT",
            }
        ),
    },
)

post = extend_schema(
    operation_id="postPayout",
    summary="P3 post a rail-acknowledged payout to the ledger (fenced write)",
    tags=["payouts"],
    parameters=[PAYOUT_PARAM, *PROTECTED_WRITE_HEADERS],
    request=Post,
    responses={
        200: PayoutPosted,
        **errors(
            {
                400: "INVALID_TOKEN or VALIDATION_FAILED (also when X-Idempotency-Key is not "
                "the payout's stable idempotencyKey; nothing is written)",
                404: "NOT_FOUND: no such payout",
                409: "FENCED_OUT or PAYOUT_NOT_CLAIMABLE (not in RAIL_ACKED)",
                422: "IDEMPOTENCY_CONFLICT",
            }
        ),
    },
)

get_payout = extend_schema(
    operation_id="getPayout",
    summary="P4 advisory read of a payout and its rail submissions",
    tags=["payouts"],
    parameters=[PAYOUT_PARAM],
    responses={200: Payout, **errors({404: "NOT_FOUND: no such payout"})},
)

get_account = extend_schema(
    operation_id="getAccount",
    summary="P5 read an account with its recomputed ledger sum",
    tags=["accounts"],
    parameters=[ACCOUNT_PARAM],
    responses={200: Account, **errors({404: "NOT_FOUND: no such account"})},
)
