"""Admission (C3 §3.5 steps 0–3): one transaction that either commits an intent or refuses.

0. identity lock, then the replay lookup (same key, same token, same body → the recorded answer)
   or else the payout, row-locked until the commit, in one statement; the request must name the
   payout exactly as paydb stores it, its own stable key included (404 / 400 VALIDATION_FAILED,
   nothing written);
1. strict high-water advance for the account → else a FENCED row, 409 FENCED_OUT;
2. no live submission for the payout → else 409 DUPLICATE_SUBMISSION;
3. the payout CLAIMED under this very token → SUBMITTING, intent row PENDING; COMMIT.
Steps 1–3 are the fence kit's side-effect gate (`fenced_sql.RAIL_GATE.admit`): the payout's
claim is its precondition, the FENCED row its kept refusal, the submission row its intent.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import IntegrityError, transaction

from dlock import idempotency, metrics
from dlock.errors import ApiError, Code, not_found, payout_not_claimable, validation_error
from dlock.fence.gate import DuplicateOperation, Intent, Superseded
from dlock.fence.refusals import FencedOut
from dlock.logs import log_event
from dlock.prepared import prepared_cursor
from payments.fenced_sql.payout import transition_payout
from railproxy import fenced_sql
from railproxy.models import Outcome
from railproxy.submission import (
    OPERATION,
    Admitted,
    FencedRecorded,
    Replay,
    SubmissionRequest,
    alias,
    stored_error,
)

FENCED_CLAIM_MESSAGE = "the payout was claimed under a newer fencing token"


def admit(request: SubmissionRequest) -> Admitted | Replay | FencedRecorded:
    """Steps 0–3 in one paydb transaction; raises the refusals that leave no row."""
    using = alias()
    with transaction.atomic(using=using), prepared_cursor(using) as cursor:
        idempotency.lock_identity(
            cursor, operation=OPERATION, key=request.idempotency_key, token=request.token
        )
        step = fenced_sql.replay_or_payout(
            cursor, key=request.idempotency_key, token=request.token, payout_id=request.payout_id
        )
        if step.recorded is not None:
            submission_id, outcome, request_hash, status, body = step.recorded
            idempotency.check_same_request(
                stored_hash=request_hash,
                presented_hash=request.body_hash(),
                key=request.idempotency_key,
            )
            return Replay(status, body, outcome, submission_id)

        if step.payout is None:
            raise not_found("payout", str(request.payout_id))
        _check_request_names_the_payout(request, step.payout)

        try:
            return _steps_one_to_three(cursor, request, step.payout)
        except FencedOut as fenced:  # on record (a FENCED row), committed with the mark unmoved
            return FencedRecorded(fenced)
        except DuplicateOperation as duplicate:  # raised out of the transaction: nothing written
            raise _duplicate(request, existing=duplicate.existing) from None
        except IntegrityError:
            # Two submissions for one payout raced past step 2: the partial unique index wins.
            # Raised out of the transaction, which rolls back whole.
            raise _duplicate(request, existing=None) from None


def _check_request_names_the_payout(
    request: SubmissionRequest, stored: fenced_sql.PayoutRow
) -> None:
    """The body and key must describe the payout as paydb stores it (immutable fields)."""
    fields = [
        {"field": field, "message": message}
        for field, given, expected, message in (
            ("accountId", request.account_id, stored.account_id, "not this payout's account"),
            ("amountMinor", request.amount_minor, stored.amount_minor, "not this payout's amount"),
            ("currency", request.currency, stored.currency, "not this payout's currency"),
            (
                "beneficiaryRef",
                request.beneficiary_ref,
                stored.beneficiary_ref,
                "not this payout's beneficiary",
            ),
        )
        if given != expected
    ]
    foreign = idempotency.foreign_key_field(
        presented=request.idempotency_key, stable=stored.idempotency_key
    )
    if foreign is not None:
        fields.append(foreign)
    if fields:
        raise validation_error("the request does not match the payout it names", fields)


def _steps_one_to_three(
    cursor: Any, request: SubmissionRequest, payout: fenced_sql.PayoutRow
) -> Admitted:
    """Steps 1–3 through the rail's side-effect gate, on the payout row-locked by step 0: the
    account's strict high-water advance, one live submission per payout whatever the token
    (FR-18), then the payout CLAIMED under this very token → SUBMITTING and the intent row.
    A fenced refusal is recorded (a FENCED row) with the mark where it was and raised."""
    # A newer holder re-claimed the payout: the presenter lost its lock (step 3's refusal). Step
    # 1 is then only asked, so the refusal leaves the mark unmoved.
    superseded = None
    if payout.claim_token is not None and payout.claim_token > request.token:
        superseded = Superseded(
            resource_id=str(request.payout_id),
            highest_token=payout.claim_token,
            reason="fenced_claim",
            message=FENCED_CLAIM_MESSAGE,
        )

    def claimed_under_this_token(cursor: Any, intent: Intent) -> None:
        if payout.state != "CLAIMED" or payout.claim_token != request.token:
            raise _not_claimable(request, payout)
        moved = transition_payout(
            cursor,
            payout_id=request.payout_id,
            from_states=("CLAIMED",),
            to_state="SUBMITTING",
            token=request.token,
            owner_id=request.owner_id,
            note=f"rail submission {intent.intent_id}",
        )
        if not moved:  # pragma: no cover - the row is locked FOR UPDATE above
            raise _not_claimable(request, payout)

    def pending_row(cursor: Any, intent: Intent) -> Any:
        return insert_submission(
            cursor, request, submission_id=intent.intent_id, outcome=Outcome.PENDING
        )

    def fenced_row(cursor: Any, refusal: FencedOut, reason: str) -> None:
        _record_fenced(cursor, request, refusal, reason)

    intent = fenced_sql.RAIL_GATE.admit(
        cursor,
        resource_id=request.account_id,
        operation_id=str(request.payout_id),
        token=request.token,
        owner_id=request.owner_id,
        superseded=superseded,
        precondition=claimed_under_this_token,
        write_intent=pending_row,
        on_fenced=fenced_row,
        log_fields={"payoutId": str(request.payout_id)},
    )
    return Admitted(intent.intent_id, intent.written)


def insert_submission(
    cursor: Any,
    request: SubmissionRequest,
    *,
    submission_id: uuid.UUID,
    outcome: Outcome,
    highest_token: int | None = None,
    detail: str | None = None,
    response_status: int | None = None,
    response_body: dict | None = None,
) -> Any:
    """One submission row for `request`; returns its submitted_at (the database clock)."""
    return fenced_sql.insert_submission(
        cursor,
        submission_id=submission_id,
        payout_id=request.payout_id,
        account_id=request.account_id,
        amount_minor=request.amount_minor,
        currency=request.currency,
        token=request.token,
        highest_token=highest_token,
        owner_id=request.owner_id,
        key=request.idempotency_key,
        request_hash=request.body_hash(),
        client_ref=str(request.payout_id),
        outcome=outcome,
        detail=detail,
        response_status=response_status,
        response_body=response_body,
    )


def _record_fenced(cursor: Any, request: SubmissionRequest, error: FencedOut, reason: str) -> None:
    """The refusal stays on record (a FENCED row) without blocking a later legitimate holder."""
    insert_submission(
        cursor,
        request,
        submission_id=uuid.uuid4(),
        outcome=Outcome.FENCED,
        highest_token=error.highest_token,
        detail=reason,
        response_status=error.status,
        response_body=stored_error(error),
    )
    metrics.rail_submission.labels(outcome="fenced").inc()


def _duplicate(request: SubmissionRequest, *, existing: tuple | None) -> ApiError:
    details: dict[str, Any] = {"payoutId": str(request.payout_id), "presentedToken": request.token}
    if existing is not None:
        details.update(
            existingSubmissionId=str(existing[0]),
            existingOutcome=existing[1],
            existingToken=existing[2],
        )
    metrics.rail_duplicate_attempted.inc()
    metrics.rail_submission.labels(outcome="duplicate").inc()
    log_event(
        "duplicate_rail_submission_attempted",
        level=logging.ERROR,
        payoutId=str(request.payout_id),
        accountId=request.account_id,
        presentedToken=request.token,
        ownerId=request.owner_id,
        existingSubmissionId=details.get("existingSubmissionId"),
        existingOutcome=details.get("existingOutcome"),
    )
    return ApiError(
        Code.DUPLICATE_SUBMISSION,
        "the proxy already holds a submission for this payout; resolve from that record",
        details=details,
    )


def _not_claimable(request: SubmissionRequest, payout: fenced_sql.PayoutRow) -> ApiError:
    if payout.state == "CLAIMED":
        message = "the payout is claimed under another token; claim it with this token first"
    else:
        message = f"the payout is {payout.state}; only a CLAIMED payout can be submitted"
    log_event(
        "rail_submission_not_claimable",
        level=logging.WARNING,
        payoutId=str(request.payout_id),
        state=payout.state,
        claimToken=payout.claim_token,
        presentedToken=request.token,
        ownerId=request.owner_id,
    )
    return payout_not_claimable(
        payout_id=str(request.payout_id),
        state=payout.state,
        expected_states=("CLAIMED",),
        claim_token=payout.claim_token,
        presented_token=request.token,
        message=message,
    )
