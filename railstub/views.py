"""POST /submit: the third party's URL shape (no /v1, no token, no idempotency header).

Served by the plain view `submit` (ARCHITECTURE decision 17, dlock.hotview); `SubmitView`, the
DRF class sharing its code, stays the OpenAPI source and answers every other method.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.http import HttpRequest, HttpResponse
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.views import APIView

from dlock import hotview
from dlock.dbrouter import alias_for
from dlock.logs import log_event
from dlock.rendering import json_response
from dlock.serializers import StrictCharField, StrictInt64Field, StrictSerializer, common_shape
from dlock.timefmt import rfc3339_ms
from dlock.wire import JSON_CONTENT_TYPE
from railstub import openapi, services
from railstub.services import Fault

_CURRENCY = re.compile(r"[A-Z]{3}", re.ASCII)


class SubmitIn(StrictSerializer):
    clientRef = StrictCharField(min_length=1, max_length=128, trim_whitespace=False)
    amountMinor = StrictInt64Field(min_value=1)
    currency = StrictCharField(min_length=3, max_length=3, trim_whitespace=False)

    def validate_currency(self, value: str) -> str:
        if not _CURRENCY.fullmatch(value):
            raise serializers.ValidationError("ISO-4217: three uppercase letters")
        return value


def _raw(body: dict, status: int) -> HttpResponse:
    """A third party's own non-2xx body: passed through as is, not wrapped in our envelope."""
    response = HttpResponse(json.dumps(body), status=status, content_type=JSON_CONTENT_TYPE)
    response.dlock_envelope = True
    return response


def _drop_connection(request: HttpRequest) -> HttpResponse:
    """Close the TCP connection without a response (gunicorn's raw socket); the caller sees EOF."""
    sock = request.META.get("gunicorn.socket")
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone: the effect we wanted
    else:  # no raw socket (runserver / test client): the closest thing is a bare 502
        return _raw({"error": "connection dropped"}, 502)
    # gunicorn's write to the shut socket fails with EPIPE, which it ignores; 444 ("closed
    # without a response") keeps an intended drop out of the error log.
    return _raw({"error": "connection dropped"}, 444)


_common_transfer = common_shape(SubmitIn)


def parse_transfer(data: Any) -> dict:
    """SubmitIn's validated data: the common shape checked from its own fields
    (dlock.serializers.common_shape; the stub shares the box in every benchmark); anything
    else, and so every refusal and its details, through the serializer."""
    common = _common_transfer(data)
    if common is not None:
        return common
    parsed = SubmitIn(data=data)
    parsed.is_valid(raise_exception=True)
    return parsed.validated_data


def _submit(request: HttpRequest, body: Callable[[], Any]) -> HttpResponse:
    data = parse_transfer(body())
    client_ref = data["clientRef"]
    amount = data["amountMinor"]
    currency = data["currency"]

    config = services.load_config()
    if config.latency_ms:
        connections[alias_for("railstub")].close()  # no pooled connection held asleep
        time.sleep(config.latency_ms / 1000)
    decision = services.choose_fault(config)
    booking = services.record_call(
        client_ref=client_ref, amount_minor=amount, currency=currency, decision=decision
    )
    log_event(
        "rail_stub_request",
        clientRef=client_ref,
        fault=decision.fault.value,
        railReference=booking.rail_reference if booking else None,
        duplicateReference=booking.duplicate_reference if booking else None,
    )

    if decision.fault is Fault.DECLINED:
        return _raw({"status": "DECLINED", "reason": "declined by the rail"}, 402)
    if decision.fault is Fault.ERROR_5XX:
        return _raw({"error": "rail internal error"}, 500)
    if decision.fault is Fault.DROP_BEFORE_BOOKING:
        time.sleep(config.hold_ms / 1000)
        return _drop_connection(request)
    if decision.fault is Fault.DROP_AFTER_BOOKING:
        return _drop_connection(request)
    return json_response(
        {"railReference": booking.rail_reference, "acceptedAt": rfc3339_ms(booking.accepted_at)}
    )


class SubmitView(APIView):
    @openapi.submit
    def post(self, request: Request) -> HttpResponse:
        return _submit(request, lambda: request.data)


def submit(request: HttpRequest) -> HttpResponse:
    """POST /submit as a plain view (decision 17, dlock.hotview): SubmitView's answer without
    DRF's request, negotiation and serializer on the stub's one endpoint."""
    return _submit(request, lambda: hotview.json_body(request))
