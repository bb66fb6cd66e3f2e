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

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from payments.models import QUARANTINED_OR_TERMINAL, RESERVING_STATES

if TYPE_CHECKING:
    import uuid

# ---------------------------------------------------------------------------------------------
# SQL

PAYOUT_LOCK_SQL = "SELECT state FROM payout WHERE payout_id = %(payout_id)s FOR UPDATE"

# `from_state` is the state we moved from: the only one allowed, or the one PAYOUT_LOCK_SQL saw
# with the row locked.
TRANSITION_PAYOUT_SQL = """
WITH moved AS (
    UPDATE payout
       SET state = %(to_state)s, updated_at = clock_timestamp()
     WHERE payout_id = %(payout_id)s AND state = %(from_state)s
 RETURNING payout_id
), ev AS (
    INSERT INTO payout_event (payout_id, from_state, to_state, token, owner_id, note, at)
    SELECT moved.payout_id, %(from_state)s, %(to_state)s, %(token)s::bigint, %(owner_id)s,
           %(note)s, clock_timestamp()
      FROM moved
)
SELECT 1 FROM moved
"""

RAISE_ACCOUNT_FENCE_SQL = """
UPDATE account SET fence = GREATEST(fence, %(floor)s), updated_at = clock_timestamp()
 WHERE account_id = %(account_id)s
RETURNING fence
"""

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
       AND a.fence {comparison} %(token)s
       AND p.idempotency_key = %(key)s AND NOT EXISTS (SELECT 1 FROM rec)
 RETURNING a.account_id, a.fence, a.balance_minor, p.amount_minor
)
SELECT rec.request_hash, rec.status, rec.body,
       fenced.account_id, fenced.fence, fenced.balance_minor, fenced.amount_minor
  FROM (SELECT 1) AS one LEFT JOIN rec ON true LEFT JOIN fenced ON true
"""
CLAIM_RECORD_OR_FENCE_SQL = _RECORD_OR_FENCE_SQL.format(comparison="<")
POST_RECORD_OR_FENCE_SQL = _RECORD_OR_FENCE_SQL.format(comparison="<=")

# Zero rows from a fence UPDATE: which payout/account, what fence beat us, which key it has.
FENCE_DIAGNOSIS_SQL = """
SELECT p.account_id, a.fence, p.idempotency_key
  FROM payout p JOIN account a ON a.account_id = p.account_id
 WHERE p.payout_id = %(payout_id)s
"""

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

# The stored answer of a fenced write, in the statement that makes the write (`moved` is the
# payout row it moved): a replay then finds it, and a failed write stores nothing.
_RECORD_MOVED_CTE = """
    INSERT INTO idempotency_record (operation, idempotency_key, token, request_hash, payout_id,
                                    status, body, created_at)
    SELECT {operation}, %(key)s, %(token)s, %(request_hash)s, moved.payout_id, 200, %(body)s,
           clock_timestamp()
      FROM moved
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
""".format(record=_RECORD_MOVED_CTE.format(operation="'claim'"))

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

# P3 after its fence (the account row locked): RAIL_ACKED → POSTED with its history row, both
# legs, the debit and the settlement credit (the settlement account created on its first
# credit) and the identity's recorded 200, in one statement; nothing is written unless the
# payout moved. The entry ids and the body come from the caller, who knows them from the locked
# account and payout rows. The credit lands in the payout's bucket row of the settlement
# account (issue 28 item 3), not on the account row: the posts of one currency would otherwise
# queue on that one row's lock until each commit's fsync. ON CONFLICT DO NOTHING takes no row
# lock, so `settled` only creates the account (ledger entries and buckets reference it).
POST_SQL = """
WITH moved AS (
    UPDATE payout
       SET state = 'POSTED', rail_reference = %(rail_reference)s,
           rail_submission_id = %(submission_id)s, updated_at = clock_timestamp()
     WHERE payout_id = %(payout_id)s AND state = 'RAIL_ACKED'
 RETURNING payout_id, account_id, amount_minor, currency
), ev AS (
    INSERT INTO payout_event (payout_id, from_state, to_state, token, owner_id, note, at)
    SELECT moved.payout_id, 'RAIL_ACKED', 'POSTED', %(token)s, %(owner_id)s, NULL,
           clock_timestamp()
      FROM moved
), debited AS (
    UPDATE account
       SET balance_minor = balance_minor - moved.amount_minor, updated_at = clock_timestamp()
      FROM moved
     WHERE account.account_id = moved.account_id
 RETURNING account.balance_minor
), settled AS (
    INSERT INTO account (account_id, currency, kind, balance_minor, fence, updated_at)
    SELECT 'settlement:' || moved.currency, moved.currency, 'SETTLEMENT', 0, 0, clock_timestamp()
      FROM moved
        ON CONFLICT (account_id) DO NOTHING
), credited AS (
    INSERT INTO settlement_bucket (account_id, bucket, balance_minor, updated_at)
    SELECT 'settlement:' || moved.currency, %(bucket)s, moved.amount_minor, clock_timestamp()
      FROM moved
        ON CONFLICT (account_id, bucket) DO UPDATE
       SET balance_minor = settlement_bucket.balance_minor + EXCLUDED.balance_minor,
           updated_at = clock_timestamp()
), legs AS (
    INSERT INTO ledger_entry (entry_id, payout_id, account_id, direction, amount_minor, fence,
                              posted_at)
    SELECT leg.entry_id, moved.payout_id, leg.account_id, leg.direction, moved.amount_minor,
           %(token)s, clock_timestamp()
      FROM moved,
           LATERAL (VALUES (%(debit_entry)s::uuid, moved.account_id, 'DEBIT'),
                           (%(credit_entry)s::uuid, 'settlement:' || moved.currency, 'CREDIT'))
                AS leg (entry_id, account_id, direction)
), rec AS ({record})
SELECT moved.account_id, moved.amount_minor, moved.currency, (SELECT balance_minor FROM debited)
  FROM moved
""".format(record=_RECORD_MOVED_CTE.format(operation="'post'"))

PAYOUT_STATE_SQL = "SELECT state, claim_token FROM payout WHERE payout_id = %(payout_id)s"

ENSURE_ACCOUNT_SQL = """
INSERT INTO account (account_id, currency, kind, balance_minor, fence, updated_at)
VALUES (%(account_id)s, %(currency)s, %(kind)s, 0, 0, clock_timestamp())
ON CONFLICT (account_id) DO NOTHING
"""

# Double entry in one statement: DEBIT the debited account, CREDIT the credited one, both
# balances moved by the same amount. The CUSTOMER CHECK (balance >= 0) is the last guard.
# Opening balances and an operator's POSTED resolution: rare, so a settlement credit here moves
# the account row itself (part of its balance beside the buckets: selectors.balance_sql).
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
    if len(from_states) == 1:
        from_state = from_states[0]  # the UPDATE's own row lock and recheck decide; one trip
    else:
        cursor.execute(PAYOUT_LOCK_SQL, {"payout_id": str(payout_id)})
        row = cursor.fetchone()
        if row is None or row[0] not in from_states:
            return False
        from_state = row[0]
    cursor.execute(
        TRANSITION_PAYOUT_SQL,
        {
            "payout_id": str(payout_id),
            "from_state": from_state,
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


@dataclass(frozen=True)
class Posted:
    account_id: str
    amount_minor: int
    currency: str
    debit_balance: int  # the settlement side is a bucket's share: no balance of its own


def settlement_bucket(payout_id: uuid.UUID, *, buckets: int) -> int:
    """The settlement bucket a payout's credit lands in: stable (a retry or replay of the post
    names the same row) and spread even for non-random ids (a hash, not the id's low bits)."""
    return zlib.crc32(payout_id.bytes) % buckets


def post(
    cursor: Any,
    *,
    payout_id: uuid.UUID,
    token: int,
    owner_id: str,
    rail_reference: str,
    submission_id: uuid.UUID,
    debit_entry: uuid.UUID,
    credit_entry: uuid.UUID,
    idempotency_key: str,
    request_hash: str,
    body_json: str,
    settlement_bucket: int,
) -> Posted | None:
    """RAIL_ACKED → POSTED, both legs, the debit, the credit to `settlement_bucket` of the
    settlement account and the recorded 200, one statement; None if the payout was not
    RAIL_ACKED (nothing written)."""
    cursor.execute(
        POST_SQL,
        {
            "payout_id": str(payout_id),
            "bucket": settlement_bucket,
            "token": token,
            "owner_id": owner_id,
            "rail_reference": rail_reference,
            "submission_id": str(submission_id),
            "debit_entry": str(debit_entry),
            "credit_entry": str(credit_entry),
            "key": idempotency_key,
            "request_hash": request_hash,
            "body": body_json,
        },
    )
    row = cursor.fetchone()
    if row is None:
        return None
    return Posted(row[0], int(row[1]), row[2], int(row[3]))


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
    debit_balance: int  # the rows' own balance_minor: of a settlement account, a share of it
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
