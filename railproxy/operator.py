"""Operator writes on the rail high-water mark: the revoke push and the fence repair.

Named functions on a caller's cursor (the ops app's paydb transaction also holds the account
row). Raw SQL because each is one conditional statement whose RETURNING row decides.
"""

from __future__ import annotations

from typing import Any

from railproxy.fenced_sql import raise_high_water

HIGH_WATER_FOR_UPDATE_SQL = (
    "SELECT highest_token FROM rail_high_water WHERE account_id = %(account_id)s FOR UPDATE"
)
# Only from the value read under the row lock, only downwards; the same-token retry allowance
# belonged to a token above the bound, so it goes too.
LOWER_HIGH_WATER_SQL = """
UPDATE rail_high_water
   SET highest_token = %(bound)s, retry_payout_id = NULL, updated_at = clock_timestamp()
 WHERE account_id = %(account_id)s AND highest_token = %(expected)s
   AND highest_token > %(bound)s
RETURNING highest_token
"""


def push_high_water_floor(cursor: Any, *, account_id: str, floor: int) -> int:
    """highest_token = GREATEST(highest_token, floor), creating the row (revoke push, L8)."""
    return int(raise_high_water(cursor, account_id=account_id, floor=floor))


def lock_high_water(cursor: Any, *, account_id: str) -> int | None:
    """The account's rail high-water mark, row-locked until commit; None when it has no row."""
    cursor.execute(HIGH_WATER_FOR_UPDATE_SQL, {"account_id": account_id})
    row = cursor.fetchone()
    return None if row is None else int(row[0])


def lower_high_water(cursor: Any, *, account_id: str, expected: int, bound: int) -> int | None:
    """highest_token = bound, only if it still is `expected` and above; the new mark or None."""
    cursor.execute(
        LOWER_HIGH_WATER_SQL, {"account_id": account_id, "expected": expected, "bound": bound}
    )
    row = cursor.fetchone()
    return None if row is None else int(row[0])
