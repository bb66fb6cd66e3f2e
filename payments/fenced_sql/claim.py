"""P2 claim after its fence: the reservation check, PENDING/CLAIMED → CLAIMED, and the
failure for insufficient funds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from payments.fenced_sql.fences import RECORD_MOVED_CTE
from payments.models import RESERVING_STATES

if TYPE_CHECKING:
    import uuid


# Runs after the account row is locked by the fence UPDATE, so every other claim/post on this
# account is serialised behind us and the reservation sum is current (ARCHITECTURE §4).
CLAIM_CHECK_SQL = """
SELECT p.state, p.amount_minor, p.claim_token, p.attempt_count, p.beneficiary_ref,
       COALESCE((SELECT SUM(r.amount_minor) FROM payout r
                  WHERE r.account_id = p.account_id
                    AND r.state = ANY(%(reserving)s::varchar[])
                    AND r.payout_id <> p.payout_id), 0) AS reserved
  FROM payout p
 WHERE p.payout_id = %(payout_id)s
   FOR UPDATE OF p
"""


# Runs with the payout row locked by CLAIM_CHECK_SQL in state `expected_state`: the move, its
# history row and the identity's recorded 200 in one statement (nothing is written unless the
# payout moved).
CLAIM_TRANSITION_SQL = """
WITH moved AS (
    UPDATE payout
       SET state = 'CLAIMED', claim_token = %(token)s, claim_owner_id = %(owner_id)s,
           attempt_count = attempt_count + 1, updated_at = clock_timestamp()
     WHERE payout_id = %(payout_id)s AND state = %(expected_state)s
 RETURNING payout_id, attempt_count
), ev AS (
    INSERT INTO payout_event (payout_id, from_state, to_state, token, owner_id, note, at)
    SELECT moved.payout_id, %(expected_state)s, 'CLAIMED', %(token)s, %(owner_id)s, NULL,
           clock_timestamp()
      FROM moved
), rec AS ({record})
SELECT attempt_count FROM moved
""".format(record=RECORD_MOVED_CTE.format(operation="'claim'"))


FAIL_FOR_FUNDS_SQL = """
WITH old AS (
    SELECT state FROM payout WHERE payout_id = %(payout_id)s
), moved AS (
    UPDATE payout
       SET state = 'FAILED', claim_token = %(token)s, claim_owner_id = %(owner_id)s,
           attempt_count = attempt_count + 1, updated_at = clock_timestamp()
     WHERE payout_id = %(payout_id)s AND state = %(expected_state)s
 RETURNING payout_id, attempt_count
), ev AS (
    INSERT INTO payout_event (payout_id, from_state, to_state, token, owner_id, note, at)
    SELECT moved.payout_id, old.state, 'FAILED', %(token)s, %(owner_id)s, %(note)s,
           clock_timestamp()
      FROM moved, old
)
SELECT attempt_count FROM moved
"""


@dataclass(frozen=True)
class ClaimCheck:
    state: str
    amount_minor: int
    claim_token: int | None
    attempt_count: int
    beneficiary_ref: str
    reserved_minor: int  # by the account's other in-flight payouts


def claim_check(cursor: Any, *, payout_id: uuid.UUID) -> ClaimCheck:
    """The payout (row locked) and what the account's other in-flight payouts reserve."""
    cursor.execute(
        CLAIM_CHECK_SQL, {"payout_id": str(payout_id), "reserving": list(RESERVING_STATES)}
    )
    state, amount, claim_token, attempts, beneficiary, reserved = cursor.fetchone()
    return ClaimCheck(state, int(amount), claim_token, int(attempts), beneficiary, int(reserved))


def claim_transition(
    cursor: Any,
    *,
    payout_id: uuid.UUID,
    expected_state: str,
    token: int,
    owner_id: str,
    idempotency_key: str,
    request_hash: str,
    body_json: str,
) -> int | None:
    """expected_state → CLAIMED with token/owner, attempt+1, its event row and the identity's
    recorded 200 (`body_json`); the new attempt count, or None if not moved (nothing written)."""
    cursor.execute(
        CLAIM_TRANSITION_SQL,
        {
            "payout_id": str(payout_id),
            "expected_state": expected_state,
            "token": token,
            "owner_id": owner_id,
            "key": idempotency_key,
            "request_hash": request_hash,
            "body": body_json,
        },
    )
    row = cursor.fetchone()
    return int(row[0]) if row else None


def fail_for_funds(
    cursor: Any, *, payout_id: uuid.UUID, expected_state: str, token: int, owner_id: str, note: str
) -> int | None:
    cursor.execute(
        FAIL_FOR_FUNDS_SQL,
        {
            "payout_id": str(payout_id),
            "expected_state": expected_state,
            "token": token,
            "owner_id": owner_id,
            "note": note,
        },
    )
    row = cursor.fetchone()
    return int(row[0]) if row else None
