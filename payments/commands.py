"""What every fenced payment command (P2 claim, P3 post) shares: its answer, the identity's
replay or the fence in one round trip, the stored answer, and the refusal naming the state the
payout is in now. The commands themselves are in payments/services.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlock import idempotency
from dlock.errors import ApiError, not_found, payout_not_claimable
from dlock.fence.refusals import fenced_out
from payments.fenced_sql import fences as fences_sql
from payments.fenced_sql import payout as payout_sql

if TYPE_CHECKING:
    import uuid


@dataclass(frozen=True)
class CommandResult:
    """What a fenced command answered: fresh, or replayed from its idempotency record."""

    status: int
    body: dict[str, Any]
    replayed: bool = False


def request_hash(operation: str, payout_id: uuid.UUID, body: dict[str, Any]) -> str:
    return idempotency.request_hash(
        {"operation": operation, "payoutId": str(payout_id), "body": body}
    )


def replay_or_fence(
    cur: Any,
    *,
    operation: str,
    payout_id: uuid.UUID,
    token: int,
    owner_id: str,
    idempotency_key: str,
    request_hash: str,
) -> CommandResult | fences_sql.FencedAccount:
    """Serialise on the identity; then its stored answer (a replay) or the fence UPDATE of P2
    (strict) or P3 (`<=`) in one round trip. A refused fence is 404, 400 or FENCED_OUT."""
    idempotency.lock_identity(cur, operation=operation, key=idempotency_key, token=token)
    step = fences_sql.record_or_fence(
        cur,
        operation=operation,
        payout_id=payout_id,
        token=token,
        idempotency_key=idempotency_key,
    )
    if step.recorded is not None:
        stored_hash, status, body = step.recorded
        idempotency.check_same_request(
            stored_hash=stored_hash,
            presented_hash=request_hash,
            key=idempotency_key,
            operation=operation,
        )
        return CommandResult(status=status, body=idempotency.stored_body(body), replayed=True)
    if step.account is not None:
        return step.account
    found = fences_sql.fence_diagnosis(cur, payout_id=payout_id)
    if found is None:
        raise not_found("payout", str(payout_id))
    idempotency.check_payout_key(presented=idempotency_key, stable=found.idempotency_key)
    raise fenced_out(
        resource="account",
        resource_id=found.account_id,
        presented=token,
        highest=found.fence,
        owner_id=owner_id,
    )


def not_in_state(
    cur: Any, payout_id: uuid.UUID, allowed: tuple[str, ...], *, token: int | None = None
) -> ApiError:
    """A transition matched no row: answer with the state the payout is in now."""
    state, claim_token = payout_sql.payout_state(cur, payout_id=payout_id)
    return payout_not_claimable(
        payout_id=str(payout_id),
        state=state,
        expected_states=allowed,
        claim_token=claim_token,
        presented_token=token,
    )


def body_json(body: dict[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"))
