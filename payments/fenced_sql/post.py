"""P3 post after its fence: RAIL_ACKED → POSTED with both legs and the settlement credit in
its bucket, in one statement."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from payments.fenced_sql.fences import RECORD_MOVED_CTE

if TYPE_CHECKING:
    import uuid


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
# account (CHANGELOG row 75), not on the account row: the posts of one currency would otherwise
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
""".format(record=RECORD_MOVED_CTE.format(operation="'post'"))


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
