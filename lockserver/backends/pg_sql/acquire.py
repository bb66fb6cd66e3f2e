"""Acquire, rotate, renew, and one key's state: the statements that grant or extend a hold."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from lockserver.backends.base import GrantRecord
from lockserver.backends.pg_sql.common import ELIGIBLE, LIVE, KeyState

# One autocommit statement. A free or lapsed key is taken only while nobody is queued on it
# (decision 23: a newcomer does not overtake the queue; acquire() hands the key to the head
# instead and queues behind it). The INSERT arm draws its token before the row exists, which is safe
# because a key's row is never deleted: only the very first grant of a key takes that arm. Every
# later grant takes the DO UPDATE arm, whose nextval() runs after the row lock is held and the
# WHERE re-checked on the newest row version - so a token drawn by a caller that then lost the
# race is never granted, and a revoke's floor (drawn under the same row lock) is below it.
ACQUIRE_SQL = f"""
WITH sess AS (
    SELECT session_id, owner_id, expires_at FROM lock_session
    WHERE session_id = %(session_id)s AND expires_at > clock_timestamp()
      AND (%(owner_id)s::text IS NULL OR owner_id = %(owner_id)s::text)
    FOR SHARE
)
INSERT INTO lock_grant AS g (lock_key, first_seen_at, session_id, owner_id, fencing_token,
                             ttl_ms, acquired_at, expires_at, session_expires_at)
SELECT %(key)s, clock_timestamp(), sess.session_id, sess.owner_id,
       nextval('fencing_token_seq'), %(ttl_ms)s, clock_timestamp(),
       clock_timestamp() + %(ttl_ms)s * interval '1 millisecond', sess.expires_at
FROM sess
ON CONFLICT (lock_key) DO UPDATE SET
    session_id = EXCLUDED.session_id,
    owner_id = EXCLUDED.owner_id,
    previous_token = g.fencing_token,
    previous_owner_id = g.owner_id,
    fencing_token = nextval('fencing_token_seq'),
    ttl_ms = EXCLUDED.ttl_ms,
    acquired_at = clock_timestamp(),
    expires_at = clock_timestamp() + EXCLUDED.ttl_ms * interval '1 millisecond',
    session_expires_at = EXCLUDED.session_expires_at
WHERE (g.fencing_token IS NULL
       OR g.expires_at <= clock_timestamp()
       OR g.session_expires_at <= clock_timestamp())
  AND NOT EXISTS (SELECT 1 FROM lock_waiter AS w, lock_session AS s
                  WHERE w.lock_key = g.lock_key AND {ELIGIBLE})
RETURNING g.owner_id, g.fencing_token, g.acquired_at, g.expires_at,
          g.previous_token, g.previous_owner_id
"""


@dataclass(frozen=True)
class Acquired:
    grant: GrantRecord
    replaced_token: int | None  # a lapsed grant this one took over (lock_expired)
    replaced_owner_id: str | None


def try_acquire(
    cursor: Any, *, key: str, session_id: uuid.UUID, owner_id: str | None, ttl_ms: int
) -> Acquired | None:
    """Grant `key` with a new token if it is free, lapsed, or its holder's session lapsed and
    the caller's session is live (and owned by owner_id when given); else None."""
    cursor.execute(
        ACQUIRE_SQL, {"key": key, "session_id": session_id, "owner_id": owner_id, "ttl_ms": ttl_ms}
    )
    row = cursor.fetchone()
    if row is None:
        return None
    owner, token, acquired_at, expires_at, previous_token, previous_owner = row
    grant = GrantRecord(key, owner, session_id, token, acquired_at, expires_at)
    return Acquired(grant, previous_token, previous_owner)


# The holding session acquires again (e.g. its release timed out): the same row, a NEW token
# drawn under the row lock (the CTE locks first), so the old token is fenced everywhere
# (CHANGELOG row 43).
ROTATE_SQL = f"""
WITH cur AS (
    SELECT g.lock_key FROM lock_grant AS g
    WHERE g.lock_key = %(key)s AND g.session_id = %(session_id)s
      AND g.fencing_token = %(token)s AND {LIVE}
    FOR UPDATE
), sess AS (
    SELECT expires_at FROM lock_session
    WHERE session_id = %(session_id)s AND expires_at > clock_timestamp()
    FOR SHARE
)
UPDATE lock_grant AS g SET
    fencing_token = nextval('fencing_token_seq'),
    ttl_ms = %(ttl_ms)s,
    acquired_at = clock_timestamp(),
    expires_at = clock_timestamp() + %(ttl_ms)s * interval '1 millisecond',
    session_expires_at = sess.expires_at
FROM cur, sess WHERE g.lock_key = cur.lock_key
RETURNING g.owner_id, g.fencing_token, g.acquired_at, g.expires_at
"""


def rotate(
    cursor: Any, *, key: str, session_id: uuid.UUID, token: int, ttl_ms: int
) -> GrantRecord | None:
    """Give the live grant (key, token) of session_id a new, higher token; None if it is not
    (any longer) that session's live grant."""
    cursor.execute(
        ROTATE_SQL, {"key": key, "session_id": session_id, "token": token, "ttl_ms": ttl_ms}
    )
    row = cursor.fetchone()
    if row is None:
        return None
    owner, new_token, acquired_at, expires_at = row
    return GrantRecord(key, owner, session_id, new_token, acquired_at, expires_at)


KEY_STATE_SQL = f"""
SELECT g.lock_key IS NOT NULL,
       COALESCE({LIVE}, false),
       g.session_id, g.owner_id, g.fencing_token, g.acquired_at, g.expires_at,
       CEIL(EXTRACT(EPOCH FROM (LEAST(g.expires_at, g.session_expires_at)
                                - clock_timestamp())) * 1000)::bigint,
       (SELECT count(*) FROM lock_waiter w
        WHERE w.lock_key = %(key)s AND w.expires_at > clock_timestamp()),
       pg_is_in_recovery()
FROM (SELECT 1) AS one LEFT JOIN lock_grant AS g ON g.lock_key = %(key)s
"""


def key_state(cursor: Any, *, key: str) -> KeyState:
    """Advisory read of one key (L7, and the details of L4/L5/L6 failures)."""
    cursor.execute(KEY_STATE_SQL, {"key": key})
    seen, live, session_id, owner, token, acquired_at, expires_at, ms, waiters, rec = (
        cursor.fetchone()
    )
    if not live:
        session_id = owner = token = acquired_at = expires_at = ms = None
    return KeyState(
        seen,
        live,
        session_id,
        owner,
        token,
        acquired_at,
        expires_at,
        None if ms is None else max(0, int(ms)),
        int(waiters),
        bool(rec),
    )


RENEW_SQL = f"""
UPDATE lock_grant AS g SET
    ttl_ms = COALESCE(%(ttl_ms)s, g.ttl_ms),
    expires_at = clock_timestamp() + COALESCE(%(ttl_ms)s, g.ttl_ms) * interval '1 millisecond',
    session_expires_at = s.expires_at
FROM lock_session AS s
WHERE g.lock_key = %(key)s AND g.fencing_token = %(token)s AND g.session_id = %(session_id)s
  AND {LIVE}
  AND s.session_id = g.session_id AND s.expires_at > clock_timestamp()
RETURNING g.owner_id, g.acquired_at, g.expires_at
"""


def renew(
    cursor: Any, *, key: str, session_id: uuid.UUID, token: int, ttl_ms: int | None
) -> GrantRecord | None:
    """Extend the live grant (key, token) held by session_id; the token never changes."""
    cursor.execute(
        RENEW_SQL, {"key": key, "token": token, "session_id": session_id, "ttl_ms": ttl_ms}
    )
    row = cursor.fetchone()
    if row is None:
        return None
    owner, acquired_at, expires_at = row
    return GrantRecord(key, owner, session_id, token, acquired_at, expires_at)
