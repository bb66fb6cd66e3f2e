"""Rail submission: admission (C3 §3.5 steps 1–3, one transaction), one forward, the outcome.

Steps of `submit()`:
0. identity lock + idempotent replay lookup (same key, same token, same body → recorded answer);
   the request must name the payout exactly as paydb stores it (404 / VALIDATION_FAILED).
1. strict high-water advance for the account → else FENCED row, 409 FENCED_OUT, no rail call;
2. no live submission for the payout → else 409 DUPLICATE_SUBMISSION;
3. payout CLAIMED under this very token → SUBMITTING, intent row PENDING; COMMIT;
4. forward once to the rail (never retried), then record the outcome and move the payout in one
   transaction: ACKED → RAIL_ACKED, TIMEOUT → RAIL_AMBIGUOUS, DECLINED → FAILED,
   NOT_SENT → CLAIMED (and the same token may come back for this payout).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connections, transaction

from dlock import metrics
from dlock.budgets import Budget
from dlock.dbrouter import alias_for
from dlock.errors import ApiError, Code, not_found, validation_error
from dlock.http import TransportError, exchange, new_session
from dlock.logs import log_event
from dlock.timefmt import rfc3339_ms
from dlock.tracing import current_trace_id
from payments.fenced_sql import transition_payout
from railproxy import fenced_sql
from railproxy.models import Outcome

REPLAYED_HEADER = "Idempotent-Replayed"
SWEEP_OWNER = "rail-proxy:sweep"

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
        canonical = json.dumps(
            {
                "payoutId": str(self.payout_id),
                "accountId": self.account_id,
                "amountMinor": self.amount_minor,
                "currency": self.currency,
                "beneficiaryRef": self.beneficiary_ref,
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Accepted:
    """A 200 answer; `replayed` tells the view to set Idempotent-Replayed."""

    body: dict[str, Any]
    replayed: bool = False


@dataclass(frozen=True)
class _Admitted:
    submission_id: uuid.UUID
    submitted_at: Any


@dataclass(frozen=True)
class _Replay:
    status: int
    body: dict[str, Any] | None
    outcome: str
    submission_id: Any


@dataclass(frozen=True)
class _FencedRecorded:
    error: ApiError


class _Fenced(Exception):
    """Raised inside the steps-1–3 savepoint so the high-water advance rolls back with it."""

    def __init__(self, *, highest: int, resource_id: str, detail: str) -> None:
        self.highest = highest
        self.resource_id = resource_id
        self.detail = detail
        super().__init__(detail)


@dataclass(frozen=True)
class RailAnswer:
    outcome: Outcome
    detail: str
    rail_reference: str | None = None


def _alias() -> str:
    return alias_for("railproxy")


# --------------------------------------------------------------------------------- submit


def submit(*, request: SubmissionRequest) -> Accepted:
    """The whole C3 §3.5 flow; returns the 200 body or raises the typed ApiError."""
    admission = _admit(request)
    if isinstance(admission, _Replay):
        return _replay(request, admission)
    if isinstance(admission, _FencedRecorded):
        raise admission.error
    log_event(
        "rail_intent_committed",
        submissionId=str(admission.submission_id),
        payoutId=str(request.payout_id),
        presentedToken=request.token,
        ownerId=request.owner_id,
    )
    # The forward may take the whole read timeout: give the database connection back first.
    connections[_alias()].close()
    answer = forward(request=request, submission_id=admission.submission_id)
    return _record(request, admission, answer)


def _admit(request: SubmissionRequest) -> _Admitted | _Replay | _FencedRecorded:
    alias = _alias()
    payout_id = request.payout_id
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        fenced_sql.lock_identity(cursor, key=request.idempotency_key, token=request.token)
        previous = fenced_sql.replay_lookup(
            cursor, key=request.idempotency_key, token=request.token
        )
        if previous is not None:
            submission_id, outcome, request_hash, status, body = previous
            if request_hash != request.body_hash():
                raise ApiError(
                    Code.IDEMPOTENCY_CONFLICT,
                    "X-Idempotency-Key was used with this token for a different request body",
                    details={"idempotencyKey": request.idempotency_key},
                )
            return _Replay(status, body, outcome, submission_id)

        stored = fenced_sql.payout(cursor, payout_id=payout_id)
        if stored is None:
            raise not_found("payout", str(payout_id))
        _check_request_names_the_payout(request, stored)

        try:
            with transaction.atomic(using=alias):  # steps 1–3 stand or fall together
                return _steps_one_to_three(cursor, request)
        except _Fenced as fenced:
            return _record_fenced(cursor, request, fenced)
        except IntegrityError:
            # Two submissions for one payout raced past step 2: the partial unique index wins.
            raise _duplicate(request, existing=None) from None


def _check_request_names_the_payout(request: SubmissionRequest, stored) -> None:
    """The body and key must describe the payout as paydb stores it (immutable fields)."""
    mismatches = [
        (field, message)
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
            (
                "X-Idempotency-Key",
                request.idempotency_key,
                stored.idempotency_key,
                "must be the payout's stable idempotencyKey",
            ),
        )
        if given != expected
    ]
    if mismatches:
        raise validation_error(
            "the request does not match the payout it names",
            [{"field": field, "message": message} for field, message in mismatches],
        )


def _steps_one_to_three(cursor, request: SubmissionRequest) -> _Admitted:
    # Step 1: the strict conditional write; its row lock serialises every admission per account.
    advanced = fenced_sql.advance_high_water(
        cursor, account_id=request.account_id, token=request.token, payout_id=request.payout_id
    )
    if advanced is None:
        raise _Fenced(
            highest=fenced_sql.high_water(cursor, account_id=request.account_id),
            resource_id=request.account_id,
            detail="fenced_high_water",
        )
    # Step 2: one submission per payout, whatever the token (FR-18).
    existing = fenced_sql.live_submission(cursor, payout_id=request.payout_id)
    if existing is not None:
        raise _duplicate(request, existing=existing)
    # Step 3: the payout must be CLAIMED under this very token; then the intent commits.
    payout = fenced_sql.payout(cursor, payout_id=request.payout_id, for_update=True)
    if payout.claim_token is not None and payout.claim_token > request.token:
        # A newer holder re-claimed the payout: the presenter lost its lock.
        raise _Fenced(
            highest=payout.claim_token, resource_id=str(request.payout_id), detail="fenced_claim"
        )
    if payout.state != "CLAIMED" or payout.claim_token != request.token:
        raise _not_claimable(request, payout)
    submission_id = uuid.uuid4()
    moved = transition_payout(
        cursor,
        payout_id=request.payout_id,
        from_states=("CLAIMED",),
        to_state="SUBMITTING",
        token=request.token,
        owner_id=request.owner_id,
        note=f"rail submission {submission_id}",
    )
    if not moved:  # pragma: no cover - the row is locked FOR UPDATE above
        raise _not_claimable(request, payout)
    submitted_at = _insert_submission(
        cursor, request, submission_id=submission_id, outcome=Outcome.PENDING
    )
    return _Admitted(submission_id, submitted_at)


def _insert_submission(
    cursor,
    request: SubmissionRequest,
    *,
    submission_id: uuid.UUID,
    outcome: Outcome,
    highest_token: int | None = None,
    detail: str | None = None,
    response_status: int | None = None,
    response_body: dict | None = None,
):
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


def _record_fenced(cursor, request: SubmissionRequest, fenced: _Fenced) -> _FencedRecorded:
    details = {
        "presentedToken": request.token,
        "highestToken": fenced.highest,
        "resourceType": "rail",
        "resourceId": fenced.resource_id,
        "ownerId": request.owner_id,
    }
    message = "a newer fencing token already reached the rail for this account"
    if fenced.detail == "fenced_claim":
        message = "the payout was claimed under a newer fencing token"
    error = ApiError(Code.FENCED_OUT, message, details=details)
    _insert_submission(
        cursor,
        request,
        submission_id=uuid.uuid4(),
        outcome=Outcome.FENCED,
        highest_token=fenced.highest,
        detail=fenced.detail,
        response_status=error.status,
        response_body=_stored_error(error),
    )
    metrics.lock_fenced_out.labels(resource="rail").inc()
    metrics.rail_submission.labels(outcome="fenced").inc()
    log_event(
        "fenced_out",
        level=logging.ERROR,
        resource="rail",
        resourceId=fenced.resource_id,
        presentedToken=request.token,
        highestToken=fenced.highest,
        ownerId=request.owner_id,
        payoutId=str(request.payout_id),
        reason=fenced.detail,
    )
    return _FencedRecorded(error)


def _duplicate(request: SubmissionRequest, *, existing) -> ApiError:
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


def _not_claimable(request: SubmissionRequest, payout) -> ApiError:
    details = {
        "payoutId": str(request.payout_id),
        "state": payout.state,
        "claimToken": payout.claim_token,
        "presentedToken": request.token,
    }
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
    return ApiError(Code.PAYOUT_NOT_CLAIMABLE, message, details=details)


# --------------------------------------------------------------------------------- replay


def _stored_error(error: ApiError) -> dict[str, Any]:
    """The envelope as answered, traceId included, so a replay can answer it byte for byte."""
    return error.envelope(current_trace_id())


def _error_from_stored(status: int, body: dict[str, Any], *, replayed: bool) -> ApiError:
    error = ApiError(
        Code(body["code"]),
        body.get("message"),
        details=body.get("details"),
        retry_after_ms=body.get("retryAfterMillis"),
        headers={REPLAYED_HEADER: "true"} if replayed else None,
    )
    error.status = status
    if replayed:  # the original answer, for log correlation with the attempt that made it
        error.trace_id = body.get("traceId")
    return error


def _replay(request: SubmissionRequest, replay: _Replay) -> Accepted:
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
            headers={REPLAYED_HEADER: "true"},
        )
    if replay.status == 200:
        return Accepted(replay.body, replayed=True)
    raise _error_from_stored(replay.status, replay.body, replayed=True)


# --------------------------------------------------------------------------------- forward


def forward(*, request: SubmissionRequest, submission_id) -> RailAnswer:
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
    import requests

    if isinstance(exc.cause, requests.ReadTimeout):
        return "read_timeout"
    return "connection_lost"


# --------------------------------------------------------------------------------- record


def _record(request: SubmissionRequest, admitted: _Admitted, answer: RailAnswer) -> Accepted:
    alias = _alias()
    status, body, error = _answer_for(request, admitted, answer)
    try:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            resolved = fenced_sql.resolve_submission(
                cursor,
                submission_id=admitted.submission_id,
                outcome=answer.outcome,
                detail=answer.detail,
                rail_reference=answer.rail_reference,
                response_status=status,
                response_body=body if error is None else _stored_error(error),
            )
            if resolved is None:
                # The sweep already declared this intent ambiguous (we were paused that long).
                stored = fenced_sql.submission(cursor, submission_id=admitted.submission_id)
            else:
                if error is None:
                    body["submittedAt"] = rfc3339_ms(resolved[0])
                    body["resolvedAt"] = rfc3339_ms(resolved[1])
                    fenced_sql.store_response_body(
                        cursor, submission_id=admitted.submission_id, response_body=body
                    )
                _move_payout(cursor, request, admitted, answer)
    except DatabaseError as exc:
        log_event(
            "rail_outcome_not_recorded",
            level=logging.ERROR,
            submissionId=str(admitted.submission_id),
            payoutId=str(request.payout_id),
            railOutcome=answer.outcome.value,
            railReference=answer.rail_reference,
            error=type(exc).__name__,
        )
        raise ApiError(
            Code.RAIL_AMBIGUOUS,
            "the attempt's outcome could not be recorded; the sweep will quarantine it",
            details={"submissionId": str(admitted.submission_id), "outcome": "PENDING"},
        ) from exc

    if resolved is None:
        log_event(
            "rail_outcome_after_sweep",
            level=logging.ERROR,
            submissionId=str(admitted.submission_id),
            payoutId=str(request.payout_id),
            railOutcome=answer.outcome.value,
            railReference=answer.rail_reference,
            recordedOutcome=stored[0] if stored else None,
        )
        if stored is not None and stored[2] is not None and stored[3] is not None:
            raise _error_from_stored(stored[2], stored[3], replayed=False)
        raise ApiError(Code.RAIL_AMBIGUOUS, "the attempt was declared ambiguous by the sweep")

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


def _answer_for(request: SubmissionRequest, admitted: _Admitted, answer: RailAnswer):
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
        )
        error.status = 422  # C3 §3.5 "422 REJECTED→VALIDATION_FAILED" (CHANGELOG)
    else:
        error = ApiError(
            Code.RAIL_UNAVAILABLE,
            "the rail could not be reached; nothing was presented and the payout is CLAIMED "
            "again, so the same request may be retried",
            details={**base, "outcome": "NOT_SENT"},
        )
    return error.status, None, error


def _move_payout(cursor, request: SubmissionRequest, admitted: _Admitted, answer: RailAnswer):
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


# --------------------------------------------------------------------------------- sweep


def sweep_unresolved_intents(*, older_than_s: float | None = None) -> int:
    """Every intent PENDING for longer than the rail read timeout (+ margin) → TIMEOUT and its
    payout → RAIL_AMBIGUOUS. Never re-forwarded, by anyone, under any token. Returns the count.
    """
    if older_than_s is None:
        older_than_s = (
            settings.RAIL_CONNECT_TIMEOUT_MS
            + settings.RAIL_READ_TIMEOUT_MS
            + settings.RAIL_SWEEP_MARGIN_MS
        ) / 1000
    alias = _alias()
    swept = 0
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        for submission_id, payout_id, account_id, token, owner_id in fenced_sql.stale_intents(
            cursor, older_than_s=older_than_s
        ):
            error = ApiError(
                Code.RAIL_AMBIGUOUS,
                "the attempt was forwarded (or about to be) and its outcome was never recorded; "
                "the payout is quarantined (RAIL_AMBIGUOUS), never resubmit",
                details={
                    "submissionId": str(submission_id),
                    "payoutId": str(payout_id),
                    "outcome": "TIMEOUT",
                    "reason": "sweep",
                },
            )
            if (
                fenced_sql.resolve_submission(
                    cursor,
                    submission_id=submission_id,
                    outcome=Outcome.TIMEOUT,
                    detail="sweep",
                    rail_reference=None,
                    response_status=error.status,
                    response_body=_stored_error(error),
                )
                is None
            ):
                continue
            transition_payout(
                cursor,
                payout_id=payout_id,
                from_states=("SUBMITTING",),
                to_state="RAIL_AMBIGUOUS",
                token=None,
                owner_id=SWEEP_OWNER,
                note=f"intent {submission_id} unresolved for over {older_than_s:.1f}s",
            )
            swept += 1
            metrics.rail_submission.labels(outcome="timeout").inc()
            log_event(
                "rail_ambiguous",
                level=logging.WARNING,
                submissionId=str(submission_id),
                payoutId=str(payout_id),
                accountId=account_id,
                presentedToken=token,
                ownerId=owner_id,
                outcome="TIMEOUT",
                reason="sweep",
            )
    return swept
