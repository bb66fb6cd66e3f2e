"""Recording: the outcome of the one rail call, and answers given from a record.

`record()` writes the outcome and moves the payout in one transaction: ACKED → RAIL_ACKED,
TIMEOUT → RAIL_AMBIGUOUS, DECLINED → FAILED, NOT_SENT → CLAIMED (the same token may come back
for this payout). The sweep may have resolved the intent first; then its answer stands.
When paydb cannot be reached (a restart, a failover) the recording, never the rail call, is
tried again for up to RAIL_RECORD_RETRY_MS, so an answer the rail gave is not lost to the sweep.
`answer_replay()` answers an identity that already has a row, without any rail call.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

from dlock import idempotency, metrics
from dlock.errors import ApiError, Code
from dlock.fence.gate import Intent
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


# Pauses between recording attempts while paydb is unreachable: jittered, 50 ms doubling to 1 s.
RECORD_RETRY_FIRST_S = 0.05
RECORD_RETRY_MAX_S = 1.0


def record(request: SubmissionRequest, admitted: Admitted, answer: RailAnswer) -> Accepted:
    """Store the outcome, move the payout, count and log it; return the 200 or raise."""
    status, body, error = _answer_for(request, admitted, answer)
    resolved, stored, retried = _write_with_retry(request, admitted, answer, status, body, error)
    if resolved is None:
        ours = _ours(stored, answer) if retried else None
        if ours is None:
            raise _swept_first(request, admitted, answer, stored)
        status, body, error = ours

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


def _write_with_retry(
    request: SubmissionRequest,
    admitted: Admitted,
    answer: RailAnswer,
    status: int,
    body: dict[str, Any] | None,
    error: ApiError | None,
) -> tuple[tuple | None, tuple | None, bool]:
    """`_write`, tried again while paydb cannot be reached, until RAIL_RECORD_RETRY_MS is spent;
    its answer and whether an attempt failed first.

    Only the connection failed, so the same transaction is safe to repeat: the intent moves
    out of PENDING once. If an attempt's COMMIT landed before its connection broke, the next
    attempt finds the row resolved (None) and `record` recognises the outcome as its own.
    """
    using = alias()
    deadline = time.monotonic() + settings.RAIL_RECORD_RETRY_MS / 1000
    pause = RECORD_RETRY_FIRST_S
    attempt = 0
    while True:
        try:
            return (*_write(request, admitted, answer, status, body, error), attempt > 0)
        except (OperationalError, InterfaceError) as exc:
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise _not_recorded(request, admitted, answer, exc) from exc
            log_event(
                "rail_outcome_record_retry",
                level=logging.WARNING,
                submissionId=str(admitted.submission_id),
                payoutId=str(request.payout_id),
                railOutcome=answer.outcome.value,
                attempt=attempt,
                error=type(exc).__name__,
            )
            connections[using].close()  # a broken connection goes back to be discarded
            time.sleep(min(left, pause * (0.5 + random.random())))
            pause = min(pause * 2, RECORD_RETRY_MAX_S)
        except DatabaseError as exc:
            raise _not_recorded(request, admitted, answer, exc) from exc


def _write(
    request: SubmissionRequest,
    admitted: Admitted,
    answer: RailAnswer,
    status: int,
    body: dict[str, Any] | None,
    error: ApiError | None,
) -> tuple[tuple | None, tuple | None]:
    """One transaction through the rail's side-effect gate (its record, on `resolve`):
    (the resolved row's times, None), or (None, the row as someone else resolved it: the sweep,
    or an earlier attempt of ours whose COMMIT landed)."""
    intent = Intent(
        admitted.submission_id, str(request.payout_id), request.account_id, request.token
    )

    def resolve(cursor: Any) -> tuple | None:  # the row's own resolve, and the payout's move
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
        to_state = PAYOUT_STATE_AFTER[answer.outcome]
        if resolved is not None and not transition_payout(
            cursor,
            payout_id=request.payout_id,
            from_states=("SUBMITTING",),
            to_state=to_state,
            token=request.token,
            owner_id=request.owner_id,
            note=f"rail {answer.outcome.value.lower()} ({answer.detail}) {admitted.submission_id}",
        ):
            log_event(
                "rail_payout_not_submitting",
                level=logging.ERROR,
                payoutId=str(request.payout_id),
                submissionId=str(admitted.submission_id),
                wanted=to_state,
            )
        return resolved

    with transaction.atomic(using=alias()), prepared_cursor(alias()) as cursor:
        resolved = fenced_sql.RAIL_GATE.record(  # NOT_SENT re-opens the mark for this payout
            cursor, intent, outcome=fenced_sql.GATE_OUTCOME[answer.outcome], resolve=resolve
        )
        if resolved is None:
            # Resolved already: the sweep declared it ambiguous (we were paused that long).
            return None, fenced_sql.submission(cursor, submission_id=admitted.submission_id)
    if error is None and body is not None:
        body["submittedAt"] = rfc3339_ms(resolved[0])
        body["resolvedAt"] = rfc3339_ms(resolved[1])
    return resolved, None


def _ours(
    stored: tuple | None, answer: RailAnswer
) -> tuple[int, dict[str, Any] | None, ApiError | None] | None:
    """(status, body, error) of a row that already holds this very answer (our own earlier
    attempt committed before its connection broke), or None when someone else resolved it."""
    if stored is None or stored[0] != answer.outcome or stored[1] != answer.rail_reference:
        return None
    status, body = stored[2], stored[3]
    if status is None or body is None:
        return None
    if status == 200:
        return 200, body, None
    return status, None, idempotency.recorded_error(status, body, replayed=False)


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
