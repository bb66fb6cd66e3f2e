"""Ledger postings outside P3: double entry in one statement (opening balances, operators'
resolutions, recoveries and reversals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uuid


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
