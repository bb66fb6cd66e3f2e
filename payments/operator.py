"""Operator writes on the account fence outside P2/P3: the revoke push and the fence repair.

Named functions on a caller's cursor (the ops app's transaction spans this app's `account` row
and the rail proxy's high-water row, both in paydb; the experiment passes a psycopg cursor of
its own). Raw SQL because each is one conditional statement whose RETURNING row decides.
"""

from __future__ import annotations

from typing import Any

from dlock.errors import not_found
from payments.fenced_sql.account import raise_account_fence

ACCOUNT_FENCE_FOR_UPDATE_SQL = (
    "SELECT fence FROM account WHERE account_id = %(account_id)s FOR UPDATE"
)
# Only from the value the caller read under the row lock, and only downwards.
LOWER_ACCOUNT_FENCE_SQL = """
UPDATE account SET fence = %(bound)s, updated_at = clock_timestamp()
 WHERE account_id = %(account_id)s AND fence = %(expected)s AND fence > %(bound)s
RETURNING fence
"""
INSERT_FENCE_REPAIR_SQL = """
INSERT INTO fence_repair (account_id, operator, reason, lock_backend, issued_bound, old_fence,
                          new_fence, old_rail_high_water, new_rail_high_water, at)
VALUES (%(account_id)s, %(operator)s, %(reason)s, %(lock_backend)s, %(issued_bound)s,
        %(old_fence)s, %(new_fence)s, %(old_rail_high_water)s, %(new_rail_high_water)s,
        clock_timestamp())
RETURNING repair_id, at
"""
INSERT_RECONCILE_RUN_SQL = """
INSERT INTO reconcile_run (ok, violations, classified, counts, finished_at)
VALUES (%(ok)s, %(violations)s, %(classified)s, %(counts)s::jsonb, clock_timestamp())
RETURNING run_id
"""


def push_fence_floor(cursor: Any, *, account_id: str, floor: int) -> int:
    """fence = GREATEST(fence, floor); the stored fence (revoke push, L8). NOT_FOUND if no
    such account."""
    fence = raise_account_fence(cursor, account_id=account_id, floor=floor)
    if fence is None:
        raise not_found("account", account_id)
    return fence


def lock_account_fence(cursor: Any, *, account_id: str) -> int | None:
    """The account's fence, row-locked until the caller's commit (no claim or post can move it
    meanwhile); None when there is no such account."""
    cursor.execute(ACCOUNT_FENCE_FOR_UPDATE_SQL, {"account_id": account_id})
    row = cursor.fetchone()
    return None if row is None else int(row[0])


def lower_account_fence(cursor: Any, *, account_id: str, expected: int, bound: int) -> int | None:
    """fence = bound, only if it still is `expected` and above `bound`; the new fence or None."""
    cursor.execute(
        LOWER_ACCOUNT_FENCE_SQL, {"account_id": account_id, "expected": expected, "bound": bound}
    )
    row = cursor.fetchone()
    return None if row is None else int(row[0])


def record_fence_repair(cursor: Any, **values: Any) -> tuple[int, Any]:
    """Append the `fence_repair` audit row; (repairId, at)."""
    cursor.execute(INSERT_FENCE_REPAIR_SQL, values)
    repair_id, at = cursor.fetchone()
    return int(repair_id), at


def record_reconcile_run(
    cursor: Any, *, ok: bool, violations: int, classified: int, counts: str
) -> int:
    """Append one `reconcile_run` row (read by payments/reconcile_metrics.py at scrape time)."""
    cursor.execute(
        INSERT_RECONCILE_RUN_SQL,
        {"ok": ok, "violations": violations, "classified": classified, "counts": counts},
    )
    return int(cursor.fetchone()[0])
