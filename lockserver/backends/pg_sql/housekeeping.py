"""Housekeeping: the reaper's lapsed grants and expired sessions, purge, live counts."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from lockserver.backends.pg_sql.common import FREE_HOLDER, LIVE

REAP_GRANTS_SQL = f"""
WITH dead AS (
    SELECT lock_key, fencing_token, owner_id, session_id FROM lock_grant
    WHERE fencing_token IS NOT NULL
      AND (expires_at <= clock_timestamp() OR session_expires_at <= clock_timestamp())
    ORDER BY expires_at LIMIT 500
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE lock_grant AS g SET {FREE_HOLDER}
    FROM dead WHERE g.lock_key = dead.lock_key
      AND (g.expires_at <= clock_timestamp() OR g.session_expires_at <= clock_timestamp())
    RETURNING dead.lock_key, dead.fencing_token, dead.owner_id, dead.session_id, g.waiter_until
)
SELECT lock_key, fencing_token, owner_id, session_id, waiter_until > clock_timestamp()
FROM upd
"""


def reap_lapsed_grants(cursor: Any) -> list[tuple[str, int, str, uuid.UUID, bool]]:
    """Free grants whose lease or session lapsed; (key, token, owner, session, waited) of each
    (waited: some waiter may be queued, so hand the key over in the same transaction)."""
    cursor.execute(REAP_GRANTS_SQL)
    return [tuple(row) for row in cursor.fetchall()]


REAP_SESSIONS_SQL = """
UPDATE lock_session SET expiry_logged = true
WHERE session_id IN (
    SELECT session_id FROM lock_session
    WHERE NOT expiry_logged AND expires_at <= clock_timestamp()
    LIMIT 500 FOR UPDATE SKIP LOCKED
)
RETURNING session_id, owner_id, expires_at
"""


def reap_expired_sessions(cursor: Any) -> list[tuple[uuid.UUID, str, dt.datetime]]:
    """Mark newly expired sessions (each is reported once): (session, owner, expired_at)."""
    cursor.execute(REAP_SESSIONS_SQL)
    return [tuple(row) for row in cursor.fetchall()]


PURGE_SQL = """
WITH s AS (
    DELETE FROM lock_session
    WHERE expires_at < clock_timestamp() - %(retention_ms)s * interval '1 millisecond'
    RETURNING 1
), w AS (
    DELETE FROM lock_waiter AS w
    WHERE w.expires_at < clock_timestamp() - interval '1 minute'
       OR NOT EXISTS (
           SELECT 1 FROM lock_session AS s
           WHERE s.session_id = w.session_id AND s.expires_at > clock_timestamp())
    RETURNING 1
)
SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM w)
"""


def purge(cursor: Any, *, retention_ms: int) -> tuple[int, int]:
    """Forget sessions expired longer than the retention, abandoned waiter rows, and the queue
    entries of dead sessions (skipped by every hand-off; their parked acquire answers 410)."""
    cursor.execute(PURGE_SQL, {"retention_ms": retention_ms})
    return tuple(cursor.fetchone())


LIVE_COUNTS_SQL = f"""
SELECT (SELECT count(*) FROM lock_session WHERE expires_at > clock_timestamp()),
       (SELECT count(*) FROM lock_grant AS g WHERE {LIVE})
"""


def live_counts(cursor: Any) -> tuple[int, int]:
    cursor.execute(LIVE_COUNTS_SQL)
    return tuple(cursor.fetchone())


def in_recovery(cursor: Any) -> bool:
    cursor.execute("SELECT pg_is_in_recovery()")
    return bool(cursor.fetchone()[0])
