"""The fragments every statement shares (liveness, queue head, hand-off, NOTIFY), the rows read.

A grant read back is `lockserver.backends.base.GrantRecord`, the record the backend answers with.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

NOTIFY_CHANNEL = "dlock_lock_free"
# A hand-off NOTIFYs only the waiter it granted, on its own channel (payload: its waiter id and
# its grant, grant_payload).
GRANT_CHANNEL = "dlock_lock_granted"

LIVE = (
    "g.fencing_token IS NOT NULL AND g.expires_at > clock_timestamp()"
    " AND g.session_expires_at > clock_timestamp()"
)
FREE_HOLDER = (
    "session_id = NULL, owner_id = NULL, fencing_token = NULL, ttl_ms = NULL,"
    " acquired_at = NULL, expires_at = NULL, session_expires_at = NULL"
)
# Every statement that frees a key NOTIFYs it only while a waiter may be parked on it: the
# waiter sets lock_grant.waiter_until by an UPDATE of the key's row as it parks (ADD_WAITER_SQL),
# and the freeing statement reads the column from the row version it updates - the newest one,
# after any row-lock wait (READ COMMITTED re-checks an updated row), never its older snapshot.
# Either the waiter's mark commits first (the freeing statement sees it and notifies) or the
# freeing statement holds the row first (the mark waits for its commit and sees the key free:
# the waiter tries again at once). A payout's uncontended release sends no NOTIFY (CHANGELOG
# row 57).
NOTIFY_IF_WAITED = (
    f"CASE WHEN waiter_until > clock_timestamp() THEN pg_notify('{NOTIFY_CHANNEL}', lock_key) END"
)

# Grant order (ARCHITECTURE decision 23). Parked waiters are lock_waiter rows; `position` (a
# sequence) is their arrival order. A waiter may be granted while its wait and its session are
# live; the others are skipped, never granted. A waiter leaves the queue when it is granted.
ELIGIBLE = (
    "w.expires_at > clock_timestamp()"
    " AND s.session_id = w.session_id AND s.expires_at > clock_timestamp()"
)
# The head of a key's queue (`cur` is the CTE that holds the key's row lock). SKIP LOCKED: a
# waiter row locked now is being withdrawn (its wait ran out) or its session closed (close_session
# deletes its waiter rows first): the next one is the head. LockRows runs below LIMIT, so a row
# skipped or gone makes the scan go on to the next waiter.
HEAD = f"""
    SELECT w.waiter_id, w.session_id, w.owner_id, w.ttl_ms,
           s.expires_at AS session_expires_at
    FROM lock_waiter AS w, lock_session AS s
    WHERE w.lock_key = %(key)s::varchar AND EXISTS (SELECT 1 FROM cur) AND {ELIGIBLE}
    ORDER BY w.position LIMIT 1
    FOR UPDATE OF w SKIP LOCKED
"""
# Set on the key's row by a hand-off to `nxt` (when there is no `nxt`: the key is freed).
HANDED = (
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
RECORD_HANDOFF = """
    DELETE FROM lock_waiter AS w USING upd WHERE w.waiter_id = upd.waiter_id
    RETURNING w.waiter_id
"""
EPOCH_US = "(EXTRACT(EPOCH FROM {}) * 1000000)::bigint"
# payload: "<waiter id> <token> <acquiredAt µs> <expiresAt µs>"; a bare "<waiter id>" means the
# entry was withdrawn (its session closed). The freeing statement also returns the payload, so a
# waiter parked in the same process is woken at once after the commit (KeyListener.hand_over).
GRANT_PAYLOAD = (
    "concat_ws(' ', waiter_id, fencing_token,"
    f" {EPOCH_US.format('acquired_at')}, {EPOCH_US.format('expires_at')})"
)
NOTIFY_GRANTED = f"pg_notify('{GRANT_CHANNEL}', {GRANT_PAYLOAD})"


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
