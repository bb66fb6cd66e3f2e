"""The fenced layer: every conditional write on paydb's account/payout/ledger rows.

Raw SQL because each decision is "did this one conditional UPDATE move a row?" — the ORM
cannot express `SET fence = :t WHERE fence < :t RETURNING …` as one statement, nor a
transition plus its history row as one round trip. The row count (or RETURNING row) decides;
the caller raises. Every function takes a Django cursor on `connections[alias_for("payments")]`
and must run inside the caller's `transaction.atomic(using=alias_for("payments"))`.

Exported for other apps (docs/briefs/INTERFACES.md): `transition_payout`, `raise_account_fence`
(None for an unknown account; `payments.operator.push_fence_floor` raises NOT_FOUND).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from payments.models import QUARANTINED_OR_TERMINAL, RESERVING_STATES

if TYPE_CHECKING:
    import uuid

# ---------------------------------------------------------------------------------------------
# SQL

PAYOUT_LOCK_SQL = "SELECT state FROM payout WHERE payout_id = %(payout_id)s FOR UPDATE"

# Runs with the payout row locked (PAYOUT_LOCK_SQL), so `from_state` is the state we moved from.
TRANSITION_PAYOUT_SQL = """
WITH moved AS (
    UPDATE payout
       SET state = %(to_state)s, updated_at = clock_timestamp()
     WHERE payout_id = %(payout_id)s AND state = %(from_state)s
 RETURNING payout_id
), ev AS (
    INSERT INTO payout_event (payout_id, from_state, to_state, token, owner_id, note, at)
    SELECT moved.payout_id, %(from_state)s, %(to_state)s, %(token)s, %(owner_id)s, %(note)s,
           clock_timestamp()
      FROM moved
)
SELECT 1 FROM moved
"""

RAISE_ACCOUNT_FENCE_SQL = """
UPDATE account SET fence = GREATEST(fence, %(floor)s), updated_at = clock_timestamp()
 WHERE account_id = %(account_id)s
RETURNING fence
"""

# P2: first write of a grant; strictly newer than anything that touched the account. Only
# under the payout's own stable idempotency key (C3 §3.1), so a foreign key writes nothing.
CLAIM_FENCE_SQL = """
UPDATE account a
   SET fence = %(token)s, updated_at = clock_timestamp()
  FROM payout p
 WHERE p.payout_id = %(payout_id)s AND a.account_id = p.account_id AND a.fence < %(token)s
   AND p.idempotency_key = %(key)s
RETURNING a.account_id, a.fence, a.balance_minor
"""

# P3: the same grant continues its critical section (CHANGELOG row 5): fence <= token.
POST_FENCE_SQL = """
UPDATE account a
   SET fence = %(token)s, updated_at = clock_timestamp()
  FROM payout p
 WHERE p.payout_id = %(payout_id)s AND a.account_id = p.account_id AND a.fence <= %(token)s
   AND p.idempotency_key = %(key)s
RETURNING a.account_id, a.fence, a.balance_minor
"""

# Zero rows from a fence UPDATE: which payout/account, what fence beat us, which key it has.
FENCE_DIAGNOSIS_SQL = """
SELECT p.account_id, a.fence, p.idempotency_key
  FROM payout p JOIN account a ON a.account_id = p.account_id
 WHERE p.payout_id = %(payout_id)s
"""

# Runs after the account row is locked by the fence UPDATE, so every other claim/post on this
# account is serialised behind us and the reservation sum is current (ARCHITECTURE §4).
CLAIM_CHECK_SQL = """
SELECT p.state, p.amount_minor, p.claim_token,
       COALESCE((SELECT SUM(r.amount_minor) FROM payout r
                  WHERE r.account_id = p.account_id
                    AND r.state = ANY(%(reserving)s::varchar[])
                    AND r.payout_id <> p.payout_id), 0) AS reserved
  FROM payout p
 WHERE p.payout_id = %(payout_id)s
   FOR UPDATE OF p
"""

CLAIM_TRANSITION_SQL = """
WITH old AS (
    SELECT state FROM payout WHERE payout_id = %(payout_id)s
), moved AS (
    UPDATE payout
       SET state = 'CLAIMED', claim_token = %(token)s, claim_owner_id = %(owner_id)s,
           attempt_count = attempt_count + 1, updated_at = clock_timestamp()
     WHERE payout_id = %(payout_id)s AND state = %(expected_state)s
 RETURNING payout_id, attempt_count, idempotency_key, beneficiary_ref
), ev AS (
    INSERT INTO payout_event (payout_id, from_state, to_state, token, owner_id, note, at)
    SELECT moved.payout_id, old.state, 'CLAIMED', %(token)s, %(owner_id)s, NULL,
           clock_timestamp()
      FROM moved, old
)
SELECT attempt_count, idempotency_key, beneficiary_ref FROM moved
"""

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

POST_TRANSITION_SQL = """
WITH old AS (
    SELECT state FROM payout WHERE payout_id = %(payout_id)s
), moved AS (
    UPDATE payout
       SET state = 'POSTED', rail_reference = %(rail_reference)s,
           rail_submission_id = %(submission_id)s, updated_at = clock_timestamp()
     WHERE payout_id = %(payout_id)s AND state = ANY(%(from_states)s::varchar[])
 RETURNING payout_id, account_id, amount_minor, currency
), ev AS (
    INSERT INTO payout_event (payout_id, from_state, to_state, token, owner_id, note, at)
    SELECT moved.payout_id, old.state, 'POSTED', %(token)s, %(owner_id)s, %(note)s,
           clock_timestamp()
      FROM moved, old
)
SELECT account_id, amount_minor, currency FROM moved
"""

PAYOUT_STATE_SQL = "SELECT state, claim_token FROM payout WHERE payout_id = %(payout_id)s"

ENSURE_ACCOUNT_SQL = """
INSERT INTO account (account_id, currency, kind, balance_minor, fence, updated_at)
VALUES (%(account_id)s, %(currency)s, %(kind)s, 0, 0, clock_timestamp())
ON CONFLICT (account_id) DO NOTHING
"""

# Double entry in one statement: DEBIT the debited account, CREDIT the credited one, both
# balances moved by the same amount. The CUSTOMER CHECK (balance >= 0) is the last guard.
POST_LEDGER_SQL = """
WITH debited AS (
    UPDATE account SET balance_minor = balance_minor - %(amount)s,
                       updated_at = clock_timestamp()
     WHERE account_id = %(debit_account)s
 RETURNING account_id, balance_minor
), credited AS (
    UPDATE account SET balance_minor = balance_minor + %(amount)s,
                       updated_at = clock_timestamp()
     WHERE account_id = %(credit_account)s
 RETURNING account_id, balance_minor
), legs AS (
    INSERT INTO ledger_entry (entry_id, payout_id, account_id, direction, amount_minor, fence,
                              posted_at)
    VALUES (gen_random_uuid(), %(payout_id)s, %(debit_account)s, 'DEBIT', %(amount)s,
            %(fence)s, clock_timestamp()),
           (gen_random_uuid(), %(payout_id)s, %(credit_account)s, 'CREDIT', %(amount)s,
            %(fence)s, clock_timestamp())
 RETURNING entry_id, direction, amount_minor, fence
)
SELECT legs.entry_id, legs.direction, legs.amount_minor, legs.fence,
       (SELECT balance_minor FROM debited), (SELECT balance_minor FROM credited)
  FROM legs
 ORDER BY legs.direction DESC
"""

IDEMPOTENCY_LOOKUP_SQL = """
SELECT request_hash, status, body FROM idempotency_record
 WHERE operation = %(operation)s AND idempotency_key = %(key)s AND token = %(token)s
"""

IDEMPOTENCY_STORE_SQL = """
INSERT INTO idempotency_record (operation, idempotency_key, token, request_hash, payout_id,
                                status, body, created_at)
VALUES (%(operation)s, %(key)s, %(token)s, %(request_hash)s, %(payout_id)s, %(status)s,
        %(body)s, clock_timestamp())
"""

ACCOUNT_FOR_UPDATE_SQL = """
SELECT account_id, fence, balance_minor FROM account WHERE account_id = %(account_id)s FOR UPDATE
"""


# ---------------------------------------------------------------------------------------------
# Exported to other apps


def transition_payout(
    cursor: Any,
    *,
    payout_id: uuid.UUID,
    from_states: tuple[str, ...],
    to_state: str,
    token: int | None,
    owner_id: str,
    note: str | None = None,
) -> bool:
    """Move the payout iff its state is one of `from_states`; append its payout_event row.

    Returns False (and writes nothing) if no row moved: wrong state or unknown payout.
    """
    if token is not None and set(from_states) & QUARANTINED_OR_TERMINAL:
        raise ValueError("no token-bearing transition leaves RAIL_AMBIGUOUS or a terminal state")
    cursor.execute(PAYOUT_LOCK_SQL, {"payout_id": str(payout_id)})
    row = cursor.fetchone()
    if row is None or row[0] not in from_states:
        return False
    cursor.execute(
        TRANSITION_PAYOUT_SQL,
        {
            "payout_id": str(payout_id),
            "from_state": row[0],
            "to_state": to_state,
            "token": token,
            "owner_id": owner_id,
            "note": note,
        },
    )
    return cursor.fetchone() is not None


def raise_account_fence(cursor: Any, *, account_id: str, floor: int) -> int | None:
    """fence = GREATEST(fence, floor); returns the stored fence (operator revoke push, L8).

    None if the account does not exist (nothing to fence; no row is created): the caller
    raises (payments.operator.push_fence_floor).
    """
    cursor.execute(RAISE_ACCOUNT_FENCE_SQL, {"account_id": account_id, "floor": floor})
    row = cursor.fetchone()
    return int(row[0]) if row else None


# ---------------------------------------------------------------------------------------------
# P2 / P3 building blocks


@dataclass(frozen=True)
class FencedAccount:
    account_id: str
    fence: int
    balance_minor: int


@dataclass(frozen=True)
class FenceDiagnosis:
    """Why a fence UPDATE matched no row: the payout's account, its fence, the payout's key."""

    account_id: str
    fence: int
    idempotency_key: str


def _fence_account(
    cursor: Any, sql: str, *, payout_id: uuid.UUID, token: int, idempotency_key: str
) -> FencedAccount | None:
    cursor.execute(sql, {"payout_id": str(payout_id), "token": token, "key": idempotency_key})
    row = cursor.fetchone()
    return FencedAccount(row[0], int(row[1]), int(row[2])) if row else None


def fence_account_for_claim(
    cursor: Any, *, payout_id: uuid.UUID, token: int, idempotency_key: str
) -> FencedAccount | None:
    """Strict `fence < token` on the payout's account under the payout's own key; None if no
    row moved (unknown payout, foreign key or fenced: `fence_diagnosis` says which)."""
    return _fence_account(
        cursor, CLAIM_FENCE_SQL, payout_id=payout_id, token=token, idempotency_key=idempotency_key
    )


def fence_account_for_post(
    cursor: Any, *, payout_id: uuid.UUID, token: int, idempotency_key: str
) -> FencedAccount | None:
    """`fence <= token` (CHANGELOG row 5) under the payout's own key; None if no row moved."""
    return _fence_account(
        cursor, POST_FENCE_SQL, payout_id=payout_id, token=token, idempotency_key=idempotency_key
    )


def fence_diagnosis(cursor: Any, *, payout_id: uuid.UUID) -> FenceDiagnosis | None:
    """After a fence UPDATE matched nothing: what stopped it; None for an unknown payout."""
    cursor.execute(FENCE_DIAGNOSIS_SQL, {"payout_id": str(payout_id)})
    row = cursor.fetchone()
    return FenceDiagnosis(row[0], int(row[1]), row[2]) if row else None


def claim_check(cursor: Any, *, payout_id: uuid.UUID) -> tuple[str, int, int | None, int]:
    """(state, amount, claim token, reserved by the account's other in-flight payouts); the
    payout row locked."""
    cursor.execute(
        CLAIM_CHECK_SQL, {"payout_id": str(payout_id), "reserving": list(RESERVING_STATES)}
    )
    state, amount, claim_token, reserved = cursor.fetchone()
    return state, int(amount), claim_token, int(reserved)


def claim_transition(
    cursor: Any, *, payout_id: uuid.UUID, expected_state: str, token: int, owner_id: str
) -> tuple[int, str, str] | None:
    """expected_state → CLAIMED with token/owner, attempt+1, event row; (attempt count, stable
    idempotency key, beneficiary) or None if not moved."""
    cursor.execute(
        CLAIM_TRANSITION_SQL,
        {
            "payout_id": str(payout_id),
            "expected_state": expected_state,
            "token": token,
            "owner_id": owner_id,
        },
    )
    row = cursor.fetchone()
    return (int(row[0]), row[1], row[2]) if row else None


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


def post_transition(
    cursor: Any,
    *,
    payout_id: uuid.UUID,
    from_states: tuple[str, ...],
    token: int | None,
    owner_id: str,
    rail_reference: str | None,
    submission_id: uuid.UUID | None,
    note: str | None = None,
) -> tuple[str, int, str] | None:
    """from_states → POSTED with its event row; (account_id, amount, currency) or None."""
    cursor.execute(
        POST_TRANSITION_SQL,
        {
            "payout_id": str(payout_id),
            "from_states": list(from_states),
            "token": token,
            "owner_id": owner_id,
            "rail_reference": rail_reference,
            "submission_id": str(submission_id) if submission_id else None,
            "note": note,
        },
    )
    row = cursor.fetchone()
    return (row[0], int(row[1]), row[2]) if row else None


def payout_state(cursor: Any, *, payout_id: uuid.UUID) -> tuple[str | None, int | None]:
    """(state, claim token) of the payout now; (None, None) for an unknown payout."""
    cursor.execute(PAYOUT_STATE_SQL, {"payout_id": str(payout_id)})
    row = cursor.fetchone()
    return (row[0], row[1]) if row else (None, None)


def ensure_account(cursor: Any, *, account_id: str, currency: str, kind: str) -> None:
    cursor.execute(
        ENSURE_ACCOUNT_SQL, {"account_id": account_id, "currency": currency, "kind": kind}
    )


@dataclass(frozen=True)
class Posting:
    entries: list[dict[str, Any]]
    debit_balance: int
    credit_balance: int


def post_ledger(
    cursor: Any,
    *,
    payout_id: uuid.UUID | None,
    debit_account: str,
    credit_account: str,
    amount: int,
    fence: int,
) -> Posting:
    """Two balanced legs plus both balance moves, in one statement."""
    cursor.execute(
        POST_LEDGER_SQL,
        {
            "payout_id": str(payout_id) if payout_id else None,
            "debit_account": debit_account,
            "credit_account": credit_account,
            "amount": amount,
            "fence": fence,
        },
    )
    rows = cursor.fetchall()
    entries = [
        {"entryId": str(r[0]), "direction": r[1], "amountMinor": int(r[2]), "fence": int(r[3])}
        for r in rows
    ]
    return Posting(entries, int(rows[0][4]), int(rows[0][5]))


def lock_account(cursor: Any, *, account_id: str) -> tuple[str, int, int] | None:
    cursor.execute(ACCOUNT_FOR_UPDATE_SQL, {"account_id": account_id})
    row = cursor.fetchone()
    return (row[0], int(row[1]), int(row[2])) if row else None


def idempotency_lookup(
    cursor: Any, *, operation: str, key: str, token: int
) -> tuple[str, int, Any] | None:
    """(request_hash, status, body) recorded for the identity, or None. Callers hold the
    identity's lock (dlock.idempotency.lock_identity) so the answer cannot change under them."""
    cursor.execute(IDEMPOTENCY_LOOKUP_SQL, {"operation": operation, "key": key, "token": token})
    return cursor.fetchone()


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
