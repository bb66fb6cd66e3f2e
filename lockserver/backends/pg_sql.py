"""Raw SQL of the PostgreSQL lock backend, one named function per statement.

Why not the ORM: every decision here is a single conditional statement whose predicate reads the
database clock (`clock_timestamp()`) and whose RETURNING row (or its absence) decides who won;
the ORM can express neither `nextval()` under the key's row lock nor ON CONFLICT … WHERE.

Grant liveness is row-local (`fencing_token`, `expires_at`, `session_expires_at` of one
`lock_grant` row), so PostgreSQL's re-check of a row after waiting for its lock (READ COMMITTED)
sees exactly the facts that decide, never a stale snapshot of another table.

`cursor` is a Django cursor on `connections[alias_for("lockserver")]`, or a psycopg cursor.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

NOTIFY_CHANNEL = "dlock_lock_free"
# A hand-off NOTIFYs only the waiter it granted, on its own channel (payload: its waiter id and
# its grant, grant_payload).
GRANT_CHANNEL = "dlock_lock_granted"

_LIVE = (
    "g.fencing_token IS NOT NULL AND g.expires_at > clock_timestamp()"
    " AND g.session_expires_at > clock_timestamp()"
)
_FREE_HOLDER = (
    "session_id = NULL, owner_id = NULL, fencing_token = NULL, ttl_ms = NULL,"
    " acquired_at = NULL, expires_at = NULL, session_expires_at = NULL"
)
# Every statement that frees a key NOTIFYs it only while a waiter may be parked on it: the
# waiter sets lock_grant.waiter_until by an UPDATE of the key's row as it parks (ADD_WAITER_SQL),
# and the freeing statement reads the column from the row version it updates - the newest one,
# after any row-lock wait (READ COMMITTED re-checks an updated row), never its older snapshot.
# Either the waiter's mark commits first (the freeing statement sees it and notifies) or the
# freeing statement holds the row first (the mark waits for its commit and sees the key free:
# the waiter tries again at once). A payout's uncontended release sends no NOTIFY (issue 18).
_NOTIFY_IF_WAITED = (
    f"CASE WHEN waiter_until > clock_timestamp() THEN pg_notify('{NOTIFY_CHANNEL}', lock_key) END"
)

# Grant order (ARCHITECTURE decision 23). Parked waiters are lock_waiter rows; `position` (a
# sequence) is their arrival order. A waiter may be granted while its wait and its session are
# live; the others are skipped, never granted. A waiter leaves the queue when it is granted.
_ELIGIBLE = (
    "w.expires_at > clock_timestamp()"
    " AND s.session_id = w.session_id AND s.expires_at > clock_timestamp()"
)
# The head of a key's queue (`cur` is the CTE that holds the key's row lock). SKIP LOCKED: a
# waiter row locked now is being withdrawn (its wait ran out) or its session closed (close_session
# deletes its waiter rows first): the next one is the head. LockRows runs below LIMIT, so a row
# skipped or gone makes the scan go on to the next waiter.
_HEAD = f"""
    SELECT w.waiter_id, w.session_id, w.owner_id, w.ttl_ms,
           s.expires_at AS session_expires_at
    FROM lock_waiter AS w, lock_session AS s
    WHERE w.lock_key = %(key)s::varchar AND EXISTS (SELECT 1 FROM cur) AND {_ELIGIBLE}
    ORDER BY w.position LIMIT 1
    FOR UPDATE OF w SKIP LOCKED
"""
# Set on the key's row by a hand-off to `nxt` (when there is no `nxt`: the key is freed).
_HANDED = (
    "session_id = nxt.session_id, owner_id = nxt.owner_id,"
    " fencing_token = CASE WHEN nxt.waiter_id IS NULL THEN NULL"
    " ELSE nextval('fencing_token_seq') END,"
    " ttl_ms = nxt.ttl_ms,"
    " acquired_at = CASE WHEN nxt.waiter_id IS NULL THEN NULL ELSE clock_timestamp() END,"
    " expires_at = clock_timestamp() + nxt.ttl_ms * interval '1 millisecond',"
    " session_expires_at = nxt.session_expires_at"
)
# The granted waiter leaves the queue in the same statement; its grant travels in the NOTIFY
# payload (grant_payload), so the parked acquire answers without another statement.
_RECORD_HANDOFF = """
    DELETE FROM lock_waiter AS w USING upd WHERE w.waiter_id = upd.waiter_id
    RETURNING w.waiter_id
"""
_EPOCH_US = "(EXTRACT(EPOCH FROM {}) * 1000000)::bigint"
# payload: "<waiter id> <token> <acquiredAt µs> <expiresAt µs>"; a bare "<waiter id>" means the
# entry was withdrawn (its session closed)
_NOTIFY_GRANTED = (
    f"pg_notify('{GRANT_CHANNEL}', concat_ws(' ', waiter_id, fencing_token,"
    f" {_EPOCH_US.format('acquired_at')}, {_EPOCH_US.format('expires_at')}))"
)


def grant_payload(payload: str) -> tuple[str, tuple[int, dt.datetime, dt.datetime] | None]:
    """(waiter id, (token, acquiredAt, expiresAt) or None) of a NOTIFY on GRANT_CHANNEL."""
    parts = payload.split(" ")
    if len(parts) != 4:
        return parts[0], None
    waiter_id, token, acquired_us, expires_us = parts
    return waiter_id, (
        int(token),
        dt.datetime.fromtimestamp(int(acquired_us) / 1e6, dt.UTC),
        dt.datetime.fromtimestamp(int(expires_us) / 1e6, dt.UTC),
    )


@dataclass(frozen=True)
class SessionRow:
    session_id: uuid.UUID
    owner_id: str
    ttl_ms: int
    expires_at: dt.datetime
    live: bool


@dataclass(frozen=True)
class GrantRow:
    key: str
    owner_id: str
    session_id: uuid.UUID
    fencing_token: int
    acquired_at: dt.datetime
    expires_at: dt.datetime


@dataclass(frozen=True)
class KeyState:
    """What L4/L5/L6 failures report: the key's current holder, if any, by the DB clock."""

    seen: bool
    live: bool
    session_id: uuid.UUID | None
    owner_id: str | None
    fencing_token: int | None
    acquired_at: dt.datetime | None
    expires_at: dt.datetime | None
    ms_until_free: int | None  # holder's grant or session lapses in this many ms (DB clock)
    waiter_count: int
    in_recovery: bool


# --------------------------------------------------------------------------- sessions

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
WHERE g.session_id = %(session_id)s AND {_LIVE}
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
    UPDATE lock_grant AS g SET {_FREE_HOLDER}
    FROM cur WHERE g.lock_key = cur.lock_key
    RETURNING cur.lock_key, cur.fencing_token, cur.owner_id
)
SELECT lock_key, fencing_token, owner_id FROM upd
"""

DELETE_SESSION_WAITERS_SQL = f"""
DELETE FROM lock_waiter WHERE session_id = %(session_id)s
RETURNING pg_notify('{GRANT_CHANNEL}', waiter_id::text)
"""


def delete_session_waiters(cursor: Any, *, session_id: uuid.UUID) -> None:
    """Withdraw the session's queue entries (first thing in close_session: a hand-off skips a
    row locked here, and one that locked it first commits before the session is closed). Each
    parked acquire is woken; it finds no grant and answers as for a closed session."""
    cursor.execute(DELETE_SESSION_WAITERS_SQL, {"session_id": session_id})


def delete_session(cursor: Any, *, session_id: uuid.UUID) -> list[tuple[str, int, str]]:
    """Delete the session row and free every grant attached to it. Call inside one
    transaction, after locking the session row, then hand each freed key over (hand_off).
    Returns the freed (key, token, owner) triples."""
    cursor.execute(DELETE_SESSION_SQL, {"session_id": session_id})
    cursor.execute(RELEASE_SESSION_GRANTS_SQL, {"session_id": session_id})
    return [(key, token, owner) for key, token, owner in cursor.fetchall()]


# --------------------------------------------------------------------------- grants

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
                  WHERE w.lock_key = g.lock_key AND {_ELIGIBLE})
RETURNING g.owner_id, g.fencing_token, g.acquired_at, g.expires_at,
          g.previous_token, g.previous_owner_id
"""


@dataclass(frozen=True)
class Acquired:
    grant: GrantRow
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
    grant = GrantRow(key, owner, session_id, token, acquired_at, expires_at)
    return Acquired(grant, previous_token, previous_owner)


# The holding session acquires again (e.g. its release timed out): the same row, a NEW token drawn
# under the row lock (the CTE locks first), so the old token is fenced everywhere (issue 16).
ROTATE_SQL = f"""
WITH cur AS (
    SELECT g.lock_key FROM lock_grant AS g
    WHERE g.lock_key = %(key)s AND g.session_id = %(session_id)s
      AND g.fencing_token = %(token)s AND {_LIVE}
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
) -> GrantRow | None:
    """Give the live grant (key, token) of session_id a new, higher token; None if it is not
    (any longer) that session's live grant."""
    cursor.execute(
        ROTATE_SQL, {"key": key, "session_id": session_id, "token": token, "ttl_ms": ttl_ms}
    )
    row = cursor.fetchone()
    if row is None:
        return None
    owner, new_token, acquired_at, expires_at = row
    return GrantRow(key, owner, session_id, new_token, acquired_at, expires_at)


KEY_STATE_SQL = f"""
SELECT g.lock_key IS NOT NULL,
       COALESCE({_LIVE}, false),
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
  AND {_LIVE}
  AND s.session_id = g.session_id AND s.expires_at > clock_timestamp()
RETURNING g.owner_id, g.acquired_at, g.expires_at
"""


def renew(
    cursor: Any, *, key: str, session_id: uuid.UUID, token: int, ttl_ms: int | None
) -> GrantRow | None:
    """Extend the live grant (key, token) held by session_id; the token never changes."""
    cursor.execute(
        RENEW_SQL, {"key": key, "token": token, "session_id": session_id, "ttl_ms": ttl_ms}
    )
    row = cursor.fetchone()
    if row is None:
        return None
    owner, acquired_at, expires_at = row
    return GrantRow(key, owner, session_id, token, acquired_at, expires_at)


# Compare-and-delete on (lock_key, fencing_token) and nothing else (C3 L6), and in the same
# statement the hand-off to the head of the queue (decision 23): a new token drawn under the
# key's row lock, the waiter's row told its grant, and a NOTIFY for that waiter only. With no
# waiter to hand to, the key is freed; the key's broadcast NOTIFY then goes out only if a waiter
# marked the row that this statement's snapshot does not show yet (_NOTIFY_IF_WAITED).
RELEASE_SQL = f"""
WITH cur AS (
    SELECT g.lock_key, g.owner_id, g.session_id FROM lock_grant AS g
    WHERE g.lock_key = %(key)s AND g.fencing_token = %(token)s AND {_LIVE}
    FOR UPDATE
), nxt AS ({_HEAD}), upd AS (
    UPDATE lock_grant AS g SET {_HANDED}
    FROM cur LEFT JOIN nxt ON true WHERE g.lock_key = cur.lock_key
    RETURNING cur.lock_key, cur.owner_id, cur.session_id, g.waiter_until, nxt.waiter_id,
              g.fencing_token, g.acquired_at, g.expires_at
), handed AS ({_RECORD_HANDOFF})
SELECT owner_id, session_id, waiter_id,
       CASE WHEN waiter_id IS NOT NULL THEN {_NOTIFY_GRANTED}
            WHEN waiter_until > clock_timestamp()
            THEN pg_notify('{NOTIFY_CHANNEL}', lock_key) END
FROM upd
"""


def release(cursor: Any, *, key: str, token: int) -> tuple[str, uuid.UUID] | None:
    """Free the live grant (key, token), handing it to the head of its queue if any (that
    waiter is notified on commit). (owner, session) of the released grant."""
    cursor.execute(RELEASE_SQL, {"key": key, "token": token})
    row = cursor.fetchone()
    return (row[0], row[1]) if row else None


# The hand-off on its own, for a key that is not live (freed by a revoke, a closed session or
# the reaper in the same transaction, or lapsed: then this statement ends the lapsed grant).
# Always one row: the waiter granted (or NULL), the lapsed grant it replaced, and in how many
# ms the key's holder (the new one, or the live one left alone) lapses.
HAND_OFF_SQL = f"""
WITH cur AS (
    SELECT g.lock_key, g.fencing_token, g.owner_id, g.session_id FROM lock_grant AS g
    WHERE g.lock_key = %(key)s AND NOT COALESCE({_LIVE}, false)
    FOR UPDATE
), nxt AS ({_HEAD}), upd AS (
    UPDATE lock_grant AS g SET {_HANDED}
    FROM cur JOIN nxt ON true WHERE g.lock_key = cur.lock_key
    RETURNING nxt.waiter_id, nxt.session_id, g.owner_id, g.fencing_token, g.acquired_at,
              g.expires_at, LEAST(g.expires_at, g.session_expires_at) AS until,
              cur.fencing_token AS lapsed_token, cur.owner_id AS lapsed_owner,
              cur.session_id AS lapsed_session
), handed AS ({_RECORD_HANDOFF})
SELECT upd.waiter_id, upd.lapsed_token, upd.lapsed_owner, upd.lapsed_session,
       CEIL(EXTRACT(EPOCH FROM (COALESCE(upd.until, (
           SELECT LEAST(g.expires_at, g.session_expires_at) FROM lock_grant AS g
           WHERE g.lock_key = %(key)s AND {_LIVE})) - clock_timestamp())) * 1000)::bigint,
       upd.session_id, upd.owner_id, upd.fencing_token, upd.acquired_at, upd.expires_at,
       CASE WHEN upd.waiter_id IS NOT NULL THEN {_NOTIFY_GRANTED} END
FROM (SELECT 1) AS one LEFT JOIN upd ON true
"""


@dataclass(frozen=True)
class HandOff:
    waiter_id: uuid.UUID | None  # the waiter granted, if any
    lapsed_token: int | None  # a lapsed grant this hand-off ended (lock_expired)
    lapsed_owner_id: str | None
    lapsed_session_id: uuid.UUID | None
    ms_until_free: int | None  # the key's holder after the statement lapses in this many ms
    grant: GrantRow | None  # what the waiter was granted


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
        else GrantRow(key, owner, session_id, token, acquired_at, expires_at)
    )
    return HandOff(
        waiter_id,
        lapsed_token,
        lapsed_owner,
        lapsed_session,
        None if ms is None else max(0, int(ms)),
        grant,
    )


WITHDRAW_SQL = "DELETE FROM lock_waiter WHERE waiter_id = %(waiter_id)s RETURNING 1"

OWN_GRANT_SQL = f"""
SELECT g.owner_id, g.fencing_token, g.acquired_at, g.expires_at FROM lock_grant AS g
WHERE g.lock_key = %(key)s AND g.session_id = %(session_id)s AND {_LIVE}
"""


def withdraw(
    cursor: Any, *, waiter_id: uuid.UUID, key: str, session_id: uuid.UUID
) -> GrantRow | None:
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
    return GrantRow(key, owner, session_id, token, acquired_at, expires_at)


LOCK_KEY_SQL = f"""
SELECT g.fencing_token, g.owner_id, g.session_id, COALESCE({_LIVE}, false)
FROM lock_grant AS g WHERE g.lock_key = %(key)s FOR UPDATE
"""

REVOKE_SQL = f"""
WITH upd AS (
    UPDATE lock_grant SET {_FREE_HOLDER}
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


# --------------------------------------------------------------------------- waiters

# Soft cap: two waiters racing for the last slot may both get in (the count is a snapshot).
# Admitted only for a live session (owned by owner_id when given) that does not hold the key
# itself; else nothing is written and the caller reads why (get_session, key_state). An admitted
# waiter also marks the key's row (waiter_until, see _NOTIFY_IF_WAITED) and reads back from the
# newest row version whether the key is still held and when its holder lapses: if a freeing
# statement held the row meanwhile, it may not have seen this entry, so the caller hands the
# key over itself (hand_off) instead of parking.
ADD_WAITER_SQL = f"""
WITH sess AS (
    SELECT session_id, owner_id FROM lock_session
    WHERE session_id = %(session_id)s AND expires_at > clock_timestamp()
      AND (%(owner_id)s::text IS NULL OR owner_id = %(owner_id)s::text)
), ins AS (
    INSERT INTO lock_waiter (waiter_id, lock_key, session_id, owner_id, ttl_ms, since,
                             expires_at)
    SELECT %(waiter_id)s, %(key)s::varchar, sess.session_id, sess.owner_id, %(ttl_ms)s,
           clock_timestamp(), clock_timestamp() + %(wait_ms)s * interval '1 millisecond'
    FROM sess
    WHERE (SELECT count(*) FROM lock_waiter
           WHERE lock_key = %(key)s::varchar AND expires_at > clock_timestamp()) < %(cap)s
      AND NOT EXISTS (SELECT 1 FROM lock_grant AS g
                      WHERE g.lock_key = %(key)s::varchar AND g.session_id = sess.session_id
                        AND {_LIVE})
    RETURNING expires_at
), mark AS (
    UPDATE lock_grant AS g
    SET waiter_until = GREATEST(g.waiter_until, (SELECT expires_at FROM ins))
    WHERE g.lock_key = %(key)s::varchar AND EXISTS (SELECT 1 FROM ins)
    RETURNING {_LIVE} AS held,
              CEIL(EXTRACT(EPOCH FROM (LEAST(g.expires_at, g.session_expires_at)
                                       - clock_timestamp())) * 1000)::bigint AS ms
)
SELECT EXISTS (SELECT 1 FROM ins), COALESCE((SELECT held FROM mark), false),
       (SELECT ms FROM mark)
"""


def add_waiter(
    cursor: Any,
    *,
    waiter_id: uuid.UUID,
    key: str,
    session_id: uuid.UUID,
    owner_id: str | None,
    wait_ms: int,
    cap: int,
    ttl_ms: int = 30_000,
) -> tuple[bool, bool, int | None]:
    """Queue a waiter if its session may and the key's cap allows: (admitted, the key still
    held, ms until its holder lapses). Not held means the key was freed while we marked it:
    hand it over (hand_off) rather than wait for a NOTIFY. `ttl_ms` is the grant's ttlMillis
    should the key be handed to this waiter."""
    cursor.execute(
        ADD_WAITER_SQL,
        {
            "waiter_id": waiter_id,
            "key": key,
            "session_id": session_id,
            "owner_id": owner_id,
            "wait_ms": wait_ms,
            "cap": cap,
            "ttl_ms": ttl_ms,
        },
    )
    admitted, held, ms = cursor.fetchone()
    return bool(admitted), bool(held), None if ms is None else max(0, int(ms))


def remove_waiter(cursor: Any, *, waiter_id: uuid.UUID) -> None:
    cursor.execute("DELETE FROM lock_waiter WHERE waiter_id = %(w)s", {"w": waiter_id})


# --------------------------------------------------------------------------- housekeeping

REAP_GRANTS_SQL = f"""
WITH dead AS (
    SELECT lock_key, fencing_token, owner_id, session_id FROM lock_grant
    WHERE fencing_token IS NOT NULL
      AND (expires_at <= clock_timestamp() OR session_expires_at <= clock_timestamp())
    ORDER BY expires_at LIMIT 500
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE lock_grant AS g SET {_FREE_HOLDER}
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
       (SELECT count(*) FROM lock_grant AS g WHERE {_LIVE})
"""


def live_counts(cursor: Any) -> tuple[int, int]:
    cursor.execute(LIVE_COUNTS_SQL)
    return tuple(cursor.fetchone())


def in_recovery(cursor: Any) -> bool:
    cursor.execute("SELECT pg_is_in_recovery()")
    return bool(cursor.fetchone()[0])
