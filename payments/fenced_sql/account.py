"""Account rows: the fence floor push, the account created on first use, and the row lock
that serialises an account's writers."""

from __future__ import annotations

from typing import Any

RAISE_ACCOUNT_FENCE_SQL = """
UPDATE account SET fence = GREATEST(fence, %(floor)s), updated_at = clock_timestamp()
 WHERE account_id = %(account_id)s
RETURNING fence
"""


ENSURE_ACCOUNT_SQL = """
INSERT INTO account (account_id, currency, kind, balance_minor, fence, updated_at)
VALUES (%(account_id)s, %(currency)s, %(kind)s, 0, 0, clock_timestamp())
ON CONFLICT (account_id) DO NOTHING
"""


ACCOUNT_FOR_UPDATE_SQL = """
SELECT account_id, fence, balance_minor FROM account WHERE account_id = %(account_id)s FOR UPDATE
"""


def raise_account_fence(cursor: Any, *, account_id: str, floor: int) -> int | None:
    """fence = GREATEST(fence, floor); returns the stored fence (operator revoke push, L8).

    None if the account does not exist (nothing to fence; no row is created): the caller
    raises (payments.operator.push_fence_floor).
    """
    cursor.execute(RAISE_ACCOUNT_FENCE_SQL, {"account_id": account_id, "floor": floor})
    row = cursor.fetchone()
    return int(row[0]) if row else None


def ensure_account(cursor: Any, *, account_id: str, currency: str, kind: str) -> None:
    cursor.execute(
        ENSURE_ACCOUNT_SQL, {"account_id": account_id, "currency": currency, "kind": kind}
    )


def lock_account(cursor: Any, *, account_id: str) -> tuple[str, int, int] | None:
    cursor.execute(ACCOUNT_FOR_UPDATE_SQL, {"account_id": account_id})
    row = cursor.fetchone()
    return (row[0], int(row[1]), int(row[2])) if row else None
