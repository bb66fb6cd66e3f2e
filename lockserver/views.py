"""C3 §3.3 L1–L8: parse (dlock seams + strict serializers), call one service, render.

L4, L5 and L6 are also plain Django views (`acquire`, `renew`, `release`, ARCHITECTURE decision
17, dlock.hotview): each shares its endpoint's code with the DRF class, which stays the OpenAPI
source and answers every other method on the route.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from dlock import hotview, proof
from dlock.auth import request_principal
from dlock.errors import validation_error
from dlock.headers import fencing_token, owner_id, validate_owner_id
from dlock.serializers import (
    StrictCharField,
    StrictInt64Field,
    StrictIntegerField,
    StrictSerializer,
    parse_uuid,
)
from dlock.timefmt import rfc3339_ms
from lockserver import openapi, services
from lockserver.backends.base import GrantRecord
from lockserver.ownership import check_owner, record_owner  # session ownership

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse
    from rest_framework.request import Request
    from rest_framework.serializers import Serializer

KEY_MAX = 128
_KEY = re.compile(r"[a-zA-Z0-9:._\-]+", re.ASCII)
TTL_MIN_MS, TTL_MAX_MS = 1_000, 60_000
WAIT_MAX_MS = 30_000


def parse_key(raw: str) -> str:
    if len(raw) > KEY_MAX or not _KEY.fullmatch(raw):
        raise validation_error(
            f"key must be 1…{KEY_MAX} characters of [a-zA-Z0-9:._-]",
            [{"field": "key", "message": f"1…{KEY_MAX} of [a-zA-Z0-9:._-]"}],
        )
    return raw


def _clamp_ttl(ttl_ms: int) -> int:
    """Requests above LOCK_MAX_TTL_MS are granted that much (C3 L1: may be clamped down)."""
    return min(ttl_ms, settings.LOCK_MAX_TTL_MS)


def _parse(serializer_class: type[Serializer], data: object) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


# The hot bodies (L4 acquire, L6 release) in their common, well-formed shape are accepted below
# without building a DRF serializer, which is about a tenth of the CPU of such a request
# (docs/CHANGELOG.md). Each check is narrower than its serializer and yields what the
# serializer would; anything else, and so every refusal and its message, still goes through the
# serializer.


def _plain_text(value: object) -> bool:
    """What StrictCharField accepts, narrowed to ASCII without NUL (its NUL/surrogate checks)."""
    return type(value) is str and value.isascii() and "\x00" not in value and value.strip() != ""


def _int_within(value: object, low: int, high: int) -> bool:
    """What StrictIntegerField(min_value=low, max_value=high) accepts: a JSON integer in range."""
    return type(value) is int and low <= value <= high


_ACQUIRE_FIELDS = frozenset({"sessionId", "ttlMillis", "waitMillis"})


def _parse_acquire(data: Any) -> dict:
    if (
        type(data) is dict
        and data.keys() <= _ACQUIRE_FIELDS
        and _plain_text(data.get("sessionId"))
        and ("ttlMillis" not in data or _int_within(data["ttlMillis"], TTL_MIN_MS, TTL_MAX_MS))
        and ("waitMillis" not in data or _int_within(data["waitMillis"], 0, WAIT_MAX_MS))
    ):
        return {**data, "sessionId": data["sessionId"].strip()}
    return _parse(AcquireInput, data)


def _parse_release(data: Any) -> dict:
    if type(data) is dict and not data:
        return {}
    if type(data) is dict and data.keys() == {"sessionId"} and _plain_text(data["sessionId"]):
        return {"sessionId": data["sessionId"].strip()}
    return _parse(ReleaseInput, data)


def _optional_owner(request: Request) -> str | None:
    raw = request.META.get("HTTP_X_OWNER_ID")
    return None if raw is None or raw == "" else validate_owner_id(raw, field="X-Owner-Id")


def grant_body(grant: GrantRecord) -> dict:
    return {
        "key": grant.key,
        "ownerId": grant.owner_id,
        "sessionId": str(grant.session_id),
        "fencingToken": grant.fencing_token,
        "fencingProof": proof.sign(key=grant.key, token=grant.fencing_token),
        "acquiredAt": rfc3339_ms(grant.acquired_at),
        "expiresAt": rfc3339_ms(grant.expires_at),
    }


# How long a verifier may use a copy of GET /v1/fencing-keys: a rotation publishes the new key
# at least this long before it signs (docs/operations.md "Fencing-proof keys").
FENCING_KEYS_MAX_AGE_S = 300


class FencingKeysView(APIView):
    """GET /v1/fencing-keys: the public keys proofs are checked with (open; decision 25)."""

    @openapi.fencing_keys
    def get(self, request: Request) -> Response:
        keys = proof.signing_keys()
        body = keys.public().document(signing_kid=keys.signing_kid)
        return Response(
            body, headers={"Cache-Control": f"public, max-age={FENCING_KEYS_MAX_AGE_S}"}
        )


class OpenSessionInput(StrictSerializer):
    ownerId = StrictCharField(required=False, allow_blank=True, trim_whitespace=False)
    ttlMillis = StrictIntegerField(required=False, min_value=TTL_MIN_MS, max_value=TTL_MAX_MS)


class EmptyInput(StrictSerializer):
    """Endpoints whose inputs are path and headers only: any body field is unknown."""


class SessionsView(APIView):
    """L1 POST /v1/sessions."""

    @openapi.open_session
    def post(self, request: Request) -> Response:
        data = _parse(OpenSessionInput, request.data)
        body_owner = data.get("ownerId")
        if body_owner:
            owner = validate_owner_id(body_owner, field="ownerId")
            header = _optional_owner(request)
            if header is not None and header != owner:
                raise validation_error(
                    "ownerId and X-Owner-Id disagree",
                    [{"field": "ownerId", "message": "differs from X-Owner-Id"}],
                )
        else:
            owner = owner_id(request)
        ttl = _clamp_ttl(data.get("ttlMillis", settings.LOCK_SESSION_TTL_MS))
        principal = request_principal(request)
        session = services.open_session(
            owner_id=owner, ttl_ms=ttl, credential_id=principal.credential_id
        )
        record_owner(session_id=session.session_id, principal=principal)
        return Response(
            {
                "sessionId": str(session.session_id),
                "ownerId": session.owner_id,
                "ttlMillis": session.ttl_ms,
                "expiresAt": rfc3339_ms(session.expires_at),
            },
            status=status.HTTP_201_CREATED,
        )


class HeartbeatView(APIView):
    """L2 POST /v1/sessions/{sessionId}/heartbeat."""

    @openapi.heartbeat
    def post(self, request: Request, session_id: str) -> Response:
        sid = parse_uuid(session_id, field="sessionId")
        owner = owner_id(request)
        _parse(EmptyInput, request.data)
        check_owner(session_id=sid, principal=request_principal(request))
        beat = services.heartbeat(session_id=sid, owner_id=owner)
        return Response(
            {
                "sessionId": str(beat.session_id),
                "expiresAt": rfc3339_ms(beat.expires_at),
                "serverTime": rfc3339_ms(beat.server_time),
                "heldLockCount": beat.held_lock_count,
            }
        )


class SessionView(APIView):
    """L3 DELETE /v1/sessions/{sessionId}."""

    @openapi.close_session
    def delete(self, request: Request, session_id: str) -> Response:
        sid = parse_uuid(session_id, field="sessionId")
        owner = owner_id(request)
        _parse(EmptyInput, request.data)
        check_owner(session_id=sid, principal=request_principal(request))
        services.close_session(session_id=sid, owner_id=owner)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AcquireInput(StrictSerializer):
    sessionId = StrictCharField()
    ttlMillis = StrictIntegerField(required=False, min_value=TTL_MIN_MS, max_value=TTL_MAX_MS)
    waitMillis = StrictIntegerField(required=False, min_value=0, max_value=WAIT_MAX_MS)


def _acquire(request: HttpRequest, key: str, body: Callable[[], Any]) -> dict:
    key = parse_key(key)
    owner = owner_id(request)
    data = _parse_acquire(body())
    sid = parse_uuid(data["sessionId"], field="sessionId")
    check_owner(session_id=sid, principal=request_principal(request))
    grant = services.acquire(
        key=key,
        session_id=sid,
        owner_id=owner,
        ttl_ms=_clamp_ttl(data.get("ttlMillis", settings.LOCK_DEFAULT_TTL_MS)),
        wait_ms=data.get("waitMillis", 0),
    )
    return grant_body(grant)


class AcquireView(APIView):
    """L4 POST /v1/locks/{key}/acquire."""

    @openapi.acquire
    def post(self, request: Request, key: str) -> Response:
        return Response(_acquire(request, key, lambda: request.data))


def acquire(request: HttpRequest, key: str) -> HttpResponse:
    """L4 as a plain view (decision 17): AcquireView's answer without DRF's dispatch."""
    return hotview.answer(_acquire(request, key, lambda: hotview.json_body(request)))


class RenewInput(StrictSerializer):
    sessionId = StrictCharField()
    ttlMillis = StrictIntegerField(required=False, min_value=TTL_MIN_MS, max_value=TTL_MAX_MS)


def _renew(request: HttpRequest, key: str, body: Callable[[], Any]) -> dict:
    key = parse_key(key)
    token = fencing_token(request)
    owner_id(request)  # attribution (C3 §3.1); the grant is named by (key, token, session)
    data = _parse(RenewInput, body())
    sid = parse_uuid(data["sessionId"], field="sessionId")
    ttl = data.get("ttlMillis")
    check_owner(session_id=sid, principal=request_principal(request))
    proof.require(request, key=key, token=token)
    grant = services.renew(
        key=key, session_id=sid, token=token, ttl_ms=None if ttl is None else _clamp_ttl(ttl)
    )
    return grant_body(grant)


class RenewView(APIView):
    """L5 POST /v1/locks/{key}/renew."""

    @openapi.renew
    def post(self, request: Request, key: str) -> Response:
        return Response(_renew(request, key, lambda: request.data))


def renew(request: HttpRequest, key: str) -> HttpResponse:
    """L5 as a plain view (decision 17)."""
    return hotview.answer(_renew(request, key, lambda: hotview.json_body(request)))


class ReleaseInput(StrictSerializer):
    sessionId = StrictCharField(required=False)


class LockView(APIView):
    """L7 GET /v1/locks/{key} (advisory) and L6 DELETE /v1/locks/{key}."""

    @openapi.inspect
    def get(self, request: Request, key: str) -> Response:
        key = parse_key(key)
        info = services.inspect(key=key)
        body: dict = {"key": info.key, "held": info.held}
        if info.held:
            body.update(
                ownerId=info.owner_id,
                fencingToken=info.fencing_token,
                acquiredAt=rfc3339_ms(info.acquired_at),
                expiresAt=rfc3339_ms(info.expires_at),
            )
        body["waiterCount"] = info.waiter_count
        return Response(body)

    @openapi.release
    def delete(self, request: Request, key: str) -> Response:
        _release(request, key, lambda: request.data)
        return Response(status=status.HTTP_204_NO_CONTENT)


# A query string that is exactly `sessionId=<unreserved characters>`: nothing to decode, a single
# value, so it is what request.GET.get("sessionId") yields, without building a QueryDict.
_PLAIN_SESSION_QUERY = re.compile(r"sessionId=([0-9A-Za-z\-]+)", re.ASCII)


def _query_session_id(request: HttpRequest) -> str | None:
    raw = request.META.get("QUERY_STRING", "")
    if raw == "":
        return None
    match = _PLAIN_SESSION_QUERY.fullmatch(raw)
    return match.group(1) if match else request.GET.get("sessionId")


def _release(request: HttpRequest, key: str, body: Callable[[], Any]) -> None:
    key = parse_key(key)
    token = fencing_token(request)
    owner_id(request)  # attribution (C3 §3.1); the predicate is (key, token) only
    data = _parse_release(body())
    in_query = _query_session_id(request)
    in_body = data.get("sessionId")
    if in_query is not None and in_body is not None and in_query != in_body:
        raise validation_error(
            "sessionId in the query and the body disagree",
            [{"field": "sessionId", "message": "query and body differ"}],
        )
    raw = in_query if in_query is not None else in_body
    if raw is None:
        raise validation_error(
            "sessionId is required (query parameter or body)",
            [{"field": "sessionId", "message": "required"}],
        )
    sid: uuid.UUID = parse_uuid(raw, field="sessionId")
    check_owner(session_id=sid, principal=request_principal(request))
    proof.require(request, key=key, token=token)
    services.release(key=key, session_id=sid, token=token)


def release(request: HttpRequest, key: str) -> HttpResponse:
    """L6 as a plain view (decision 17); L7 GET on the same path stays LockView's."""
    _release(request, key, lambda: hotview.json_body(request))
    return hotview.no_content()


class RevokeInput(StrictSerializer):
    operator = StrictCharField(max_length=128)
    reason = StrictCharField(min_length=8, max_length=2_000)
    expectedToken = StrictInt64Field(required=False, min_value=1)


class RevokeView(APIView):
    """L8 POST /v1/locks/{key}/revoke (operator action)."""

    @openapi.revoke
    def post(self, request: Request, key: str) -> Response:
        key = parse_key(key)
        data = _parse(RevokeInput, request.data)
        record = services.revoke(
            key=key,
            operator=data["operator"],
            reason=data["reason"],
            expected_token=data.get("expectedToken"),
        )
        return Response(
            {
                "revokedToken": record.revoked_token,
                "newTokenFloor": record.new_token_floor,
                "revocationId": str(record.revocation_id),
            }
        )
