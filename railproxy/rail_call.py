"""The rail call (C3 §3.5 step 4): present the payout exactly once, classify what came back.

Never retried: a second presentation of a non-idempotent rail is the double payment this
project exists to prevent. A connect failure proves nothing was presented (NOT_SENT); anything
after bytes left without a valid ack is TIMEOUT (ambiguous) — CHANGELOG row 10. A 502/503/504
from a proxy in front of the rail (the rail's own nginx) is ambiguous too: the proxy may have
forwarded the request before it failed.

One fresh connection per submission, closed after it: never a pooled or reused connection (a
kept-alive one could have died before the send, and the rail must never see a request twice):
`dlock.http.send_once`, on urllib3 with retries off. The same two timeouts as every hop:
`RAIL_CONNECT_TIMEOUT_MS` bounds the TCP (and TLS) connect, `RAIL_READ_TIMEOUT_MS` is ONE deadline
for sending the request and reading the whole answer, so a rail that trickles its answer cannot
hold the proxy past its request deadline (C3 §3.8's chain; a per-read timeout could be stretched
without end). An https:// rail is verified against DLOCK_CA_BUNDLE (else the system store).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.conf import settings
from urllib3.exceptions import ReadTimeoutError

from dlock.http import TransportError, decode_json, send_once
from dlock.tracing import traceparent
from railproxy.models import Outcome
from railproxy.submission import RailAnswer, SubmissionRequest


def forward(*, request: SubmissionRequest, submission_id: uuid.UUID) -> RailAnswer:
    """Present the payout to the rail exactly once and classify what came back."""
    body = json.dumps(
        {
            "clientRef": str(request.payout_id),
            "amountMinor": request.amount_minor,
            "currency": request.currency,
        },
        separators=(",", ":"),
    ).encode()
    url = f"{settings.RAIL_STUB_URL.rstrip('/')}/submit"
    try:
        status, _, payload = send_once(
            "POST",
            url,
            connect_s=settings.RAIL_CONNECT_TIMEOUT_MS / 1000,
            read_s=settings.RAIL_READ_TIMEOUT_MS / 1000,
            body=body,
            headers={
                "Accept": "application/json",
                "Content-Type": "application/json; charset=utf-8",
                "traceparent": traceparent(),
            },
        )
    except TransportError as exc:
        if not exc.sent:  # refused, unreachable, connect timeout, TLS, no such host: unsent
            return RailAnswer(Outcome.NOT_SENT, "connect_failed")
        # Bytes may have left: whatever failed is ambiguous, never re-sent.
        if isinstance(exc.cause, (TimeoutError, ReadTimeoutError)):
            return RailAnswer(Outcome.TIMEOUT, "read_timeout")
        return RailAnswer(Outcome.TIMEOUT, "connection_lost")
    return _classify(status, payload)


def _classify(status: int, payload: bytes) -> RailAnswer:
    if status == 402:
        return RailAnswer(Outcome.DECLINED, "http_402")
    if status != 200:
        return RailAnswer(Outcome.TIMEOUT, f"http_{status}")
    body: Any = decode_json(payload) if payload else None
    reference = body.get("railReference") if isinstance(body, dict) else None
    if (
        not isinstance(reference, str)
        or not 0 < len(reference) <= 128
        or not isinstance(body.get("acceptedAt"), str)
    ):
        return RailAnswer(Outcome.TIMEOUT, "malformed_ack")
    return RailAnswer(Outcome.ACKED, "acked", reference)
