"""The rail call (C3 §3.5 step 4): present the payout exactly once, classify what came back.

Never retried: a second presentation of a non-idempotent rail is the double payment this
project exists to prevent. A connect failure proves nothing was presented (NOT_SENT); anything
after bytes left without a valid ack is TIMEOUT (ambiguous) — CHANGELOG row 10.

One bare `http.client` connection per submission, closed after it: never a pooled or reused
connection (a kept-alive one could have died before the send, and the rail must never see a
request twice). The same two timeouts as every hop: `RAIL_CONNECT_TIMEOUT_MS` bounds the TCP
connect, `RAIL_READ_TIMEOUT_MS` every later socket operation (send and each read), as requests
applied them before (a requests.Session + urllib3 pool per submission cost a fifth of the proxy's
CPU, docs/benchmarks.md).
"""

from __future__ import annotations

import http.client
import json
import uuid
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

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
    target = urlsplit(settings.RAIL_STUB_URL)
    connection_class = (
        http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_class(
        target.hostname or "127.0.0.1",
        target.port,
        timeout=settings.RAIL_CONNECT_TIMEOUT_MS / 1000,
    )
    try:
        try:
            connection.connect()
        except OSError:  # refused, unreachable, connect timeout, name resolution: nothing sent
            return RailAnswer(Outcome.NOT_SENT, "connect_failed")
        # From here on bytes may have left: whatever fails is ambiguous, never re-sent.
        assert connection.sock is not None
        connection.sock.settimeout(settings.RAIL_READ_TIMEOUT_MS / 1000)
        try:
            status, payload = _exchange(connection, target.path, body)
        except TimeoutError:
            return RailAnswer(Outcome.TIMEOUT, "read_timeout")
        except (OSError, http.client.HTTPException):
            return RailAnswer(Outcome.TIMEOUT, "connection_lost")
    finally:
        connection.close()
    return _classify(status, payload)


def _exchange(
    connection: http.client.HTTPConnection, base_path: str, body: bytes
) -> tuple[int, bytes]:
    connection.request(
        "POST",
        f"{base_path.rstrip('/')}/submit",
        body=body,
        headers={
            "Accept": "application/json",
            "Content-Type": "application/json; charset=utf-8",
            "traceparent": traceparent(),
            "Connection": "close",  # one request per connection, said so to the rail too
        },
    )
    response = connection.getresponse()
    return response.status, response.read()


def _classify(status: int, payload: bytes) -> RailAnswer:
    if status == 402:
        return RailAnswer(Outcome.DECLINED, "http_402")
    if status != 200:
        return RailAnswer(Outcome.TIMEOUT, f"http_{status}")
    body: Any
    try:
        body = json.loads(payload) if payload else None
    except ValueError:
        body = None
    reference = body.get("railReference") if isinstance(body, dict) else None
    if (
        not isinstance(reference, str)
        or not 0 < len(reference) <= 128
        or not isinstance(body.get("acceptedAt"), str)
    ):
        return RailAnswer(Outcome.TIMEOUT, "malformed_ack")
    return RailAnswer(Outcome.ACKED, "acked", reference)
