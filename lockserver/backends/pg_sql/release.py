"""Release with the hand-off to the queue's head, the hand-off alone, withdraw, and revoke."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from lockserver.backends.base import GrantRecord
from lockserver.backends.pg_sql.common import (
    ELIGIBLE,
    FREE_HOLDER,
    GRANT_PAYLOAD,
    HANDED,
    HEAD,
    LIVE,
    NOTIFY_CHANNEL,
    NOTIFY_GRANTED,
    RECORD_HANDOFF,
)

# Compare-and-delete on (lock_key, fencing_token) and nothing else (C3 L6), and in the same
# statement the hand-off to the head of the queue (decision 23): a new token drawn under the
# key's row lock, the waiter's row told its grant, and a NOTIFY for that waiter only. With no
# waiter to hand to, the key is freed; the key's broadcast NOTIFY then goes out only if a waiter
# marked the row that this statement's snapshot does not show yet (NOTIFY_IF_WAITED). The last
# column is the grant NOTIFY's payload, for a waiter parked in this process (Released.handed).
RELEASE_SQL = f"""
WITH cur AS (
    SELECT g.lock_key, g.owner_id, g.session_id FROM lock_grant AS g
    WHERE g.lock_key = %(key)s AND g.fencing_token = %(token)s AND {LIVE}
    FOR UPDATE
), nxt AS ({HEAD}), upd AS (
    UPDATE lock_grant AS g SET {HANDED}
    FROM cur LEFT JOIN nxt ON true WHERE g.lock_key = cur.lock_key
    RETURNING cur.lock_key, cur.owner_id, cur.session_id, g.waiter_until, nxt.waiter_id,
              g.fencing_token, g.acquired_at, g.expires_at
), handed AS ({RECORD_HANDOFF})
SELECT owner_id, session_id, waiter_id,
       CASE WHEN waiter_id IS NOT NULL THEN {NOTIFY_GRANTED}
            WHEN waiter_until > clock_timestamp()
            THEN pg_notify('{NOTIFY_CHANNEL}', lock_key) END,
       CASE WHEN waiter_id IS NOT NULL THEN {GRANT_PAYLOAD} END
FROM upd
"""


@dataclass(frozen=True)
class Released:
    owner_id: str  # of the released grant
    session_id: uuid.UUID
    handed: str | None  # the grant NOTIFY's payload when the key was handed to a waiter


def release(cursor: Any, *, key: str, token: int) -> Released | None:
    """Free the live grant (key, token), handing it to the head of its queue if any (that
    waiter is notified on commit). None: (key, token) is not live."""
    cursor.execute(RELEASE_SQL, {"key": key, "token": token})
    row = cursor.fetchone()
    return Released(row[0], row[1], row[4]) if row else None


# The hand-off on its own, for a key that is not live (freed by a revoke, a closed session or
# the reaper in the same transaction, or lapsed: then this statement ends the lapsed grant).
# Always one row: the waiter granted (or NULL), the lapsed grant it replaced, and in how many
# ms the key's holder (the new one, or the live one left alone) lapses, and the grant NOTIFY's
# payload.
HAND_OFF_SQL = f"""
WITH cur AS (
    SELECT g.lock_key, g.fencing_token, g.owner_id, g.session_id FROM lock_grant AS g
    WHERE g.lock_key = %(key)s AND NOT COALESCE({LIVE}, false)
    FOR UPDATE
), nxt AS ({HEAD}), upd AS (
    UPDATE lock_grant AS g SET {HANDED}
    FROM cur JOIN nxt ON true WHERE g.lock_key = cur.lock_key
    RETURNING nxt.waiter_id, nxt.session_id, g.owner_id, g.fencing_token, g.acquired_at,
              g.expires_at, LEAST(g.expires_at, g.session_expires_at) AS until,
              cur.fencing_token AS lapsed_token, cur.owner_id AS lapsed_owner,
              cur.session_id AS lapsed_session
), handed AS ({RECORD_HANDOFF})
SELECT upd.waiter_id, upd.lapsed_token, upd.lapsed_owner, upd.lapsed_session,
       CEIL(EXTRACT(EPOCH FROM (COALESCE(upd.until, (
           SELECT LEAST(g.expires_at, g.session_expires_at) FROM lock_grant AS g
           WHERE g.lock_key = %(key)s AND {LIVE})) - clock_timestamp())) * 1000)::bigint,
       upd.session_id, upd.owner_id, upd.fencing_token, upd.acquired_at, upd.expires_at,
       CASE WHEN upd.waiter_id IS NOT NULL THEN {NOTIFY_GRANTED} END,
       CASE WHEN upd.waiter_id IS NOT NULL THEN {GRANT_PAYLOAD} END
FROM (SELECT 1) AS one LEFT JOIN upd ON true
"""


@dataclass(frozen=True)
class HandOff:
    waiter_id: uuid.UUID | None  # the waiter granted, if any
    lapsed_token: int | None  # a lapsed grant this hand-off ended (lock_expired)
    lapsed_owner_id: str | None
    lapsed_session_id: uuid.UUID | None
    ms_until_free: int | None  # the key's holder after the statement lapses in this many ms
    grant: GrantRecord | None  # what the waiter was granted
    payload: str | None  # the grant NOTIFY's payload (KeyListener.hand_over)


def hand_off(cursor: Any, *, key: str) -> HandOff:
    """Grant a key that is not live to the head of its queue (nothing if the key is live or
    nobody eligible is queued)."""
    cursor.execute(HAND_OFF_SQL, {"key": key})
    row = cursor.fetchone()
    waiter_id, lapsed_token, lapsed_owner, lapsed_session, ms = row[:5]
    session_id, owner, token, acquired_at, expires_at = row[5:10]
    grant = (
        None
        if waiter_id is None
        else GrantRecord(key, owner, session_id, token, acquired_at, expires_at)
    )
    return HandOff(
        waiter_id,
        lapsed_token,
        lapsed_owner,
        lapsed_session,
        None if ms is None else max(0, int(ms)),
        grant,
        row[11],
    )


# The hand-off of several keys freed in one transaction (the reaper's lapsed grants, a closed
# session's grants) in one statement: each key that is not live goes to the head of its queue.
# Rows are locked in key order, so two such statements never wait on each other in a cycle.
HAND_OFF_KEYS_SQL = f"""
WITH cur AS (
    SELECT g.lock_key FROM lock_grant AS g
    WHERE g.lock_key = ANY(%(keys)s::varchar[]) AND NOT COALESCE({LIVE}, false)
    ORDER BY g.lock_key
    FOR UPDATE
), nxt AS (
    SELECT cur.lock_key, head.* FROM cur CROSS JOIN LATERAL (
        SELECT w.waiter_id, w.session_id, w.owner_id, w.ttl_ms,
               s.expires_at AS session_expires_at
        FROM lock_waiter AS w, lock_session AS s
        WHERE w.lock_key = cur.lock_key AND {ELIGIBLE}
        ORDER BY w.position LIMIT 1
        FOR UPDATE OF w SKIP LOCKED
    ) AS head
), upd AS (
    UPDATE lock_grant AS g SET {HANDED}
    FROM nxt WHERE g.lock_key = nxt.lock_key
    RETURNING nxt.waiter_id, g.fencing_token, g.acquired_at, g.expires_at
), handed AS ({RECORD_HANDOFF})
SELECT {NOTIFY_GRANTED}, {GRANT_PAYLOAD} FROM upd
"""


def hand_off_keys(cursor: Any, *, keys: list[str]) -> list[str]:
    """Grant each of `keys` that is not live to the head of its queue, in one statement; the
    grant NOTIFY's payload of every hand-off (KeyListener.hand_over, after the commit)."""
    if not keys:
        return []
    cursor.execute(HAND_OFF_KEYS_SQL, {"keys": keys})
    return [row[1] for row in cursor.fetchall()]


WITHDRAW_SQL = "DELETE FROM lock_waiter WHERE waiter_id = %(waiter_id)s RETURNING 1"

OWN_GRANT_SQL = f"""
SELECT g.owner_id, g.fencing_token, g.acquired_at, g.expires_at FROM lock_grant AS g
WHERE g.lock_key = %(key)s AND g.session_id = %(session_id)s AND {LIVE}
"""


def withdraw(
    cursor: Any, *, waiter_id: uuid.UUID, key: str, session_id: uuid.UUID
) -> GrantRecord | None:
    """Leave the queue (the wait ran out). None: we were still queued, nobody can grant us now.
    Else the entry was gone: handed to us (a hand-off holding the row commits first; its NOTIFY
    may still be on its way) — the key's live grant of our session, if any — or withdrawn."""
    cursor.execute(WITHDRAW_SQL, {"waiter_id": waiter_id})
    if cursor.fetchone() is not None:
        return None
    cursor.execute(OWN_GRANT_SQL, {"key": key, "session_id": session_id})
    row = cursor.fetchone()
    if row is None:
        return None
    owner, token, acquired_at, expires_at = row
    return GrantRecord(key, owner, session_id, token, acquired_at, expires_at)


LOCK_KEY_SQL = f"""
SELECT g.fencing_token, g.owner_id, g.session_id, COALESCE({LIVE}, false)
FROM lock_grant AS g WHERE g.lock_key = %(key)s FOR UPDATE
"""

REVOKE_SQL = f"""
WITH upd AS (
    UPDATE lock_grant SET {FREE_HOLDER}
    WHERE lock_key = %(key)s AND fencing_token = %(token)s
    RETURNING lock_key
), rev AS (
    INSERT INTO lock_revocation (revocation_id, lock_key, operator, reason, revoked_token,
                                 revoked_owner_id, revoked_session_id, new_token_floor,
                                 revoked_at)
    SELECT %(revocation_id)s, upd.lock_key, %(operator)s, %(reason)s, %(token)s,
           %(owner_id)s, %(session_id)s, nextval('fencing_token_seq'), clock_timestamp()
    FROM upd
    RETURNING lock_key, new_token_floor
)
SELECT new_token_floor FROM rev JOIN upd USING (lock_key)
"""


def lock_key_row(cursor: Any, *, key: str) -> tuple[int | None, str | None, uuid.UUID | None, bool]:
    """Lock the key's row; (token, owner, session, live) or (None, None, None, False)."""
    cursor.execute(LOCK_KEY_SQL, {"key": key})
    row = cursor.fetchone()
    return (row[0], row[1], row[2], row[3]) if row else (None, None, None, False)


def revoke(
    cursor: Any,
    *,
    key: str,
    token: int,
    owner_id: str,
    session_id: uuid.UUID,
    operator: str,
    reason: str,
    revocation_id: uuid.UUID,
) -> int:
    """Free the grant (key, token), advance the sequence (the floor) and write the audit row.

    Call inside one transaction after lock_key_row(): the floor is drawn under the key's row
    lock after the revoked token, so revoked_token < floor < every token drawn afterwards.
    """
    cursor.execute(
        REVOKE_SQL,
        {
            "key": key,
            "token": token,
            "owner_id": owner_id,
            "session_id": session_id,
            "operator": operator,
            "reason": reason,
            "revocation_id": revocation_id,
        },
    )
    return cursor.fetchone()[0]
