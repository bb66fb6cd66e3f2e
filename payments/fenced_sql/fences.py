"""P2 / P3's shared first step: the identity's recorded answer or the fence UPDATE, the
diagnosis when the fence refuses, and the idempotency records a fenced write stores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlock.fence.sql import fence_predicate

if TYPE_CHECKING:
    import uuid


# P2 / P3, step 1 (the identity's advisory lock is held, so a twin's record is committed or
# absent, never in flight): the identity's recorded answer, else the fence UPDATE — P2 strict
# (`fence < token`), P3 `fence <= token` (CHANGELOG row 5) — under the payout's own stable key
# (C3 §3.1), so a foreign key writes nothing. A replay writes nothing either.
_RECORD_OR_FENCE_SQL = """
WITH rec AS (
    SELECT request_hash, status, body FROM idempotency_record
     WHERE operation = %(operation)s AND idempotency_key = %(key)s AND token = %(token)s
), fenced AS (
    UPDATE account a
       SET fence = %(token)s, updated_at = clock_timestamp()
      FROM payout p
     WHERE p.payout_id = %(payout_id)s AND a.account_id = p.account_id
       AND {fence}
       AND p.idempotency_key = %(key)s AND NOT EXISTS (SELECT 1 FROM rec)
 RETURNING a.account_id, a.fence, a.balance_minor, p.amount_minor
)
SELECT rec.request_hash, rec.status, rec.body,
       fenced.account_id, fenced.fence, fenced.balance_minor, fenced.amount_minor
  FROM (SELECT 1) AS one LEFT JOIN rec ON true LEFT JOIN fenced ON true
"""


# The fence itself is the kit's predicate (dlock.fence.sql), folded into the one statement that
# also reads the identity's record, so a claim or post costs one round trip.
CLAIM_RECORD_OR_FENCE_SQL = _RECORD_OR_FENCE_SQL.format(fence=fence_predicate("a.fence"))


POST_RECORD_OR_FENCE_SQL = _RECORD_OR_FENCE_SQL.format(
    fence=fence_predicate("a.fence", same_grant=True)
)


# Zero rows from a fence UPDATE: which payout/account, what fence beat us, which key it has.
FENCE_DIAGNOSIS_SQL = """
SELECT p.account_id, a.fence, p.idempotency_key
  FROM payout p JOIN account a ON a.account_id = p.account_id
 WHERE p.payout_id = %(payout_id)s
"""


# The stored answer of a fenced write, in the statement that makes the write (`moved` is the
# payout row it moved): a replay then finds it, and a failed write stores nothing.
RECORD_MOVED_CTE = """
    INSERT INTO idempotency_record (operation, idempotency_key, token, request_hash, payout_id,
                                    status, body, created_at)
    SELECT {operation}, %(key)s, %(token)s, %(request_hash)s, moved.payout_id, 200, %(body)s,
           clock_timestamp()
      FROM moved
"""


IDEMPOTENCY_STORE_SQL = """
INSERT INTO idempotency_record (operation, idempotency_key, token, request_hash, payout_id,
                                status, body, created_at)
VALUES (%(operation)s, %(key)s, %(token)s, %(request_hash)s, %(payout_id)s, %(status)s,
        %(body)s, clock_timestamp())
"""


@dataclass(frozen=True)
class FencedAccount:
    account_id: str
    fence: int
    balance_minor: int
    payout_amount_minor: int  # of the payout the fence was taken for (immutable)


@dataclass(frozen=True)
class FenceDiagnosis:
    """Why a fence UPDATE matched no row: the payout's account, its fence, the payout's key."""

    account_id: str
    fence: int
    idempotency_key: str


@dataclass(frozen=True)
class RecordOrFence:
    """Step 1 of P2/P3: the identity's recorded answer (a replay), else the fenced account
    (None: no row moved — unknown payout, foreign key or fenced: `fence_diagnosis` says which)."""

    recorded: tuple[str, int, Any] | None
    account: FencedAccount | None


def record_or_fence(
    cursor: Any, *, operation: str, payout_id: uuid.UUID, token: int, idempotency_key: str
) -> RecordOrFence:
    """The identity's record, else the fence UPDATE of `operation` (claim: `fence < token`,
    post: `fence <= token`), in one round trip. Callers hold the identity's lock
    (dlock.idempotency.lock_identity), taken in an earlier statement so this one's snapshot
    sees a twin's committed record."""
    sql = CLAIM_RECORD_OR_FENCE_SQL if operation == "claim" else POST_RECORD_OR_FENCE_SQL
    cursor.execute(
        sql,
        {
            "operation": operation,
            "payout_id": str(payout_id),
            "token": token,
            "key": idempotency_key,
        },
    )
    request_hash, status, body, account_id, fence, balance, amount = cursor.fetchone()
    if request_hash is not None:
        return RecordOrFence((request_hash, int(status), body), None)
    if account_id is None:
        return RecordOrFence(None, None)
    return RecordOrFence(None, FencedAccount(account_id, int(fence), int(balance), int(amount)))


def fence_diagnosis(cursor: Any, *, payout_id: uuid.UUID) -> FenceDiagnosis | None:
    """After a fence UPDATE matched nothing: what stopped it; None for an unknown payout."""
    cursor.execute(FENCE_DIAGNOSIS_SQL, {"payout_id": str(payout_id)})
    row = cursor.fetchone()
    return FenceDiagnosis(row[0], int(row[1]), row[2]) if row else None


def idempotency_store(
    cursor: Any,
    *,
    operation: str,
    key: str,
    token: int,
    request_hash: str,
    payout_id: uuid.UUID,
    status: int,
    body_json: str,
) -> None:
    cursor.execute(
        IDEMPOTENCY_STORE_SQL,
        {
            "operation": operation,
            "key": key,
            "token": token,
            "request_hash": request_hash,
            "payout_id": str(payout_id),
            "status": status,
            "body": body_json,
        },
    )
