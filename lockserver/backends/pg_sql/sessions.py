"""Sessions: open, read, heartbeat, close (their grants released and waiters withdrawn)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from lockserver.backends.pg_sql.common import FREE_HOLDER, GRANT_CHANNEL, LIVE, SessionRow

OPEN_SESSION_SQL = """
INSERT INTO lock_session (session_id, owner_id, ttl_ms, created_at, expires_at,
                          last_heartbeat_at, expiry_logged)
VALUES (%(session_id)s, %(owner_id)s, %(ttl_ms)s, clock_timestamp(),
        clock_timestamp() + %(ttl_ms)s * interval '1 millisecond', clock_timestamp(), false)
RETURNING expires_at
"""


def open_session(cursor: Any, *, session_id: uuid.UUID, owner_id: str, ttl_ms: int) -> dt.datetime:
    cursor.execute(
        OPEN_SESSION_SQL, {"session_id": session_id, "owner_id": owner_id, "ttl_ms": ttl_ms}
    )
    return cursor.fetchone()[0]


GET_SESSION_SQL = """
SELECT session_id, owner_id, ttl_ms, expires_at, expires_at > clock_timestamp()
FROM lock_session WHERE session_id = %(session_id)s
"""


def get_session(
    cursor: Any, *, session_id: uuid.UUID, for_update: bool = False
) -> SessionRow | None:
    cursor.execute(
        GET_SESSION_SQL + (" FOR UPDATE" if for_update else ""), {"session_id": session_id}
    )
    row = cursor.fetchone()
    return SessionRow(*row) if row else None


HEARTBEAT_SESSION_SQL = """
UPDATE lock_session
SET expires_at = clock_timestamp() + ttl_ms * interval '1 millisecond',
    last_heartbeat_at = clock_timestamp()
WHERE session_id = %(session_id)s AND owner_id = %(owner_id)s
  AND expires_at > clock_timestamp()
RETURNING expires_at, clock_timestamp()
"""

# A separate statement (fresh snapshot) so a grant committed by an acquire that held the
# session row FOR SHARE while this heartbeat waited is refreshed too.
HEARTBEAT_GRANTS_SQL = f"""
UPDATE lock_grant AS g SET session_expires_at = %(expires_at)s
WHERE g.session_id = %(session_id)s AND {LIVE}
"""


def heartbeat(
    cursor: Any, *, session_id: uuid.UUID, owner_id: str
) -> tuple[dt.datetime, dt.datetime, int] | None:
    """Extend a live session and its live grants' session expiry; None if not live/owned.

    Call inside one transaction. Returns (expires_at, server_time, held_lock_count).
    """
    cursor.execute(HEARTBEAT_SESSION_SQL, {"session_id": session_id, "owner_id": owner_id})
    row = cursor.fetchone()
    if row is None:
        return None
    expires_at, server_time = row
    cursor.execute(HEARTBEAT_GRANTS_SQL, {"session_id": session_id, "expires_at": expires_at})
    return expires_at, server_time, cursor.rowcount


DELETE_SESSION_SQL = "DELETE FROM lock_session WHERE session_id = %(session_id)s"

RELEASE_SESSION_GRANTS_SQL = f"""
WITH cur AS (
    SELECT lock_key, fencing_token, owner_id FROM lock_grant
    WHERE session_id = %(session_id)s AND fencing_token IS NOT NULL
    FOR UPDATE
), upd AS (
    UPDATE lock_grant AS g SET {FREE_HOLDER}
    FROM cur WHERE g.lock_key = cur.lock_key
    RETURNING cur.lock_key, cur.fencing_token, cur.owner_id
)
SELECT lock_key, fencing_token, owner_id FROM upd
"""

DELETE_SESSION_WAITERS_SQL = f"""
DELETE FROM lock_waiter WHERE session_id = %(session_id)s
RETURNING waiter_id::text, pg_notify('{GRANT_CHANNEL}', waiter_id::text)
"""


def delete_session_waiters(cursor: Any, *, session_id: uuid.UUID) -> list[str]:
    """Withdraw the session's queue entries (first thing in close_session: a hand-off skips a
    row locked here, and one that locked it first commits before the session is closed). Each
    parked acquire is woken; it finds no grant and answers as for a closed session. Returns
    the withdrawn waiter ids (each one's grant-channel payload)."""
    cursor.execute(DELETE_SESSION_WAITERS_SQL, {"session_id": session_id})
    return [row[0] for row in cursor.fetchall()]


def delete_session(cursor: Any, *, session_id: uuid.UUID) -> list[tuple[str, int, str]]:
    """Delete the session row and free every grant attached to it. Call inside one
    transaction, after locking the session row, then hand each freed key over (hand_off).
    Returns the freed (key, token, owner) triples."""
    cursor.execute(DELETE_SESSION_SQL, {"session_id": session_id})
    cursor.execute(RELEASE_SESSION_GRANTS_SQL, {"session_id": session_id})
    return [(key, token, owner) for key, token, owner in cursor.fetchall()]
