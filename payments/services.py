"""Payment-resource writes. Each accepted command is one transaction on paydb.

Services take keyword-only typed arguments, own `transaction.atomic`, raise `ApiError` and
never build HTTP responses. The conditional SQL lives in `payments/fenced_sql/`, what the
fenced commands share (replay or fence, the stored answer) in `payments/commands.py`, seeding
(accounts, payouts) in `payments/seeding.py`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connections, transaction

from dlock.dbrouter import alias_for
from dlock.errors import ApiError, Code, not_found, payout_not_claimable, validation_error
from dlock.prepared import prepared_cursor
from dlock.tracing import current_trace_id
from payments import commands
from payments.commands import CommandResult
from payments.fenced_sql import account as account_sql
from payments.fenced_sql import claim as claim_sql
from payments.fenced_sql import fences as fences_sql
from payments.fenced_sql import ledger as ledger_sql
from payments.fenced_sql import payout as payout_sql
from payments.fenced_sql import post as post_sql
from payments.models import CLAIMABLE_STATES, RESOLUTION_STATES, AccountKind, Payout

__all__ = [
    "claim_payout",
    "claim_steps",
    "post_payout",
    "post_steps",
    "resolve_quarantined",
    "settlement_account_id",
]

# Test-only fault injection: called after the last write of claim/post, inside the
# transaction, with the operation name. Tests set it to a function that raises; production
# never sets it. Whatever it raises rolls the whole command back.
FAULT_HOOK: Callable[[str], None] | None = None


def _alias() -> str:
    return alias_for("payments")


def _fault_point(operation: str) -> None:
    if FAULT_HOOK is not None:
        FAULT_HOOK(operation)


def settlement_account_id(currency: str) -> str:
    return f"settlement:{currency}"


def claim_payout(
    *,
    payout_id: uuid.UUID,
    token: int,
    owner_id: str,
    idempotency_key: str,
    expected_state: str,
) -> CommandResult:
    """P2: fence the account strictly (`fence < token`), check funds, move to CLAIMED.

    One transaction; insufficient available balance commits the payout as FAILED and the
    recorded 422 is raised after the commit.
    """
    if expected_state not in CLAIMABLE_STATES:
        raise validation_error(
            "expectedState must be PENDING or CLAIMED",
            [{"field": "expectedState", "message": "PENDING or CLAIMED"}],
        )
    with transaction.atomic(using=_alias()), prepared_cursor(_alias()) as cur:
        result, failure = claim_steps(
            cur,
            payout_id=payout_id,
            token=token,
            owner_id=owner_id,
            idempotency_key=idempotency_key,
            expected_state=expected_state,
        )
        if not result.replayed:
            _fault_point("claim")
    if failure is not None:
        raise failure  # committed: the payout is FAILED and the answer is recorded
    return result


def claim_steps(
    cur: Any,
    *,
    payout_id: uuid.UUID,
    token: int,
    owner_id: str,
    idempotency_key: str,
    expected_state: str,
) -> tuple[CommandResult, ApiError | None]:
    """The claim's statements on one cursor inside the caller's transaction (also driven
    directly by bench/payments.py): identity lock → its record, else the fenced account UPDATE
    (row lock) → payout row lock + reservation sum → transition + payout_event + the identity's
    record. Returns the answer and, for INSUFFICIENT_FUNDS, the error to raise after commit."""
    operation = "claim"
    request_hash = commands.request_hash(operation, payout_id, {"expectedState": expected_state})
    step = commands.replay_or_fence(
        cur,
        operation=operation,
        payout_id=payout_id,
        token=token,
        owner_id=owner_id,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
    )
    if isinstance(step, CommandResult):
        return step, None  # a replayed error is answered from its stored envelope
    account = step
    check = claim_sql.claim_check(cur, payout_id=payout_id)
    if check.state != expected_state:
        raise payout_not_claimable(
            payout_id=str(payout_id),
            state=check.state,
            expected_states=(expected_state,),
            claim_token=check.claim_token,
            presented_token=token,
        )
    available = account.balance_minor - check.reserved_minor
    if check.amount_minor > available:
        failure = _fail_for_funds(
            cur,
            payout_id=payout_id,
            expected_state=expected_state,
            token=token,
            owner_id=owner_id,
            account_id=account.account_id,
            amount=check.amount_minor,
            available=available,
        )
        status, body = failure.status, failure.envelope(current_trace_id())
        fences_sql.idempotency_store(
            cur,
            operation=operation,
            key=idempotency_key,
            token=token,
            request_hash=request_hash,
            payout_id=payout_id,
            status=status,
            body_json=commands.body_json(body),
        )
        return CommandResult(status=status, body=body), failure
    body = _claim_transition(
        cur,
        payout_id=payout_id,
        expected_state=expected_state,
        token=token,
        owner_id=owner_id,
        account_fence=account.fence,
        check=check,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
    )
    return CommandResult(status=200, body=body), None


def _fail_for_funds(
    cur: Any,
    *,
    payout_id: uuid.UUID,
    expected_state: str,
    token: int,
    owner_id: str,
    account_id: str,
    amount: int,
    available: int,
) -> ApiError:
    """The claim's 422 branch: the payout becomes FAILED (committed); the error is recorded."""
    claim_sql.fail_for_funds(
        cur,
        payout_id=payout_id,
        expected_state=expected_state,
        token=token,
        owner_id=owner_id,
        note=f"insufficient funds: amount {amount} > available {available}",
    )
    return ApiError(
        Code.INSUFFICIENT_FUNDS,
        "available balance does not cover the payout; payout FAILED",
        details={
            "payoutId": str(payout_id),
            "accountId": account_id,
            "amountMinor": amount,
            "availableMinor": available,
        },
    )


def _claim_transition(
    cur: Any,
    *,
    payout_id: uuid.UUID,
    expected_state: str,
    token: int,
    owner_id: str,
    account_fence: int,
    check: claim_sql.ClaimCheck,
    idempotency_key: str,
    request_hash: str,
) -> dict[str, Any]:
    """The claim's 200 branch: expected_state → CLAIMED under this token, recorded with the
    answer's body in the same statement. The payout row is locked by claim_check, so the body
    (attempt count + 1) is known before the write; the write's own count is checked."""
    body = {
        "payoutId": str(payout_id),
        "state": "CLAIMED",
        "claimToken": token,
        "accountFence": account_fence,
        "attemptCount": check.attempt_count + 1,
        "idempotencyKey": idempotency_key,  # the payout's stable key: the fence matched it
        "beneficiaryRef": check.beneficiary_ref,  # what the rail submission carries
    }
    attempts = claim_sql.claim_transition(
        cur,
        payout_id=payout_id,
        expected_state=expected_state,
        token=token,
        owner_id=owner_id,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        body_json=commands.body_json(body),
    )
    if attempts is None:  # pragma: no cover - the row is locked by claim_check
        raise commands.not_in_state(cur, payout_id, (expected_state,), token=token)
    if attempts != body["attemptCount"]:  # pragma: no cover - the row is locked by claim_check
        raise RuntimeError(f"payout {payout_id}: attempt count {attempts}, expected {body}")
    return body


def post_payout(
    *,
    payout_id: uuid.UUID,
    token: int,
    owner_id: str,
    idempotency_key: str,
    rail_reference: str,
    submission_id: uuid.UUID,
) -> CommandResult:
    """P3: fence the account (`fence <= token`, CHANGELOG row 5), RAIL_ACKED → POSTED, and post
    two balanced legs (DEBIT the account, CREDIT `settlement:<currency>`), one transaction."""
    with transaction.atomic(using=_alias()), prepared_cursor(_alias()) as cur:
        result = post_steps(
            cur,
            payout_id=payout_id,
            token=token,
            owner_id=owner_id,
            idempotency_key=idempotency_key,
            rail_reference=rail_reference,
            submission_id=submission_id,
        )
        if not result.replayed:
            _fault_point("post")
    return result


def post_steps(
    cur: Any,
    *,
    payout_id: uuid.UUID,
    token: int,
    owner_id: str,
    idempotency_key: str,
    rail_reference: str,
    submission_id: uuid.UUID,
) -> CommandResult:
    """The post's statements on one cursor inside the caller's transaction: identity lock →
    its record, else the fenced account UPDATE → one statement for RAIL_ACKED → POSTED +
    payout_event, both legs, the debit, the credit to the payout's settlement bucket
    (PAY_SETTLEMENT_BUCKETS; settlement account on demand) and the identity's record."""
    operation = "post"
    request_hash = commands.request_hash(
        operation,
        payout_id,
        {"railReference": rail_reference, "submissionId": str(submission_id)},
    )
    step = commands.replay_or_fence(
        cur,
        operation=operation,
        payout_id=payout_id,
        token=token,
        owner_id=owner_id,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
    )
    if isinstance(step, CommandResult):
        return step
    account = step
    amount = account.payout_amount_minor
    debit_entry, credit_entry = uuid.uuid4(), uuid.uuid4()
    leg = {"amountMinor": amount, "fence": token}
    body = {
        "payoutId": str(payout_id),
        "state": "POSTED",
        "entries": [
            {"entryId": str(debit_entry), "direction": "DEBIT", **leg},
            {"entryId": str(credit_entry), "direction": "CREDIT", **leg},
        ],
        # The account row is locked by the fence UPDATE: this is the balance the debit leaves.
        "balanceMinor": account.balance_minor - amount,
    }
    posted = post_sql.post(
        cur,
        payout_id=payout_id,
        token=token,
        owner_id=owner_id,
        rail_reference=rail_reference,
        submission_id=submission_id,
        debit_entry=debit_entry,
        credit_entry=credit_entry,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        body_json=commands.body_json(body),
        settlement_bucket=post_sql.settlement_bucket(
            payout_id, buckets=settings.PAY_SETTLEMENT_BUCKETS
        ),
    )
    if posted is None:
        raise commands.not_in_state(cur, payout_id, ("RAIL_ACKED",), token=token)
    if (posted.amount_minor, posted.debit_balance) != (amount, body["balanceMinor"]):
        # pragma: no cover - the account row is locked and the amount immutable
        raise RuntimeError(f"payout {payout_id}: balance {posted.debit_balance}, body {body}")
    return CommandResult(status=200, body=body)


def _post_to_settlement(
    cur: Any,
    *,
    payout_id: uuid.UUID,
    account_id: str,
    amount: int,
    currency: str,
    fence: int,
) -> ledger_sql.Posting:
    """An operator's posting: the credit moves the settlement account row itself (rare; the
    buckets are P3's, whose posts of one currency would otherwise queue on this row)."""
    settlement = settlement_account_id(currency)
    account_sql.ensure_account(
        cur, account_id=settlement, currency=currency, kind=AccountKind.SETTLEMENT
    )
    return ledger_sql.post_ledger(
        cur,
        payout_id=payout_id,
        debit_account=account_id,
        credit_account=settlement,
        amount=amount,
        fence=fence,
    )


RESOLUTIONS = RESOLUTION_STATES


def resolve_quarantined(
    *,
    payout_id: uuid.UUID,
    resolution: str,
    operator: str,
    note: str,
    rail_reference: str | None = None,
) -> None:
    """Operator resolution of a RAIL_AMBIGUOUS payout (after reading the rail's statement).

    POSTED writes the same two ledger legs as P3, at the account's current fence (an operator
    holds no token and never moves the fence); FAILED releases the reservation. Either way the
    payout_event row names the operator and carries the note. Only RAIL_AMBIGUOUS moves.
    """
    note = (note or "").strip()
    if not note:
        raise validation_error("a note is required", [{"field": "note", "message": "required"}])
    if resolution not in RESOLUTIONS:
        raise validation_error(
            "resolution must be POSTED or FAILED",
            [{"field": "resolution", "message": "POSTED or FAILED"}],
        )
    owner = f"operator:{operator}"[:64]
    with transaction.atomic(using=_alias()), connections[_alias()].cursor() as cur:
        payout = Payout.objects.using(_alias()).filter(payout_id=payout_id).first()
        if payout is None:
            raise not_found("payout", str(payout_id))
        # Same lock order as claim/post: the account row first, then the payout row.
        locked = account_sql.lock_account(cur, account_id=payout.account_id)
        if resolution == "FAILED":
            moved = payout_sql.transition_payout(
                cur,
                payout_id=payout_id,
                from_states=("RAIL_AMBIGUOUS",),
                to_state="FAILED",
                token=None,
                owner_id=owner,
                note=note,
            )
            if not moved:
                raise commands.not_in_state(cur, payout_id, ("RAIL_AMBIGUOUS",))
            return
        posted = post_sql.post_transition(
            cur,
            payout_id=payout_id,
            from_states=("RAIL_AMBIGUOUS",),
            token=None,
            owner_id=owner,
            rail_reference=rail_reference,
            submission_id=None,
            note=note,
        )
        if posted is None:
            raise commands.not_in_state(cur, payout_id, ("RAIL_AMBIGUOUS",))
        assert locked is not None  # the account row was locked above, under this transaction
        account_id, amount, currency = posted
        _post_to_settlement(
            cur,
            payout_id=payout_id,
            account_id=account_id,
            amount=amount,
            currency=currency,
            fence=locked[1],
        )
