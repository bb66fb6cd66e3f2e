"""Recording: the outcome of the one rail call, and answers given from a record.

`record()` writes the outcome and moves the payout in one transaction: ACKED → RAIL_ACKED,
TIMEOUT → RAIL_AMBIGUOUS, DECLINED → FAILED, NOT_SENT → CLAIMED (the same token may come back
for this payout). The sweep may have resolved the intent first; then its answer stands.
`answer_replay()` answers an identity that already has a row, without any rail call.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, transaction

from dlock import idempotency, metrics
from dlock.errors import ApiError, Code
from dlock.logs import log_event
from dlock.prepared import prepared_cursor
from dlock.timefmt import rfc3339_ms
from payments.fenced_sql.payout import transition_payout
from railproxy import fenced_sql
from railproxy.models import Outcome
from railproxy.submission import (
    Accepted,
    Admitted,
    RailAnswer,
    Replay,
    SubmissionRequest,
    alias,
    stored_error,
)

# Payout state each recorded outcome moves SUBMITTING to.
PAYOUT_STATE_AFTER = {
    Outcome.ACKED: "RAIL_ACKED",
    Outcome.TIMEOUT: "RAIL_AMBIGUOUS",
    Outcome.DECLINED: "FAILED",
    Outcome.NOT_SENT: "CLAIMED",
}
METRIC_OUTCOME = {
    Outcome.ACKED: "acked",
    Outcome.TIMEOUT: "timeout",
    Outcome.DECLINED: "declined",
    Outcome.NOT_SENT: "not_sent",
    Outcome.FENCED: "fenced",
}
EVENT_FOR = {
    Outcome.ACKED: "rail_acked",
    Outcome.TIMEOUT: "rail_ambiguous",
    Outcome.DECLINED: "rail_declined",
    Outcome.NOT_SENT: "rail_not_sent",
}
# C3 §3.5 "422 REJECTED→VALIDATION_FAILED": a catalogued override (dlock.errors, CHANGELOG 8).
DECLINED_STATUS = 422


def record(request: SubmissionRequest, admitted: Admitted, answer: RailAnswer) -> Accepted:
    """Store the outcome, move the payout, count and log it; return the 200 or raise."""
    using = alias()
    status, body, error = _answer_for(request, admitted, answer)
    try:
        with transaction.atomic(using=using), prepared_cursor(using) as cursor:
            resolved = fenced_sql.resolve_submission(
                cursor,
                submission_id=admitted.submission_id,
                outcome=answer.outcome,
                detail=answer.detail,
                rail_reference=answer.rail_reference,
                response_status=status,
                response_body=body if error is None else stored_error(error),
                stamped=error is None,  # the 200's times are the row's, stored with it
            )
            if resolved is None:
                # The sweep already declared this intent ambiguous (we were paused that long).
                stored = fenced_sql.submission(cursor, submission_id=admitted.submission_id)
            else:
                if error is None:
                    body["submittedAt"] = rfc3339_ms(resolved[0])
                    body["resolvedAt"] = rfc3339_ms(resolved[1])
                _move_payout(cursor, request, admitted, answer)
    except DatabaseError as exc:
        raise _not_recorded(request, admitted, answer, exc) from exc

    if resolved is None:
        raise _swept_first(request, admitted, answer, stored)

    metrics.rail_submission.labels(outcome=METRIC_OUTCOME[answer.outcome]).inc()
    log_event(
        EVENT_FOR[answer.outcome],
        level=logging.INFO if answer.outcome == Outcome.ACKED else logging.WARNING,
        submissionId=str(admitted.submission_id),
        payoutId=str(request.payout_id),
        accountId=request.account_id,
        presentedToken=request.token,
        ownerId=request.owner_id,
        outcome=answer.outcome.value,
        reason=answer.detail,
        railReference=answer.rail_reference,
    )
    if error is not None:
        raise error
    return Accepted(body)


def _log_lost_outcome(
    event: str, request: SubmissionRequest, admitted: Admitted, answer: RailAnswer, **extra: Any
) -> None:
    """An outcome the rail gave that the proxy's record does not (or cannot) carry."""
    log_event(
        event,
        level=logging.ERROR,
        submissionId=str(admitted.submission_id),
        payoutId=str(request.payout_id),
        railOutcome=answer.outcome.value,
        railReference=answer.rail_reference,
        **extra,
    )


def _not_recorded(
    request: SubmissionRequest, admitted: Admitted, answer: RailAnswer, exc: DatabaseError
) -> ApiError:
    _log_lost_outcome(
        "rail_outcome_not_recorded", request, admitted, answer, error=type(exc).__name__
    )
    return ApiError(
        Code.RAIL_AMBIGUOUS,
        "the attempt's outcome could not be recorded; the sweep will quarantine it",
        details={"submissionId": str(admitted.submission_id), "outcome": "PENDING"},
    )


def _swept_first(
    request: SubmissionRequest, admitted: Admitted, answer: RailAnswer, stored: tuple | None
) -> ApiError:
    _log_lost_outcome(
        "rail_outcome_after_sweep",
        request,
        admitted,
        answer,
        recordedOutcome=stored[0] if stored else None,
    )
    if stored is not None and stored[2] is not None and stored[3] is not None:
        return idempotency.recorded_error(stored[2], stored[3], replayed=False)
    return ApiError(Code.RAIL_AMBIGUOUS, "the attempt was declared ambiguous by the sweep")


def _answer_for(
    request: SubmissionRequest, admitted: Admitted, answer: RailAnswer
) -> tuple[int, dict[str, Any] | None, ApiError | None]:
    """(status, 200 body or None, ApiError or None) for a recorded outcome."""
    base = {"submissionId": str(admitted.submission_id), "payoutId": str(request.payout_id)}
    if answer.outcome == Outcome.ACKED:
        body = {
            **base,
            "presentedToken": request.token,
            "outcome": "ACKED",
            "railReference": answer.rail_reference,
            "submittedAt": None,
            "resolvedAt": None,
        }
        return 200, body, None
    if answer.outcome == Outcome.TIMEOUT:
        error = ApiError(
            Code.RAIL_AMBIGUOUS,
            "the rail was presented this payout and gave no valid answer; "
            "the payout is quarantined (RAIL_AMBIGUOUS), never resubmit",
            details={**base, "outcome": "TIMEOUT", "reason": answer.detail},
        )
    elif answer.outcome == Outcome.DECLINED:
        error = ApiError(
            Code.VALIDATION_FAILED,
            "the rail declined the transfer; the payout is FAILED",
            details={**base, "outcome": "DECLINED", "payoutState": "FAILED"},
            http_status=DECLINED_STATUS,
        )
    else:
        error = ApiError(
            Code.RAIL_UNAVAILABLE,
            "the rail could not be reached; nothing was presented and the payout is CLAIMED "
            "again, so the same request may be retried",
            details={**base, "outcome": "NOT_SENT"},
        )
    return error.status, None, error


def _move_payout(
    cursor: Any, request: SubmissionRequest, admitted: Admitted, answer: RailAnswer
) -> None:
    to_state = PAYOUT_STATE_AFTER[answer.outcome]
    moved = transition_payout(
        cursor,
        payout_id=request.payout_id,
        from_states=("SUBMITTING",),
        to_state=to_state,
        token=request.token,
        owner_id=request.owner_id,
        note=f"rail {answer.outcome.value.lower()} ({answer.detail}) {admitted.submission_id}",
    )
    if not moved:
        log_event(
            "rail_payout_not_submitting",
            level=logging.ERROR,
            payoutId=str(request.payout_id),
            submissionId=str(admitted.submission_id),
            wanted=to_state,
        )
    if answer.outcome == Outcome.NOT_SENT:
        fenced_sql.allow_same_token_retry(
            cursor, account_id=request.account_id, token=request.token, payout_id=request.payout_id
        )


def answer_replay(request: SubmissionRequest, replay: Replay) -> Accepted:
    """The recorded answer of this identity, with Idempotent-Replayed: true; never a rail call."""
    metrics.rail_submission.labels(outcome="replayed").inc()
    log_event(
        "rail_submission_replayed",
        submissionId=str(replay.submission_id),
        payoutId=str(request.payout_id),
        outcome=replay.outcome,
        presentedToken=request.token,
        ownerId=request.owner_id,
    )
    if replay.outcome == Outcome.PENDING:
        raise ApiError(
            Code.RAIL_AMBIGUOUS,
            "this request was already forwarded and its outcome is not recorded yet; "
            "do not resubmit",
            details={
                "submissionId": str(replay.submission_id),
                "payoutId": str(request.payout_id),
                "outcome": "PENDING",
            },
            headers={idempotency.REPLAYED_HEADER: "true"},
        )
    if replay.status == 200:
        return Accepted(replay.body, replayed=True)
    raise idempotency.recorded_error(replay.status, replay.body)
