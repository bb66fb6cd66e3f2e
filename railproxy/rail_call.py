"""The rail call (C3 §3.5 step 4): present the payout exactly once, classify what came back.

Never retried: a second presentation of a non-idempotent rail is the double payment this
project exists to prevent. A connect failure proves nothing was presented (NOT_SENT); anything
after bytes left without a valid ack is TIMEOUT (ambiguous) — CHANGELOG row 10.
"""

from __future__ import annotations

import uuid

import requests
from django.conf import settings

from dlock.budgets import Budget
from dlock.http import TransportError, exchange, new_session
from railproxy.models import Outcome
from railproxy.submission import RailAnswer, SubmissionRequest


def forward(*, request: SubmissionRequest, submission_id: uuid.UUID) -> RailAnswer:
    """Present the payout to the rail exactly once and classify what came back."""
    hop = Budget(
        settings.RAIL_CONNECT_TIMEOUT_MS / 1000,
        settings.RAIL_READ_TIMEOUT_MS / 1000,
        0,
        "proxy → rail, never retried (FR-20)",
    )
    session = new_session()  # a fresh connection: a pooled one could die mid-send
    try:
        reply = exchange(
            "POST",
            f"{settings.RAIL_STUB_URL.rstrip('/')}/submit",
            hop=hop,
            json_body={
                "clientRef": str(request.payout_id),
                "amountMinor": request.amount_minor,
                "currency": request.currency,
            },
            session=session,
        )
    except TransportError as exc:
        if not exc.sent:
            return RailAnswer(Outcome.NOT_SENT, "connect_failed")
        return RailAnswer(Outcome.TIMEOUT, _transport_detail(exc))
    finally:
        session.close()
    if reply.status == 402:
        return RailAnswer(Outcome.DECLINED, "http_402")
    if reply.status != 200:
        return RailAnswer(Outcome.TIMEOUT, f"http_{reply.status}")
    body = reply.body
    reference = body.get("railReference") if isinstance(body, dict) else None
    if (
        not isinstance(reference, str)
        or not 0 < len(reference) <= 128
        or not isinstance(body.get("acceptedAt"), str)
    ):
        return RailAnswer(Outcome.TIMEOUT, "malformed_ack")
    return RailAnswer(Outcome.ACKED, "acked", reference)


def _transport_detail(exc: TransportError) -> str:
    if isinstance(exc.cause, requests.ReadTimeout):
        return "read_timeout"
    return "connection_lost"
