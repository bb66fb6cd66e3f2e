"""P1–P5 (C3 §3.4). Each view parses headers/path/body, calls one service or selector, answers.

Headers go through `dlock.headers` first: a malformed token is INVALID_TOKEN before any DB work.
P2 and P3 are also plain Django views (`claim`, `post`; ARCHITECTURE decision 17, dlock.hotview)
sharing their code with the DRF classes, which stay the OpenAPI source; so are P1 and P4
(`list_payouts`, `get_payout`) for a machine's JSON GET, the browsable API staying DRF's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, QueryDict
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dlock import hotview
from dlock.errors import validation_error
from dlock.headers import fencing_token, idempotency_key, owner_id
from dlock.serializers import StrictCharField, StrictSerializer, parse_uuid
from payments import openapi, proofs, selectors, services

ACCOUNT_ID_MAX = 64
_LIST_PARAMS = frozenset({"state", "accountId", "limit", "cursor"})


class ClaimInput(StrictSerializer):
    expectedState = StrictCharField()

    def validate_expectedState(self, value: str) -> str:
        if value not in services.CLAIMABLE_STATES:
            raise serializers.ValidationError("must be PENDING or CLAIMED")
        return value


class PostInput(StrictSerializer):
    railReference = StrictCharField(max_length=128)
    submissionId = StrictCharField(max_length=36)
    railOutcome = StrictCharField(required=False, default="ACKED")

    def validate_railOutcome(self, value: str) -> str:
        if value != "ACKED":
            raise serializers.ValidationError("must be ACKED")
        return value


def _answer(result: services.CommandResult) -> Response:
    headers = {"Idempotent-Replayed": "true"} if result.replayed else None
    response = Response(result.body, status=result.status, headers=headers)
    # A replayed error answer is the stored C3 envelope, byte for byte.
    response.dlock_envelope = result.status >= 400
    return response


def _plain_answer(result: services.CommandResult) -> HttpResponse:
    headers = {"Idempotent-Replayed": "true"} if result.replayed else None
    return hotview.answer(result.body, result.status, headers, envelope=result.status >= 400)


def _protected_headers(request: HttpRequest) -> tuple[int, str, str]:
    """X-Fencing-Token, X-Owner-Id, X-Idempotency-Key, in that order, before any DB access."""
    return fencing_token(request), owner_id(request), idempotency_key(request)


def _claim(request: HttpRequest, payout_id: str, body: Callable[[], Any]) -> services.CommandResult:
    token, owner, key = _protected_headers(request)
    pid = parse_uuid(payout_id, field="payoutId")
    data = ClaimInput(data=body())
    data.is_valid(raise_exception=True)
    proofs.require_payout_proof(request, payout_id=pid, token=token)
    return services.claim_payout(
        payout_id=pid,
        token=token,
        owner_id=owner,
        idempotency_key=key,
        expected_state=data.validated_data["expectedState"],
    )


class PayoutClaimView(APIView):
    """P2 POST /v1/payouts/{payoutId}/claim."""

    @openapi.claim
    def post(self, request: Request, payout_id: str) -> Response:
        return _answer(_claim(request, payout_id, lambda: request.data))


def claim(request: HttpRequest, payout_id: str) -> HttpResponse:
    """P2 as a plain view (decision 17)."""
    return _plain_answer(_claim(request, payout_id, lambda: hotview.json_body(request)))


def _post(request: HttpRequest, payout_id: str, body: Callable[[], Any]) -> services.CommandResult:
    token, owner, key = _protected_headers(request)
    pid = parse_uuid(payout_id, field="payoutId")
    data = PostInput(data=body())
    data.is_valid(raise_exception=True)
    submission_id = parse_uuid(data.validated_data["submissionId"], field="submissionId")
    proofs.require_payout_proof(request, payout_id=pid, token=token)
    return services.post_payout(
        payout_id=pid,
        token=token,
        owner_id=owner,
        idempotency_key=key,
        rail_reference=data.validated_data["railReference"],
        submission_id=submission_id,
    )


class PayoutPostView(APIView):
    """P3 POST /v1/payouts/{payoutId}/post."""

    @openapi.post
    def post(self, request: Request, payout_id: str) -> Response:
        return _answer(_post(request, payout_id, lambda: request.data))


def post(request: HttpRequest, payout_id: str) -> HttpResponse:
    """P3 as a plain view (decision 17)."""
    return _plain_answer(_post(request, payout_id, lambda: hotview.json_body(request)))


def _limit(raw: str | None) -> int:
    if raw is None:
        return selectors.LIMIT_DEFAULT
    lo, hi = selectors.LIMIT_MIN, selectors.LIMIT_MAX
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 4) or not lo <= int(raw) <= hi:
        raise validation_error(
            f"limit must be an integer {lo}…{hi}",
            [{"field": "limit", "message": f"integer {lo}…{hi}"}],
        )
    return int(raw)


def _list(params: QueryDict) -> dict[str, Any]:
    unknown = sorted(set(params) - _LIST_PARAMS)
    if unknown:
        raise validation_error(
            "unknown query parameter", [{"field": n, "message": "unknown"} for n in unknown]
        )
    for name in params:
        if len(params.getlist(name)) > 1:
            raise validation_error(
                f"{name} given more than once", [{"field": name, "message": "once"}]
            )
    state = params.get("state") or None
    if state is not None and state not in selectors.STATES:
        raise validation_error(
            "state must be one of the eight payout states",
            [{"field": "state", "message": "|".join(selectors.STATES)}],
        )
    account = params.get("accountId") or None
    if account is not None and len(account) > ACCOUNT_ID_MAX:
        raise validation_error(
            "accountId is too long",
            [{"field": "accountId", "message": f"at most {ACCOUNT_ID_MAX}"}],
        )
    return selectors.list_payouts(
        state=state,
        account_id=account,
        limit=_limit(params.get("limit")),
        cursor=params.get("cursor") or None,
    )


class PayoutListView(APIView):
    """P1 GET /v1/payouts?state=&accountId=&limit=&cursor=."""

    @openapi.list_payouts
    def get(self, request: Request) -> Response:
        return Response(_list(request.query_params))


def list_payouts(request: HttpRequest) -> HttpResponse:
    """P1 as a plain view for a JSON GET (decision 17; dlock.hotview.hot_read_view)."""
    return hotview.answer(_list(request.GET))


class PayoutDetailView(APIView):
    """P4 GET /v1/payouts/{payoutId} (advisory)."""

    @openapi.get_payout
    def get(self, request: Request, payout_id: str) -> Response:
        pid = parse_uuid(payout_id, field="payoutId")
        return Response(selectors.get_payout(payout_id=pid))


def get_payout(request: HttpRequest, payout_id: str) -> HttpResponse:
    """P4 as a plain view for a JSON GET (decision 17; dlock.hotview.hot_read_view)."""
    pid = parse_uuid(payout_id, field="payoutId")
    return hotview.answer(selectors.get_payout(payout_id=pid))


class AccountDetailView(APIView):
    """P5 GET /v1/accounts/{accountId}."""

    @openapi.get_account
    def get(self, request: Request, account_id: str) -> Response:
        if len(account_id) > ACCOUNT_ID_MAX:
            raise validation_error(
                "accountId is too long",
                [{"field": "accountId", "message": f"at most {ACCOUNT_ID_MAX}"}],
            )
        return Response(selectors.get_account(account_id=account_id))
