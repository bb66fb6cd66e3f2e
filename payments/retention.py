"""Retention of idempotency records: a stored answer is kept for as long as a replay of it
can come, then purged (`manage.py purge_idempotency`, a k8s CronJob).

A replay is the same (operation, key, token) sent again: an executor's retry within its grant
(seconds; a grant lives at most LOCK_MAX_TTL_MS between renewals), or a later holder's recovery
read of a payout still in flight. So a record is purged only when it is older than the window
(`IDEMPOTENCY_RETENTION_DAYS`, default 7 days: orders of magnitude past any grant) AND its
payout has ended (POSTED, FAILED, ABANDONED) or names none; a quarantined (RAIL_AMBIGUOUS) or
live payout keeps its records however old. The rail proxy's rail_submission rows are the
rail's audit trail and are never purged here.
"""

from __future__ import annotations

from django.db import connections, transaction

# Terminal payout states: nothing more happens to them by any token (ARCHITECTURE decision 3).
ENDED_STATES = ("POSTED", "FAILED", "ABANDONED")
PURGE_BATCH = 5_000

# One batch: the oldest purgeable rows first; the payout's state decides (a LEFT JOIN keeps
# records that name no payout purgeable by age alone).
PURGE_BATCH_SQL = """
DELETE FROM idempotency_record
 WHERE id IN (
    SELECT r.id
      FROM idempotency_record r
      LEFT JOIN payout p ON p.payout_id = r.payout_id
     WHERE r.created_at < clock_timestamp() - make_interval(days => %(days)s)
       AND (p.payout_id IS NULL OR p.state = ANY(%(ended)s))
     ORDER BY r.id
     LIMIT %(batch)s)
"""

COUNT_SQL = """
SELECT count(*)
  FROM idempotency_record r
  LEFT JOIN payout p ON p.payout_id = r.payout_id
 WHERE r.created_at < clock_timestamp() - make_interval(days => %(days)s)
   AND (p.payout_id IS NULL OR p.state = ANY(%(ended)s))
"""


def purge_idempotency_records(
    *, older_than_days: int, using: str = "default", dry_run: bool = False
) -> int:
    """Delete (or with `dry_run` count) the records past the window whose payout has ended;
    in batches of PURGE_BATCH, each its own transaction, so no long lock holds the table."""
    params = {"days": older_than_days, "ended": list(ENDED_STATES), "batch": PURGE_BATCH}
    if dry_run:
        with connections[using].cursor() as cursor:
            cursor.execute(COUNT_SQL, params)
            return int(cursor.fetchone()[0])
    purged = 0
    while True:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(PURGE_BATCH_SQL, params)
            deleted = cursor.rowcount
        purged += deleted
        if deleted < PURGE_BATCH:
            return purged
