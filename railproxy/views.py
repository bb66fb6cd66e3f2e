"""POST /v1/rail/submissions (C3 §3.5): parse headers and body, call the service, map."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.views import APIView

from dlock import hotview
from dlock.headers import fencing_token, idempotency_key, owner_id
from dlock.idempotency import REPLAYED_HEADER
from dlock.rendering import json_response
from dlock.serializers import (
    StrictCharField,
    StrictInt64Field,
    StrictSerializer,
    common_shape,
    parse_uuid,
)
from railproxy import openapi, proofs, services
from railproxy.submission import SubmissionRequest

_CURRENCY = re.compile(r"[A-Z]{3}", re.ASCII)


class SubmissionIn(StrictSerializer):
    payoutId = StrictCharField(trim_whitespace=False)
    accountId = StrictCharField(min_length=1, max_length=64, trim_whitespace=False)
    amountMinor = StrictInt64Field(min_value=1)
    currency = StrictCharField(min_length=3, max_length=3, trim_whitespace=False)
    beneficiaryRef = StrictCharField(min_length=1, max_length=128, trim_whitespace=False)

    def validate_payoutId(self, value: str) -> str:
        try:
            parse_uuid(value, field="payoutId")
        except Exception:
            raise serializers.ValidationError("must be a UUID") from None
        return value.lower()

    def validate_currency(self, value: str) -> str:
        if not _CURRENCY.fullmatch(value):
            raise serializers.ValidationError("ISO-4217: three uppercase letters")
        return value


_common_submission = common_shape(SubmissionIn)


def parse_submission(data: Any) -> dict:
    """SubmissionIn's validated data: the common shape checked from its own fields
    (dlock.serializers.common_shape); anything else, and so every refusal and its details,
    through the serializer."""
    common = _common_submission(data)
    if common is not None:
        return common
    parsed = SubmissionIn(data=data)
    parsed.is_valid(raise_exception=True)
    return parsed.validated_data


def _submit(request: HttpRequest, body: Callable[[], Any]) -> HttpResponse:
    token = fencing_token(request)
    owner = owner_id(request)
    key = idempotency_key(request)
    data = parse_submission(body())
    payout_id = parse_uuid(data["payoutId"], field="payoutId")
    proofs.require_payout_proof(request, payout_id=payout_id, token=token)
    result = services.submit(
        request=SubmissionRequest(
            payout_id=payout_id,
            account_id=data["accountId"],
            amount_minor=data["amountMinor"],
            currency=data["currency"],
            beneficiary_ref=data["beneficiaryRef"],
            token=token,
            owner_id=owner,
            idempotency_key=key,
        )
    )
    response = json_response(result.body, 200)
    if result.replayed:
        response[REPLAYED_HEADER] = "true"
    return response


class SubmissionView(APIView):
    @openapi.submit
    def post(self, request: Request) -> HttpResponse:
        return _submit(request, lambda: request.data)


def submit(request: HttpRequest) -> HttpResponse:
    """The submission as a plain view (decision 17): SubmissionView's answer without DRF."""
    return _submit(request, lambda: hotview.json_body(request))
