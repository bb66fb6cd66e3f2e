"""The values a rail submission passes between its steps (admission, rail call, recording)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from dlock import idempotency
from dlock.dbrouter import alias_for
from dlock.errors import ApiError
from dlock.tracing import current_trace_id
from railproxy.models import Outcome

# The idempotency identity's operation name (dlock.idempotency.lock_identity).
OPERATION = "rail"


@dataclass(frozen=True)
class SubmissionRequest:
    payout_id: uuid.UUID
    account_id: str
    amount_minor: int
    currency: str
    beneficiary_ref: str
    token: int
    owner_id: str
    idempotency_key: str

    def body_hash(self) -> str:
        return idempotency.request_hash(
            {
                "payoutId": str(self.payout_id),
                "accountId": self.account_id,
                "amountMinor": self.amount_minor,
                "currency": self.currency,
                "beneficiaryRef": self.beneficiary_ref,
            }
        )


@dataclass(frozen=True)
class Accepted:
    """A 200 answer; `replayed` tells the view to set Idempotent-Replayed."""

    body: dict[str, Any]
    replayed: bool = False


@dataclass(frozen=True)
class Admitted:
    """Steps 1–3 committed an intent row PENDING: the payout may be presented once."""

    submission_id: uuid.UUID
    submitted_at: Any


@dataclass(frozen=True)
class Replay:
    """The identity's recorded row: answer from it, never present the payout again."""

    status: int
    body: dict[str, Any] | None
    outcome: str
    submission_id: Any


@dataclass(frozen=True)
class FencedRecorded:
    """Refused at admission; the FENCED row is committed and `error` is the answer."""

    error: ApiError


@dataclass(frozen=True)
class RailAnswer:
    outcome: Outcome
    detail: str
    rail_reference: str | None = None


def alias() -> str:
    return alias_for("railproxy")


def stored_error(error: ApiError) -> dict[str, Any]:
    """The envelope as answered, traceId included, so a replay can answer it byte for byte."""
    return error.envelope(current_trace_id())
