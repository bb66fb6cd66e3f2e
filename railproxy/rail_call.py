"""The rail call (C3 §3.5 step 4): present the payout exactly once, classify what came back.

Never retried: a second presentation of a non-idempotent rail is the double payment this
project exists to prevent. A connect failure proves nothing was presented (NOT_SENT); anything
after bytes left without a valid ack is TIMEOUT (ambiguous) — CHANGELOG row 10.

One fresh connection per submission, closed after it: never a pooled or reused connection (a
kept-alive one could have died before the send, and the rail must never see a request twice).
It is opened and framed by `dlock.http` (the same response reader as every dlock hop) but never
taken from or given back to a pool. The same two timeouts as every hop: `RAIL_CONNECT_TIMEOUT_MS`
bounds the TCP connect, `RAIL_READ_TIMEOUT_MS` is ONE deadline for sending the request and
reading the whole answer, so a rail that trickles its answer cannot hold the proxy past its
request deadline (C3 §3.8's chain; a per-read timeout could be stretched without end).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from dlock.http import Connection, ProtocolError, decode_json, pool_for, request_bytes
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
    # The process's pool for the rail's origin, used only to `open`: a connection is never
    # taken from it or given back, so none is ever kept or reused.
    try:
        origin = pool_for(settings.RAIL_STUB_URL)  # ValueError: not an http(s) URL
        connection = origin.open(settings.RAIL_CONNECT_TIMEOUT_MS / 1000)
    except (OSError, ValueError):  # refused, unreachable, connect timeout, no such host: unsent
        return RailAnswer(Outcome.NOT_SENT, "connect_failed")
    # From here on bytes may have left: whatever fails is ambiguous, never re-sent.
    try:
        path = urlsplit(settings.RAIL_STUB_URL).path
        status, payload = _exchange(connection, origin.host_header, path, body)
    except TimeoutError:
        return RailAnswer(Outcome.TIMEOUT, "read_timeout")
    except (OSError, ProtocolError):
        return RailAnswer(Outcome.TIMEOUT, "connection_lost")
    finally:
        connection.close()
    return _classify(status, payload)


def _exchange(connection: Connection, host: str, base_path: str, body: bytes) -> tuple[int, bytes]:
    read_s = settings.RAIL_READ_TIMEOUT_MS / 1000
    connection.sock.settimeout(read_s)
    connection.deadline = time.monotonic() + read_s
    headers = {
        "Accept": "application/json",
        "Accept-Encoding": "identity",
        "Content-Type": "application/json; charset=utf-8",
        "traceparent": traceparent(),
        "Connection": "close",  # one request per connection, said so to the rail too
    }
    path = f"{base_path.rstrip('/')}/submit"
    connection.sock.sendall(request_bytes("POST", path, host, headers, body))
    status, _, payload, _ = connection.read_response("POST")
    return status, payload


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
